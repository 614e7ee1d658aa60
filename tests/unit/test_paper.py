"""experiments.paper, in process: missing inputs are one-line errors, the Table 5 goal needs all five tasks,
a gain and four wins, the CoLA threshold maximises Matthews correlation. The pipeline run for real at
--quick: tests/e2e/test_paper.py."""

import numpy as np
import pytest

from experiments.paper import run, table5, zeroshot


def test_missing_inputs_are_one_line_errors(tmp_path, capsys):
    assert run.main(["--stages", "pretrain", "--out", str(tmp_path)]) == 2  # the laptop recipe needs --corpus
    assert "pass --corpus" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        run.main(["--stages", "zeroshot", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "needs --race" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run.main(["--race", str(tmp_path / "nope.tar.gz")])
    assert "no such file" in capsys.readouterr().err
    assert run.main(["--stages", "table5", "--out", str(tmp_path), "--budget", "paper"]) == 2  # nothing to fine-tune
    assert "no release" in capsys.readouterr().err


def test_goal_needs_all_five_tasks_a_gain_and_four_wins():
    base = {t: {"full": [60.0, 62.0], "no_pretrain": [50.0, 52.0], "no_aux_lm": [59.0]} for t in table5.TASKS}
    assert table5.goal(base)["met"] is True and table5.goal(base)["wins"] == 5
    assert table5.goal({t: base[t] for t in ("sst2", "cola")})["met"] is None
    two_losses = dict(base, rte={"full": [40.0], "no_pretrain": [50.0], "no_aux_lm": []},
                      mrpc={"full": [40.0], "no_pretrain": [50.0], "no_aux_lm": []})
    assert table5.goal(two_losses)["wins"] == 3 and table5.goal(two_losses)["met"] is False
    small = {t: {"full": [51.0], "no_pretrain": [50.0], "no_aux_lm": [50.0]} for t in table5.TASKS}
    assert table5.goal(small)["gain"] == pytest.approx(1.0) and table5.goal(small)["met"] is False


def test_best_threshold_maximises_matthews_correlation():
    from sklearn.metrics import matthews_corrcoef

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200)
    scores = labels + rng.normal(0, 0.8, 200)
    cut = zeroshot.best_threshold(scores, labels)
    best = matthews_corrcoef(labels, scores > cut)
    assert all(matthews_corrcoef(labels, scores > t) <= best + 1e-12 for t in np.linspace(-2, 3, 101))
