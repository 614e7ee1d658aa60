"""One Table 5 run again, outside the pipeline, to see whether something moves its score: another machine or
CPU kind, or another compute dtype. It trains the committed 4-epoch pipeline's run (arm, task, lr, seed: the
same config, on 2 CPU devices as the pipeline runs) into a workdir of its own under --out, keeps no record,
and prints one JSON line a seed with its dev and held-out scores beside the committed record's.

    python -m experiments.paper.check_run --arm full --task cola --lr 1e-3 --seeds 0 --out runs/check
    python -m experiments.paper.check_run --arm full --task cola --lr 1e-3 --seeds 0,1,2,3,4 --dtype bfloat16 \\
        --out runs/check

experiments/paper/README.md ("More seeds") has what these found.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("check_run.py: error: run it from the repository root as: "
          "python -m experiments.paper.check_run ...", file=sys.stderr)
    sys.exit(2)

import dataclasses
import json
import time
from pathlib import Path

from experiments import harness
from experiments.paper.settings import ARMS, RECIPE_4EP, TASKS, Paper
from gpt1_jax.cli import simulate_devices
from gpt1_jax.config import FinetuneConfig

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

DEVICES = 2  # the pipeline's --cpu-devices: a run's numbers depend on the devices it is split over


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--arm", choices=ARMS, required=True)
    p.add_argument("--task", choices=TASKS, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--seeds", type=harness.seed_list, default=[0], help="comma-separated (default: 0)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype (default: float32, "
                   "the table's)")
    p.add_argument("--data-dir", default="../shared/data/glue", help="GLUE's TSV files (default: ../shared/data/glue)")
    p.add_argument("--out", required=True, help="the workdirs go under OUT/<arm>_<task>_<lr>_<dtype>_s<seed>")
    args = p.parse_args(argv)
    simulate_devices(DEVICES)  # before jax starts its backend
    from experiments.paper.table5 import run_of  # jax-importing: after the devices are set

    paper = Paper(out=Path(args.out), budget_name="full_sets", pretrain_config=str(RECIPE_4EP),
                  tasks=TASKS, layer_tasks=(), data_dir=args.data_dir, train=False)
    model = dataclasses.replace(FinetuneConfig().model, dtype=args.dtype)
    for seed in args.seeds:
        kept = paper.records.kept_path(run_of(paper, args.arm, args.task, args.lr, seed).workdir)
        committed = json.loads(kept.read_text()) if kept.is_file() else None
        run = run_of(paper, args.arm, args.task, args.lr, seed,
                     Path(args.out) / f"{args.arm}_{args.task}_{args.lr:g}_{args.dtype}_s{seed}", model=model)
        t0 = time.perf_counter()
        record = harness.finetune_record(run, run.start(progress=False), time.perf_counter() - t0)
        if record is None:
            print(f"{PROG}: {run.workdir} did not finish", file=sys.stderr)
            return 1
        metric = record["main_metric"]
        print(json.dumps({"arm": args.arm, "task": args.task, "lr": args.lr, "seed": seed, "dtype": args.dtype,
                          "metric": metric, "dev": record["metrics"][metric], "holdout": record["holdout"][metric],
                          "committed_dev": committed and committed["metrics"][metric],
                          "train_seconds": record.get("train_seconds")}), flush=True)
    return 0


if __name__ == "__main__":
    harness.leave(harness.main(main, PROG, trains=True))
