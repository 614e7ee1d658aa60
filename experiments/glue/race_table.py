"""The paper's RACE result (Table 3: middle / high / all accuracy) for one init source and several seeds.

    python -m experiments.glue.race_table --data race.tar.gz --init runs/pretrain --seeds 0,1,2 --out runs/race
    python -m experiments.glue.race_table --data race.tar.gz --quick --init none --out /tmp/race-quick   # smoke test
`--set KEY=VALUE` (repeatable) changes any FinetuneConfig field of every run (but task, seed and the derived
optim.total_steps, optim.warmup_steps); runs go through
experiments/harness.py. RACE has 88k training questions of
4 x 512 tokens: a full run wants an accelerator; --quick uses a tiny model and 64 questions.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("race_table.py: error: run it from the repository root as: "
          "python -m experiments.glue.race_table ...", file=sys.stderr)
    sys.exit(2)

import argparse
import dataclasses
from pathlib import Path

from experiments import harness
from experiments.glue.common import (ABLATIONS, ablation, errors_of, mean_std, metric_values, missing_init, missing_path,
                                     plot_table, table_config, write_table)
from gpt1_jax.errors import ConfigError

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

PAPER = [("accuracy_middle", "RACE-m", 62.9), ("accuracy_high", "RACE-h", 57.4), ("accuracy", "RACE", 59.0)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--init", required=True, help="pre-training workdir, HF/original checkpoint folder, or none")
    p.add_argument("--seeds", type=harness.seed_list, default=[0, 1, 2], help="comma-separated (default: 0,1,2)")
    p.add_argument("--ablations", type=harness.name_list("ablation"), default="full",
                   help=f"comma-separated of {', '.join(ABLATIONS)}")
    p.add_argument("--data", required=True, help="race.tar.gz or its unpacked folder")
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="tiny model, 64 train / 32 dev questions, 1 epoch")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a FinetuneConfig field of every run")
    harness.cpu_devices_flag(p)
    args = p.parse_args(argv)
    if bad := [a for a in args.ablations if a not in ABLATIONS]:
        p.error(f"unknown ablation(s) {bad}; known: {', '.join(ABLATIONS)}")
    if missing := missing_path("--data", args.data) or missing_init(args.init):
        p.exit(2, f"{p.prog}: error: {missing}\n")
    try:
        owned = {"task": "race_table (RACE's table)", "seed": "--seeds"}
        args.config = dataclasses.replace(table_config(args.quick, args.set, owned), task="race")
    except ConfigError as e:
        p.exit(2, f"{p.prog}: error: --set: {e}\n")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness.split_cpu(args.cpu_devices, args.config)
    with harness.one_sweep(Path(args.out), PROG, init=args.init):
        return run_table(args)


def run_table(args: argparse.Namespace) -> int:
    """The sweep, then OUT/table.md -> exit status (1 if a run failed)."""
    ablations, out = args.ablations, Path(args.out)
    keys = [(a, s) for a in ablations for s in args.seeds]
    runs = []
    for a, s in keys:
        config, init = ablation(a, dataclasses.replace(args.config, seed=s), args.init)
        runs.append(harness.Run(config, out / a / f"seed{s}", init, args.data))
    dones = harness.sweep(runs, harness.Records(out), harness.finetune_record)
    if dones is None:  # a run stopped at a checkpoint (SIGTERM)
        return 130

    lines = [f"init: `{args.init}`; seeds: {args.seeds}" + ("; **quick mode**" if args.quick else ""), "",
             "Accuracy x100 on RACE's dev set (paper: test set).", "",
             "| | paper | " + " | ".join(ablations) + " |", "|---|---|" + "---|" * len(ablations)]
    plotted = []
    for metric, name, paper in PAPER:
        cells, scores = [], {}
        for a in ablations:
            group = [d for (ka, _), d in zip(keys, dones) if ka == a]
            values = scores[a] = metric_values(group, metric)
            cells.append(mean_std(values) if values else f"failed: {errors_of(group)}" if errors_of(group) else "–")
        lines.append(f"| {name} | {paper:.1f} | " + " | ".join(cells) + " |")
        plotted.append((name, scores, paper))
    print(write_table(out / "table.md", "GPT-1 fine-tuning on RACE", lines + ["", "Plot: `table.png`."]))
    plot_table(out / "table.png", "GPT-1 fine-tuning on RACE (dev)", plotted, "the paper's GPT-1 (RACE test set)")
    return 0 if all(d.record for d in dones) else 1


if __name__ == "__main__":
    harness.leave(harness.main(main, PROG, trains=True))
