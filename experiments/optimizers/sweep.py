"""The optimizer study's sweep: the breadth-first loop that grows each grid on the lr ladder
(experiments/lr_grid.py) until its best lr is bracketed, then repeats it with the other seeds. run_study.py
makes the runs (through experiments/harness.py, which keeps their records); tables.py reads them."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from experiments import lr_grid


# ---- names -------------------------------------------------------------------------------------------

def run_name(lr: float, seed: int) -> str:
    return f"lr{lr:.3g}_s{seed}"


# ---- numbers ------------------------------------------------------------------------------------------

def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def median(xs):
    xs = [x for x in xs if finite(x)]
    return statistics.median(xs) if xs else None


# ---- the study loop -----------------------------------------------------------------------------------

def score(rec: dict) -> float | None:
    """Lower is better: final val loss (pre-training), minus the best dev metric (fine-tuning)."""
    if rec["diverged"]:
        return None
    if rec["study"] == "pretrain":
        return rec["final_val_loss"]
    return -rec["dev_best"] if finite(rec.get("dev_best")) else None


def best_lr(runs: list[dict], name: str, seed: int) -> float | None:
    """The lr of `name`'s best run at `seed`; a tie goes to the larger lr, as Table 5's (it went to whichever run
    came first: the centre lr in a live study, the smallest in one rebuilt from its records)."""
    cands = [r for r in runs if r["optimizer"] == name and r["seed"] == seed and score(r) is not None]
    return min(cands, key=lambda r: (score(r), -r["lr"]))["lr"] if cands else None


def bracket_gap(runs: list[dict], name: str, seed: int) -> float | None:
    """The next lr to try for `name` at `seed` (experiments/lr_grid.py: a diverged run counts as worse); None
    when its best lr is bracketed already."""
    return lr_grid.bracket_gap({r["lr"]: score(r) for r in runs if r["optimizer"] == name and r["seed"] == seed})


def extensions(runs: list[dict], name: str, seed: int, grid: list[float]) -> int:
    """How many lrs beyond its grid `name` has run at `seed`."""
    return len({r["lr"] for r in runs if r["optimizer"] == name and r["seed"] == seed} - set(grid))


PLOTS_EVERY_S = 600  # a long study redraws its plots this often; its tables follow every run


def study_loop(study: Path, names: list[str], seeds: list[int], grids: dict[str, list[float]], run_one,
               max_extensions: int, write, finished: list[dict] = ()) -> tuple[list[dict], bool]:
    """Runs the study (`study_order`) -> (its runs, whether it is complete). `run_one(study, name, lr, seed)`
    gives a run's record, or None when the run stopped before its end (it resumes next time): the study then
    stops too. `write(runs, plots)` follows every run that adds or changes a record (a finished run revisited
    by a rerun writes nothing), with `plots` when PLOTS_EVERY_S have passed since they were last drawn, and
    once more, plots included, when the study completes. `finished` (harness.Records.finished) are in every
    table written from the start: a resumed study's tables never drop the runs it has not revisited."""
    study.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = [r for r in finished if r["optimizer"] in names]
    plotted = time.monotonic()
    for name, lr, seed in study_order(runs, names, seeds, grids, max_extensions):
        rec = run_one(study, name, lr, seed)
        if rec is None:
            return runs, False
        if rec in runs:
            continue
        runs[:] = [r for r in runs if (r["optimizer"], r["lr"], r["seed"]) != (name, lr, seed)] + [rec]
        plots = time.monotonic() - plotted >= PLOTS_EVERY_S
        write(runs, plots)
        plotted = time.monotonic() if plots else plotted
    write(runs, True)
    return runs, True


def study_order(runs: list[dict], names: list[str], seeds: list[int], grids: dict[str, list[float]],
                max_extensions: int):
    """(optimizer, lr, seed) in the order they run; reads `runs` as it grows, since the extensions and the
    repeats depend on the scores. Breadth-first, so that a study cut short still has a row per optimizer:
    every optimizer at its centre lr, the rest of its grid, rounds of one more lr for each optimizer whose
    best is not yet bracketed (at most `max_extensions` each), then the other seeds at each best lr."""
    for n in names:
        yield n, grids[n][len(grids[n]) // 2], seeds[0]
    for n in names:
        for lr in grids[n]:
            yield n, lr, seeds[0]
    for _ in range(max_extensions):  # at most max_extensions in all: those of earlier invocations count
        gaps = {n: lr for n in names if extensions(runs, n, seeds[0], grids[n]) < max_extensions
                and (lr := bracket_gap(runs, n, seeds[0])) is not None}
        if not gaps:
            break
        for n, lr in gaps.items():
            yield n, lr, seeds[0]
    for n in names:
        b = best_lr(runs, n, seeds[0])
        if b is not None:
            for s in seeds[1:]:
                yield n, b, s
