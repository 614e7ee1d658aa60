"""The paper's RACE result (Table 3: middle / high / all accuracy) for one init source and several seeds.

    python -m experiments.glue.race_table --data race.tar.gz --init runs/pretrain --seeds 0 1 2 --out runs/race
    python -m experiments.glue.race_table --data race.tar.gz --quick --init none --out /tmp/race-quick   # smoke test
Extra arguments after `--` go to every `gpt1-jax finetune` call. RACE has 88k training questions of
4 x 512 tokens: a full run wants an accelerator; --quick uses a tiny model and 64 questions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.glue.common import split_passthrough, ABLATIONS, Run, errors_of, execute, mean_std, metric_values, missing_path, write_table

PAPER = [("accuracy_middle", "RACE-m", 62.9), ("accuracy_high", "RACE-h", 57.4), ("accuracy", "RACE", 59.0)]


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_passthrough(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--init", required=True, help="pre-training workdir, HF/original checkpoint folder, or none")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ablations", default="full", help=f"comma-separated of {', '.join(ABLATIONS)}")
    p.add_argument("--data", required=True, help="race.tar.gz or its unpacked folder")
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="tiny model, 64 train / 32 dev questions, 1 epoch")
    args = p.parse_args(argv)
    missing = missing_path("--data", args.data)
    if missing:
        p.exit(2, f"{p.prog}: error: {missing}\n")

    ablations = args.ablations.split(",")
    out = Path(args.out)
    runs = [Run(a, "race", s, out / a / f"seed{s}") for a in ablations for s in args.seeds]
    execute(runs, args.init, args.data, args.quick, extra)

    lines = [f"init: `{args.init}`; seeds: {args.seeds}" + ("; **quick mode**" if args.quick else ""), "",
             "Accuracy x100 on RACE's dev set (paper: test set).", "",
             "| | paper | " + " | ".join(ablations) + " |", "|---|---|" + "---|" * len(ablations)]
    for metric, name, paper in PAPER:
        cells = []
        for a in ablations:
            group = [r for r in runs if r.ablation == a]
            values = metric_values(group, metric)
            cells.append(mean_std(values) if values else f"failed: {errors_of(group)}" if errors_of(group) else "–")
        lines.append(f"| {name} | {paper:.1f} | " + " | ".join(cells) + " |")
    print(write_table(out / "table.md", "GPT-1 fine-tuning on RACE", lines))
    return 0 if all(r.results for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
