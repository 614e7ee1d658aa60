"""Per-layer statistics (gpt1_jax/layer_stats.py, config `stats_every`): every parameter group's parameter,
gradient and update norms and update/parameter ratio, computed inside the jitted step, equal a float64 NumPy
recomputation from the same step's parameters, gradients and update, sharded over 8 fake devices (FSDP and
tensor parallel); the groups of scanned blocks, unrolled blocks and a fine-tuning tree; the step's update is the
same with or without them."""

import dataclasses

import jax
import numpy as np
import pytest

from gpt1_jax.config import OptimConfig, model_preset
from gpt1_jax.model import init_params
from gpt1_jax.step import lm_functions, make_trainer


def _numpy_stats(params, grads, updates, n_layers) -> dict[str, float]:
    """The groups by hand, in float64: embeddings, each block's attention / MLP / LayerNorms."""
    def flat(tree):
        return {jax.tree_util.keystr(k): np.asarray(v, np.float64) for k, v in jax.tree_util.tree_leaves_with_path(tree)}

    out = {}
    for name, tree in (("param_norm", params), ("grad_norm", grads), ("update_norm", updates)):
        leaves = flat(tree)
        groups = {"embed/tokens": [], "embed/positions": []}
        for i in range(n_layers):
            groups.update({f"block{i}/attn": [], f"block{i}/mlp": [], f"block{i}/ln": []})
        for key, x in leaves.items():
            if "tokens_embed" in key:
                groups["embed/tokens"].append(x.ravel())
            elif "positions_embed" in key:
                groups["embed/positions"].append(x.ravel())
            else:
                part = "attn" if "'attn'" in key else "mlp" if "'mlp'" in key else "ln"
                if key.startswith("['h']"):  # scanned: [L, ...]
                    for i in range(n_layers):
                        groups[f"block{i}/{part}"].append(x[i].ravel())
                else:
                    groups[f"block{int(key.split(']')[0][4:-1])}/{part}"].append(x.ravel())
        for g, parts in groups.items():
            out[f"stats/{g}/{name}"] = float(np.sqrt(sum(np.sum(p * p) for p in parts)))
    for key in [k for k in out if k.endswith("/param_norm")]:
        g = key.removesuffix("/param_norm")
        out[f"{g}/update_ratio"] = out[f"{g}/update_norm"] / out[key]
    return out


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
    want = _numpy_stats(*trees, model.n_layers)
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5), k
    head = [{"transformer": t, "head": {"linear": {"kernel": rng.normal(size=(64, 2)).astype(np.float32)}}}
            for t in trees]
    got = {k: float(v) for k, v in layer_stats(*head).items()}
    assert {k for k in got if not k.startswith("stats/head/")} == set(want)
    norms = [float(np.linalg.norm(t["head"]["linear"]["kernel"])) for t in head]
    assert [got[f"stats/head/{n}"] for n in ("param_norm", "grad_norm", "update_norm")] == pytest.approx(norms, rel=1e-5)


@pytest.mark.fusion_emitters
def test_in_the_sharded_step_they_match_numpy_and_leave_the_update_alone():
    """Scanned blocks over data=2, fsdp=2, tensor=2: the norms are global reductions of sharded arrays."""
    from gpt1_jax.config import parse_mesh

    model = dataclasses.replace(model_preset("tiny"), n_layers=3, scan_layers=True, vocab_size=96, n_positions=16,
                                d_model=32, n_heads=2, d_mlp=64)
    init_fn, loss_fn = lm_functions(model)
    optim = OptimConfig(name="adamw", lr=1e-2, warmup_steps=0, total_steps=10)
    trainer = make_trainer(init_fn, loss_fn, optim, parse_mesh("data=2,fsdp=2,tensor=2"), devices=jax.devices()[:8])
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.vocab_size, (8, 17)).astype(np.int32)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}

    before = jax.device_get(trainer.init().params)
    plain, _ = trainer.step(trainer.init(), trainer.put_batch(batch))
    watched, metrics = trainer.step(trainer.init(), trainer.put_batch(batch), stats=True)
    after = jax.device_get(watched.params)
    for a, b in zip(jax.tree_util.tree_leaves(jax.device_get(plain.params)), jax.tree_util.tree_leaves(after)):
        np.testing.assert_array_equal(a, b)  # the statistics observe the step, never change it

    _, grads, _ = trainer.grads(trainer.init().params, trainer.put_batch(batch), 0)
    updates = jax.tree.map(lambda new, old: np.asarray(new, np.float64) - np.asarray(old, np.float64), after, before)
    want = _numpy_stats(before, jax.device_get(grads), updates, model.n_layers)
    got = {k: float(v) for k, v in jax.device_get(metrics).items() if k.startswith("stats/")}
    assert set(got) == set(want) and len(want) == 4 * (2 + 3 * model.n_layers)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=2e-4, abs=1e-7), k


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
