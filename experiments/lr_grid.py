"""The learning-rate ladder the sweeps grow their grids on, and the rule that says when a grid is done: its best
lr has a worse neighbour on both sides. The optimizer study (experiments/optimizers/sweep.py) and Table 5
(experiments/paper/table5.py) both extend their grids by it."""

from __future__ import annotations

import math


def _ladder(j: int) -> float:
    """The 1-3-10 log ladder: j=0 -> 1, 1 -> 3, 2 -> 10, -1 -> 0.3, ..."""
    return float(f"{10.0 ** (j // 2) * (3 if j % 2 else 1):.3g}")


def _rung(lr: float) -> int:
    return min(range(-40, 40), key=lambda j: abs(math.log(_ladder(j) / lr)))


def lr_grid(centre: float, points: int = 3) -> list[float]:
    """`points` lrs of the 1-3-10 ladder (a log grid, ~half a decade apart) centred on the rung nearest
    `centre`: 3e-3 -> [1e-3, 3e-3, 1e-2]."""
    lo = _rung(centre) - (points - 1) // 2
    return [_ladder(j) for j in range(lo, lo + points)]


def next_rung(lr: float, up: bool) -> float:
    j = _rung(lr)
    return _ladder(j + 1 if up else j - 1)


def bracket_gap(losses: dict[float, float | None]) -> float | None:
    """lr -> loss (lower is better; None: the run diverged or failed) -> the next lr to try so that the best
    one has a worse neighbour on both sides (a failed run counts as worse); None when it is bracketed already,
    or nothing was tried. Every lr failed: go one rung below the lowest. A neighbour that ties the best is not
    worse: the lowest and the highest lr scoring the best need a worse lr beyond them (a fine-tuning metric
    counts examples, and rates too small to move the model all score the same)."""
    tried = sorted(losses)
    scored = [lr for lr in tried if losses[lr] is not None]
    if not tried:
        return None
    if not scored:
        return next_rung(tried[0], up=False)
    best = min(losses[lr] for lr in scored)
    tied = [lr for lr in scored if losses[lr] == best]
    if tied[0] == tried[0]:
        return next_rung(tried[0], up=False)
    if tied[-1] == tried[-1]:
        return next_rung(tried[-1], up=True)
    return None
