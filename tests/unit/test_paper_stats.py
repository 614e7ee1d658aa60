"""experiments/paper/stats.py against answers worked by hand: Student-t intervals, paired differences over
seeds, the task average's paired interval, and each metric's constant-prediction baseline."""

import math

import numpy as np
import pytest

from experiments.paper import stats


def test_t_interval_of_five_values():
    # mean 3, sd sqrt(2.5), se sqrt(0.5); t(0.975, 4) = 2.7764451
    ci = stats.t_interval([1, 2, 3, 4, 5])
    half = 2.7764451 * math.sqrt(0.5)
    assert (ci.mean, ci.n) == (3.0, 5)
    assert ci.low == pytest.approx(3 - half, abs=1e-6) and ci.high == pytest.approx(3 + half, abs=1e-6)
    assert ci.above_zero and ci.above(1.0) and not ci.above(1.1)
    assert ci.text() == "3.0 [1.0, 5.0]"
    ci90 = stats.t_interval([1, 2, 3, 4, 5], level=0.90)  # t(0.95, 4) = 2.1318468
    assert ci90.high - ci90.mean == pytest.approx(2.1318468 * math.sqrt(0.5), abs=1e-6)


def test_t_interval_edges():
    one = stats.t_interval([4.0])
    assert (one.mean, one.low, one.high, one.n) == (4.0, 4.0, 4.0, 1) and not one.above_zero and one.above(3.9)
    assert one.text() == "4.0"
    none = stats.t_interval([])
    assert none.n == 0 and math.isnan(none.mean) and none.text() == "–"
    flat = stats.t_interval([2.0, 2.0, 2.0])
    assert (flat.low, flat.high) == (2.0, 2.0) and flat.above_zero


def test_paired_difference_uses_the_seeds_both_arms_have():
    full = {0: 70.0, 1: 72.0, 2: 71.0, 3: 90.0}
    base = {0: 60.0, 1: 63.0, 2: 59.0}  # seed 3 has no partner: left out
    ci = stats.paired(full, base)
    diffs = [10.0, 9.0, 12.0]  # mean 31/3, sd sqrt(7/3); t(0.975, 2) = 4.3026527
    assert ci.n == 3 and ci.mean == pytest.approx(31 / 3)
    assert ci.high - ci.mean == pytest.approx(4.3026527 * np.std(diffs, ddof=1) / math.sqrt(3), abs=1e-6)
    # pairing removes what the seeds share: the unpaired arms overlap, the paired difference does not
    a = {s: 50.0 + 10 * s + 1.0 for s in range(5)}
    b = {s: 50.0 + 10 * s for s in range(5)}
    assert stats.t_interval(list(a.values())).low < stats.t_interval(list(b.values())).high
    assert stats.paired(a, b).low == pytest.approx(1.0) and stats.paired(a, b).above_zero


def test_paired_average_is_over_seeds_of_the_task_mean():
    full = {"sst2": {0: 80.0, 1: 82.0}, "rte": {0: 55.0, 1: 53.0, 2: 60.0}}
    base = {"sst2": {0: 70.0, 1: 71.0}, "rte": {0: 52.0, 1: 52.0, 2: 50.0}, "cola": {0: 1.0}}
    ci = stats.paired_average(full, base)
    # seeds every task has in both arms: 0 and 1; per seed mean of (10, 3) = 6.5 and of (11, 1) = 6.0
    assert ci.n == 2 and ci.mean == pytest.approx(6.25)
    assert ci.high - ci.mean == pytest.approx(12.7062047 * 0.25, abs=1e-6)  # sd 0.3536 / sqrt(2) = 0.25
    assert stats.paired_average({}, base).n == 0


@pytest.mark.parametrize("metric, labels, expected", [
    ("accuracy", [1, 1, 1, 0], 75.0),  # SST-2/RTE: the majority class
    ("f1", [1, 1, 0, 0, 1, 1, 0, 1, 1, 0], 2 * 0.6 / 1.6 * 100),  # MRPC: "equivalent" everywhere, 2p / (1 + p)
    ("f1", [0, 0, 0, 1], 40.0),  # even when 1 is the minority: predicting 0 gives F1 0
    ("matthews_corr", [1, 0, 1, 1], 0.0),  # CoLA: a constant has no correlation
    ("pearson", [0.5, 3.0, 4.2], 0.0),  # STS-B: NaN, scored 0 as Table 5 does
])
def test_constant_baseline(metric, labels, expected):
    assert stats.constant_baseline(metric, labels) == pytest.approx(expected)


def test_table5_claims_pair_seeds_and_mark_cells_at_their_baseline():
    """experiments/paper/table5.py's claims from per-seed scores: the paired gain per task and on the average,
    cells whose interval reaches the constant-prediction baseline, and the sentences the README states."""
    from experiments.paper import table5

    by_seed = {
        "sst2": {"full": {0: 62.0, 1: 65.0, 2: 64.0}, "no_pretrain": {0: 52.0, 1: 53.0, 2: 51.0}},
        "mrpc": {"full": {0: 81.0, 1: 81.5, 2: 80.5}, "no_pretrain": {0: 81.2, 1: 81.2, 2: 81.2}},
    }
    claims = table5.intervals(by_seed, {"sst2": 50.9, "mrpc": 81.2})
    sst2, mrpc = claims["tasks"]["sst2"], claims["tasks"]["mrpc"]
    assert sst2["gain"]["mean"] == pytest.approx(35 / 3) and sst2["gain"]["low"] > 0  # diffs 10, 12, 13
    assert mrpc["gain"]["mean"] == pytest.approx(-0.2) and mrpc["gain"]["low"] < 0 < mrpc["gain"]["high"]
    assert sst2["arms"]["full"]["above_baseline"] is True
    assert sst2["arms"]["no_pretrain"]["above_baseline"] is False  # 52 ± 4.30 x 1 / sqrt(3) reaches 50.9
    assert mrpc["arms"]["full"]["above_baseline"] is False and mrpc["arms"]["no_pretrain"]["above_baseline"] is False
    # the average over seeds of the per-seed task mean: (10 - 0.2) / 2, (12 + 0.3) / 2, (13 - 0.7) / 2
    avg = claims["average_gain"]
    assert avg["n"] == 3 and avg["mean"] == pytest.approx(np.mean([4.9, 6.15, 6.15]))
    text = "\n".join(table5.interval_lines(claims))
    assert "Above zero at 95%: sst2 (1 of 2 tasks)" in text and "sst2/no_pretrain, mrpc/full, mrpc/no_pretrain" in text
    assert "reaches below the goal's 5 points" in text  # the average's interval: 5.73 ± 1.79
    assert "; 2-task average 5.7 [" in text  # it said 5-task average whatever the tasks (--quick --tasks sst2,mrpc)
    assert table5.intervals(by_seed, {})["tasks"]["sst2"]["arms"]["full"]["above_baseline"] is None
