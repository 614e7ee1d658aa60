"""Wall-clock of consecutive fine-tuning runs in one process that differ only in lr or seed, as Table 5's grid
and seeds make them: the first compiles the task's programs, the others reuse them (the lr and the dropout
seed are inputs of the compiled step, gpt1_jax/step.py `Hyper`). From the repository root:

    python -m experiments.bench.shared_programs --data-dir ../shared/data/glue --out /tmp/shared-programs

Prints one JSON line per run, then a summary line with the CPU flags. Run it with the persistent compilation
cache off (GPT1_JAX_COMPILE_CACHE=off) so the first run compiles for real.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("shared_programs.py: error: run it from the repository root as: "
          "python -m experiments.bench.shared_programs ...", file=sys.stderr)
    sys.exit(2)

import json
import time
from pathlib import Path

from experiments import harness
from experiments.harness import Run
from experiments.paper.settings import FULL_SETS, PAPER_DIR, TASKS
from gpt1_jax import flops
from gpt1_jax.arguments import at_least

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

RUNS = ((1e-4, 0), (3e-4, 0), (1e-4, 1))  # another lr, then another seed (its batch order brings new padded shapes)


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True, help="GLUE's TSV distribution (<dir>/<Task>/{train,dev}.tsv)")
    p.add_argument("--out", required=True, help="a fresh folder for the runs' workdirs")
    p.add_argument("--task", default="rte", choices=TASKS)
    p.add_argument("--release", default=str(PAPER_DIR / "release"), help="the model fine-tuned")
    p.add_argument("--examples", type=at_least(2), default=256, help="training examples per run (default: 256)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        p.exit(2, f"{p.prog}: error: --out {out} is not empty: finished runs there would be found, not timed\n")
    rows = []
    for lr, seed in RUNS:
        config = FULL_SETS.finetune_config(args.task, lr, seed, max_train_examples=args.examples, epochs=1,
                                           max_eval_examples=args.examples // 2)
        run = Run(config, out / f"lr{lr:g}-seed{seed}", args.release, args.data_dir)
        t0 = time.perf_counter()
        outcome = run.start(progress=False)
        rows.append({"lr": lr, "seed": seed, "wall_s": round(time.perf_counter() - t0, 2), "finished": outcome.finished})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"task": args.task, "examples": args.examples, "runs": rows, "cpu_flags": flops.cpu_flags()}))
    return 0


if __name__ == "__main__":
    harness.leave(harness.main(main, PROG))
