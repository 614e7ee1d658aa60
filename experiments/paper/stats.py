"""The statistics Table 5 states its claims with: Student-t intervals over seeds, the paired difference of two
arms (seeds pair across arms: the same seed draws the same training subset and order), the 5-task average's
paired interval, and each task's constant-prediction baseline.

Why a t-interval and not a bootstrap: at 5 seeds a bootstrap of the mean is too narrow (it resamples 5 values
and never sees the tails), while the t-interval is exact for normal noise and widens with few seeds."""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np

from gpt1_jax.data.glue import METRICS


@dataclasses.dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    @property
    def above_zero(self) -> bool:
        return self.n >= 2 and self.low > 0

    def above(self, level: float) -> bool:
        """Whether the whole interval clears `level` (a single value clears it when it is higher)."""
        return self.low > level if self.n >= 2 else self.mean > level

    def text(self, digits: int = 1) -> str:
        if self.n < 2:
            return f"{self.mean:.{digits}f}" if self.n else "–"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def t_interval(values: list[float], level: float = 0.95) -> Interval:
    """The mean of `values` with its two-sided Student-t interval (n - 1 degrees of freedom); one value: no
    width (low = high = the value), none: NaN."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = statistics.fmean(values)
    if n == 1:
        return Interval(mean, mean, mean, 1)
    from scipy.stats import t  # here: scipy takes a second to import, and only the tables need it

    half = float(t.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def paired(a: dict[int, float], b: dict[int, float], level: float = 0.95) -> Interval:
    """The paired difference a - b over the seeds both have (seed -> score), with its t-interval."""
    seeds = sorted(set(a) & set(b))
    return t_interval([a[s] - b[s] for s in seeds], level)


def paired_average(a: dict[str, dict[int, float]], b: dict[str, dict[int, float]], level: float = 0.95) -> Interval:
    """The paired difference of the task average (task -> seed -> score): per seed, the mean over tasks of
    a - b, over the seeds every task has in both arms."""
    tasks = sorted(set(a) & set(b))
    if not tasks:
        return t_interval([])
    seeds = sorted(set.intersection(*(set(a[t]) & set(b[t]) for t in tasks)))
    return t_interval([statistics.fmean(a[t][s] - b[t][s] for t in tasks) for s in seeds], level)


def constant_baseline(metric: str, labels) -> float:
    """The best score x100 a constant prediction gets on these labels under `metric` (gpt1_jax/data/glue.py):
    the majority rate for accuracy, F1 of predicting the positive class everywhere, 0 for Matthews'
    correlation and for Pearson/Spearman (a constant has no correlation; Table 5 scores its NaN as 0)."""
    labels = np.asarray(labels)
    if metric in ("pearson", "spearman"):
        return 0.0
    scores = [METRICS[metric](labels, np.full(len(labels), c, labels.dtype)) for c in np.unique(labels)]
    return 100.0 * max(0.0 if math.isnan(s) else s for s in scores)
