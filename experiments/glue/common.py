"""Shared by the paper-table scripts: run `gpt1-jax finetune` per (ablation, task, seed) in a subprocess,
collect results.json files, and format mean ± std tables beside the paper's numbers.

Runs are resumable: a run whose results.json exists is not repeated. Each run is its own process, so
one task's failure (e.g. a split that is not available) is recorded and the others go on.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Table 5 (docs/gpt1.md): which finetune flags make each ablation.
ABLATIONS = {
    "full": [],
    "no_pretrain": ["no-pretrain"],  # marker: --init scratch:SOURCE (or none)
    "no_aux_lm": ["--lm-coef", "0"],
}
QUICK_FLAGS = ["--config", "tiny", "--epochs", "1", "--batch-size", "8", "--max-train-examples", "64",
               "--max-eval-examples", "32"]


@dataclasses.dataclass
class Run:
    ablation: str
    task: str
    seed: int
    workdir: Path
    flags: list[str] = dataclasses.field(default_factory=list)  # this run's own finetune flags (lr, layers, ...)
    results: dict | None = None
    error: str | None = None
    seconds: float = 0.0  # wall-clock of the process that made `results` here (0: done before)


def split_passthrough(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """(the script's own arguments, those after `--`, which go to every `gpt1-jax finetune` call)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def init_for(ablation: str, init: str) -> str:
    if ablation != "no_pretrain" or init == "none":
        return init
    return f"scratch:{init}"  # the same architecture and vocabulary, random weights


def missing_path(flag: str, path: str | None) -> str | None:
    """The one-line error for a data path that does not exist (None: the flag was not given, or it exists)."""
    if path is None or Path(path).exists():
        return None
    return f"{flag} {path}: no such file or directory"


def finetune_argv(run: Run, init: str, data_dir: str | None, quick: bool, extra: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "gpt1_jax.cli", "finetune", "--task", run.task, "--init", init_for(run.ablation, init),
            "--workdir", str(run.workdir), "--seed", str(run.seed), "--no-progress"]
    if data_dir is not None:  # else gpt1-jax finetune downloads GLUE with tensorflow-datasets
        argv += ["--data-dir", data_dir]
    argv += [a for a in ABLATIONS[run.ablation] if a != "no-pretrain"]
    if quick:
        argv += QUICK_FLAGS
    return argv + run.flags + extra


def execute(runs: list[Run], init: str, data_dir: str | None, quick: bool, extra: list[str],
            on_result: Callable[[Run], None] | None = None) -> None:
    """Runs each run not done before, one `gpt1-jax finetune` process at a time. `on_result(run)` is called as
    soon as a run has its results (done before or now), so a sweep stopped mid-way has kept what finished."""
    for i, run in enumerate(runs, 1):
        out = run.workdir / "results.json"
        if out.is_file():
            run.results = json.loads(out.read_text())
            print(f"[{i}/{len(runs)}] {run.workdir}: done before", file=sys.stderr)
            if on_result:
                on_result(run)
            continue
        argv = finetune_argv(run, init, data_dir, quick, extra)
        print(f"[{i}/{len(runs)}] {' '.join(argv[2:])}", file=sys.stderr)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        run.seconds = time.perf_counter() - t0
        if proc.returncode == 0 and out.is_file():
            run.results = json.loads(out.read_text())
            if on_result:
                on_result(run)
        else:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            run.error = lines[-1] if lines else f"exit status {proc.returncode}"
            print(f"    failed: {run.error}", file=sys.stderr)


def mean_std(values: list[float], scale: float = 100.0) -> str:
    if not values:
        return "–"
    values = [v * scale for v in values]
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def metric_values(runs: list[Run], metric: str) -> list[float]:
    return [r.results["metrics"][metric] for r in runs if r.results and metric in r.results["metrics"]]


def errors_of(runs: list[Run]) -> str:
    errs = sorted({r.error for r in runs if r.error})
    return "; ".join(errs)


def write_table(path: Path, title: str, lines: list[str]) -> str:
    text = f"# {title}\n\n" + "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text
