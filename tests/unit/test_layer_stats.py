"""Per-layer statistics (gpt1_jax/layer_stats.py, config `stats_every`): every parameter group's parameter,
gradient and update norms and update/parameter ratio equal a float64 NumPy recomputation, for the groups of unrolled
blocks and of a fine-tuning tree; layer_stats.png draws them. Inside the sharded step, scanned blocks over 8 fake
devices, with the step's update unchanged: tests/e2e/test_layer_stats.py (it reruns under the fusion emitters, in a
process of its own)."""

import dataclasses

import jax
import numpy as np
import pytest

from gpt1_jax.config import model_preset
from gpt1_jax.model import init_params
from tests.support.layer_stats import numpy_stats


def test_groups_of_unrolled_blocks_and_of_a_finetune_tree_match_numpy():
    """The grouping alone, on random trees: unrolled blocks (h_0, h_1, ...), and a fine-tuning tree (the
    transformer under `transformer`, its classifier under `head`)."""
    import flax.linen as nn

    from gpt1_jax.layer_stats import layer_stats

    model = dataclasses.replace(model_preset("tiny"), n_layers=3, scan_layers=False)
    shapes = nn.meta.unbox(jax.eval_shape(lambda k: init_params(model, k), jax.random.key(0)))
    rng = np.random.default_rng(0)
    trees = [jax.tree.map(lambda a: rng.normal(size=a.shape).astype(np.float32), shapes) for _ in range(3)]
    got = {k: float(v) for k, v in layer_stats(*trees).items()}
    want = numpy_stats(*trees, model.n_layers)
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5), k
    head = [{"transformer": t, "head": {"linear": {"kernel": rng.normal(size=(64, 2)).astype(np.float32)}}}
            for t in trees]
    got = {k: float(v) for k, v in layer_stats(*head).items()}
    assert {k for k in got if not k.startswith("stats/head/")} == set(want)
    norms = [float(np.linalg.norm(t["head"]["linear"]["kernel"])) for t in head]
    assert [got[f"stats/head/{n}"] for n in ("param_norm", "grad_norm", "update_norm")] == pytest.approx(norms, rel=1e-5)


def test_a_run_with_statistics_plots_each_group_and_one_without_plots_none(tmp_path):
    """layer_stats.png: a panel per norm and part, a line per block (coloured by depth, 12 here) and per embedding or
    head; a NaN (a diverged step's) and a zero ratio (lr 0 at step 0) are left out of the log axes, not warned of."""
    import json
    import warnings

    import matplotlib

    from gpt1_jax.metrics import plot_layer_stats

    groups = ["embed/tokens", "embed/positions", "head"] + [f"block{i}/{p}" for i in range(12) for p in ("attn", "mlp", "ln")]
    rows = [{"step": 1, "loss": 6.0}]
    for step in (2, 4, 6):
        stats = {f"stats/{g}/{n}": (i + 1) * step * 1e-3 for i, g in enumerate(groups)
                 for n in ("param_norm", "grad_norm", "update_norm", "update_ratio")}
        rows.append({"step": step, "loss": 5.0, **stats})
    rows[1]["stats/block0/attn/update_ratio"] = 0.0
    rows[2]["stats/head/grad_norm"] = "nan"
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "layer_stats.svg"
    with warnings.catch_warnings(), matplotlib.rc_context({"svg.fonttype": "none"}):
        warnings.simplefilter("error")
        assert plot_layer_stats(tmp_path, out) == out
    svg = out.read_text()
    for text in ("attention", "MLP", "LayerNorms", "embeddings, head", "update / parameter norm", "gradient norm",
                 "parameter norm", "embed/tokens", "embed/positions", "head", "block"):
        assert f">{text}<" in svg, text
    assert plot_layer_stats(tmp_path) == tmp_path / "layer_stats.png" and (tmp_path / "layer_stats.png").is_file()

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "metrics.jsonl").write_text('{"step": 1, "loss": 6.0}\n')
    assert plot_layer_stats(plain) is None and not (plain / "layer_stats.png").exists()
