"""Every committed table, README and plot that code writes, written again into place from the committed
records (training nothing), then which of them differ from git. From the repository root:

    python -m experiments.regenerate

It runs `report.rebuild_results` for both committed paper pipelines (experiments/paper/results/ and
results_4ep/), `run_study --tables` (the optimizer study, pre-training then fine-tuning) and `plan_table --table`
(experiments/scale/). Not rebuilt, their inputs not
being committed: experiments/paper/release/README.md (the pre-training run's data_info.json and metrics),
paper/results/pretrain_loss.png (that run's own plot) and scale/results/data_bench_1b.json (a measurement);
experiments/bench/ and experiments/glue/ commit no generated results.

Every one of them is a function of the records alone (an optimizer study's results.json lists its runs in
workdir order and the CPU kinds they ran on), so on a clean checkout the answer is "byte-identical" (exit
status 0; 1 when a file differs).
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("regenerate.py: error: run it from the repository root as: "
          "python -m experiments.regenerate ...", file=sys.stderr)
    sys.exit(2)

import contextlib
import io
import subprocess
import tempfile
from pathlib import Path

from experiments import harness
from experiments.optimizers import run_study
from experiments.paper.report import rebuild_results
from experiments.paper.settings import COMMITTED, PAPER_DIR
from experiments.scale.plan_table import write_table

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZERS = ROOT / "experiments" / "optimizers" / "results"
PAPER_RESULTS = [f"experiments/paper/{results}" for _, results in COMMITTED.values()]
OUTPUTS = [*PAPER_RESULTS, "experiments/optimizers/results", "experiments/scale/results", "experiments/scale/README.md"]
CORPUS = "../shared/data/corpus/english_mixed.txt.gz"  # the pre-training study's, as its table names it


def regenerate() -> None:
    with tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stderr(io.StringIO()):  # "done before" x 100
        for recipe, budget in COMMITTED:  # each committed paper pipeline: results/, results_4ep/, results_long/
            # a scratch folder each: two pipelines of one budget (4ep, long) lay out the same run workdirs
            rebuild_results(Path(scratch) / f"paper_{Path(recipe).stem}_{budget}", PAPER_DIR / recipe, budget)
        for study in ("pretrain", "finetune"):  # finetune's optimizers: the best of <out>/pretrain/results.json
            run_study.main([study, "--tables", "--out", f"{scratch}/optimizers", "--corpus", CORPUS,
                            "--records", str(OPTIMIZERS / "records"), "--results", str(OPTIMIZERS)])
    write_table()


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> int:
    # No options; a parser all the same, so that `--help` (or a typo) explains instead of rewriting every file.
    harness.parser(prog=PROG, description=__doc__.split("\n\n")[0]).parse_args(argv)
    regenerate()
    new_files = git("ls-files", "--others", "--exclude-standard", "--", *OUTPUTS)
    changed = git("diff", "--stat", "--", *OUTPUTS) + new_files
    print(changed or "every regenerated file is byte-identical to git's")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
