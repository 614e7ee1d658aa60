"""Every committed table, README and plot that code writes, written again into place from the committed
records (training nothing), then which of them differ from git. From the repository root:

    python -m experiments.regenerate

It runs `report.rebuild_results` (experiments/paper/results/), `run_study --tables` (the optimizer study,
pre-training then fine-tuning) and `plan_table --table` (experiments/scale/). Not rebuilt, their inputs not
being committed: experiments/paper/release/README.md (the pre-training run's data_info.json and metrics),
paper/results/pretrain_loss.png (that run's own plot) and scale/results/data_bench_1b.json (a measurement);
experiments/bench/ and experiments/glue/ commit no generated results.

An optimizer study's results.json also names the CPU flags of the machine that wrote it and lists the runs in
the order the study ran them, which no record keeps (--tables lists them as the records sort); where only
those differ from HEAD it says so, and the file can be restored with `git checkout -- FILE`.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import tempfile
from pathlib import Path

from experiments.optimizers import run_study
from experiments.paper.report import rebuild_results
from experiments.scale.plan_table import write_table

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZERS = ROOT / "experiments" / "optimizers" / "results"
OUTPUTS = ["experiments/paper/results", "experiments/optimizers/results", "experiments/scale/results",
           "experiments/scale/README.md"]
CORPUS = "../shared/data/corpus/english_mixed.txt.gz"  # the pre-training study's, as its table names it


def regenerate() -> None:
    with tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stderr(io.StringIO()):  # "done before" x 100
        rebuild_results(Path(scratch) / "paper")
        for study in ("pretrain", "finetune"):  # finetune's optimizers: the best of <out>/pretrain/results.json
            run_study.main([study, "--tables", "--out", f"{scratch}/optimizers", "--corpus", CORPUS,
                            "--records", str(OPTIMIZERS / "records"), "--results", str(OPTIMIZERS)])
    write_table()


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def same_runs_as_head(path: str) -> bool:
    """Whether an optimizer study's results.json holds HEAD's summary and runs (writer's CPU flags and run order aside)."""
    def comparable(results: dict) -> dict:
        return dict(results, cpu_flags=None, runs=sorted(results["runs"], key=json.dumps))

    return comparable(json.loads((ROOT / path).read_text())) == comparable(json.loads(git("show", f"HEAD:{path}")))


def main() -> int:
    regenerate()
    new_files = git("ls-files", "--others", "--exclude-standard", "--", *OUTPUTS)
    print(git("diff", "--stat", "--", *OUTPUTS) + new_files or "every regenerated file is byte-identical to git's")
    for path in git("diff", "--name-only", "--", str(OPTIMIZERS.relative_to(ROOT))).split():
        if path.endswith("results.json") and same_runs_as_head(path):
            print(f"{path}: HEAD's results; only the writer's CPU flags or the runs' order differ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
