"""The GPT-1 optimizer decays exactly kernels and embeddings (on the real param tree); schedules start
at 0, peak at the end of warmup and reach 0 at the end; optimizers are picked by name."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gpt1_jax.config import DECAYING_SCHEDULES, ConfigError, from_dict
from gpt1_jax.optim import OPTIMIZERS, SCHEDULES, OptimConfig, decay_mask, make_optimizer, make_schedule
from gpt1_jax.optim import eval_params, muon_dimension_numbers, optimizer_state_bytes, uses_eval_params  # noqa: E402
from tests.support.optim import params  # noqa: F401 (pytest fixtures)


def _paths(tree, pred):
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(str(k.key) for k in path) for path, leaf in flat if pred(leaf)}


def test_decay_mask_on_real_tree(params):
    mask = decay_mask(params)
    decayed = _paths(mask, lambda m: m)
    assert decayed == {
        "tokens_embed/embedding", "positions_embed/embedding", "h/attn/c_attn/kernel", "h/attn/c_proj/kernel",
        "h/mlp/c_fc/kernel", "h/mlp/c_proj/kernel",
    }
    assert _paths(mask, lambda m: not m) == {
        "h/attn/c_attn/bias", "h/attn/c_proj/bias", "h/mlp/c_fc/bias", "h/mlp/c_proj/bias",
        "h/ln_1/scale", "h/ln_1/bias", "h/ln_2/scale", "h/ln_2/bias",
    }


@pytest.mark.parametrize("name", ["gpt1_adam", "adamw", "adafactor", "lion", "sgd"])
def test_weight_decay_touches_only_intended_leaves(params, name):
    # Zero gradients: the gradient step is 0, so any change to a leaf is weight decay alone, and it must be
    # lr x weight_decay x param in every optimizer (optax.adafactor alone leaves the lr out of it).
    cfg = OptimConfig(name=name, lr=0.1, schedule="constant", weight_decay=0.01)
    tx = make_optimizer(cfg, params)
    params = jax.tree.map(lambda p: p + 1.0, params)  # biases/LN bias are 0 at init: make decay visible
    grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    mask = decay_mask(params)
    for (path, u), m, p in zip(jax.tree_util.tree_flatten_with_path(updates)[0], jax.tree.leaves(mask),
                               jax.tree.leaves(params)):
        if m:
            np.testing.assert_allclose(u, -0.1 * 0.01 * p, rtol=1e-6, err_msg=str(path))
        else:
            assert not np.any(np.asarray(u)), path


@pytest.mark.parametrize("schedule", ["warmup_linear", "warmup_cosine"])
def test_schedules_start_peak_end(schedule):
    cfg = OptimConfig(lr=2.5e-4, schedule=schedule, warmup_steps=20, total_steps=100)
    s = make_schedule(cfg)
    assert float(s(0)) == 0.0
    assert float(s(10)) == pytest.approx(1.25e-4)
    assert float(s(20)) == pytest.approx(2.5e-4)
    assert 0 < float(s(60)) < 2.5e-4
    assert float(s(100)) == pytest.approx(0.0, abs=1e-12)


def test_warmup_linear_is_linear_and_constant_is_constant():
    s = make_schedule(OptimConfig(lr=1.0, schedule="warmup_linear", warmup_steps=10, total_steps=110))
    assert float(s(60)) == pytest.approx(0.5)
    s = make_schedule(OptimConfig(lr=1.0, schedule="constant", warmup_steps=0))
    assert float(s(0)) == float(s(10**6)) == 1.0
    s = make_schedule(OptimConfig(lr=1.0, schedule="warmup_linear", warmup_steps=0, total_steps=10))
    assert float(s(0)) == 1.0 and float(s(10)) == 0.0


@pytest.mark.parametrize("schedule", ["warmup_linear", "warmup_cosine", "warmup_constant", "constant"])
def test_every_schedule_takes_its_peak_traced_and_gives_the_same_values(schedule):
    # The compiled step passes the lr as an input (gpt1_jax/step.py Hyper): the schedule must trace with it.
    cfg = OptimConfig(lr=3e-4, schedule=schedule, warmup_steps=0 if schedule == "constant" else 7, total_steps=50)
    steps = jnp.arange(0, 60, 3)
    traced = jax.jit(lambda lr: jax.vmap(make_schedule(cfg, lr))(steps))(jnp.float32(3e-4))
    np.testing.assert_array_equal(np.asarray(traced), np.asarray(jax.vmap(make_schedule(cfg))(steps)))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_decaying_schedules_last_step_is_below_its_peak_only_if_its_warmup_ends_two_steps_before(schedule):
    """Step k of a run trains at the schedule's value at k - 1 (optax counts from 0), so the run's last step is
    s(steps - 1): with warmup steps - 1 it was still the peak. Hence check_pretrain_schedule's steps - 2, and
    config.py's DECAYING_SCHEDULES are those whose last step falls below the peak."""
    steps, lr = 30, 3e-3
    last = {w: float(make_schedule(OptimConfig(lr=lr, schedule=schedule, warmup_steps=w, total_steps=steps))(steps - 1))
            for w in (steps - 2, steps - 1)} if schedule != "constant" else {0: lr}
    assert last.get(steps - 1, lr) == pytest.approx(lr)
    assert (last.get(steps - 2, lr) < lr * 0.99) == (schedule in DECAYING_SCHEDULES)


NEW_OPTIMIZERS = ["sgd_nesterov", "muon", "schedule_free_adamw", "lamb"]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_steps_on_the_real_tree_and_state_bytes_match(params, name):
    """Builds, takes finite steps that change the params, and optimizer_state_bytes (what the study's
    table reports) is exactly the size of the state it builds."""
    cfg = OptimConfig(name=name, lr=1e-3, schedule="warmup_constant", warmup_steps=1, total_steps=10)
    tx = make_optimizer(cfg, params)
    state = tx.init(params)
    assert optimizer_state_bytes(cfg, params) == sum(x.nbytes for x in jax.tree.leaves(state))
    grads = jax.tree.map(lambda p: 0.01 * jnp.ones_like(p) + 0.01 * p, params)
    update = tx.update  # eager: a compile per optimizer would cost more than these two tiny steps
    p = params
    for _ in range(2):
        u, state = update(grads, state, p)
        p = optax.apply_updates(p, u)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(p))
    assert float(optax.tree.norm(jax.tree.map(jnp.subtract, p, params))) > 0
    jax.tree.map(lambda a, b: None if a.shape == b.shape else pytest.fail("shape"), eval_params(state, p), p)


@pytest.mark.parametrize("name", NEW_OPTIMIZERS)
def test_new_optimizers_decay_only_intended_leaves(params, name):
    # Zero gradients: the only movement is weight decay, on kernels and embeddings only.
    cfg = OptimConfig(name=name, lr=0.1, schedule="constant", weight_decay=0.01)
    tx = make_optimizer(cfg, params)
    params = jax.tree.map(lambda p: p + 1.0, params)
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    for (path, u), m in zip(jax.tree_util.tree_flatten_with_path(updates)[0], jax.tree.leaves(decay_mask(params))):
        if m:
            assert np.any(np.asarray(u)), path
        else:
            assert not np.any(np.asarray(u)), path


def test_sgd_nesterov_is_optax_nesterov(params):
    cfg = OptimConfig(name="sgd_nesterov", lr=0.1, schedule="constant", weight_decay=0.0, clip_norm=0.0)
    tx, ref = make_optimizer(cfg, params), optax.sgd(0.1, momentum=0.9, nesterov=True)
    grads = jax.tree.map(jnp.ones_like, params)
    u, _ = tx.update(grads, tx.init(params), params)
    u_ref, _ = ref.update(grads, ref.init(params), params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), u, u_ref)


def test_muon_dimension_numbers_on_the_scanned_tree(params):
    dims = muon_dimension_numbers(params)
    flat = {"/".join(str(k.key) for k in path): d for path, d in
            jax.tree_util.tree_flatten_with_path(dims, is_leaf=lambda d: d is None or isinstance(d, tuple))[0]}
    assert {k for k, d in flat.items() if d is not None} == {
        "h/attn/c_attn/kernel", "h/attn/c_proj/kernel", "h/mlp/c_fc/kernel", "h/mlp/c_proj/kernel"}
    assert flat["h/attn/c_attn/kernel"].reduction_axis == (-4,)  # [L, D, 3, H, K]: D in, H*K out, per (L, qkv)


def test_muon_orthogonalises_each_layer_and_each_of_q_k_v(params):
    """Muon's update of c_attn [L, D, 3, H, K] is, per layer and per q/k/v, an (approximately) orthogonal
    D x (H*K) matrix, and a layer's update depends on that layer's gradient only."""
    cfg = OptimConfig(name="muon", lr=1.0, schedule="constant", weight_decay=0.0, clip_norm=0.0,
                      muon_consistent_rms=0.0)
    tx = make_optimizer(cfg, params)
    rng = np.random.default_rng(0)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
    u, _ = tx.update(grads, tx.init(params), params)
    k = np.asarray(u["h"]["attn"]["c_attn"]["kernel"])  # [L, D, 3, H, K]
    L, D, _, H, K = k.shape
    for layer in range(L):
        for i in range(3):
            s = np.linalg.svd(k[layer, :, i].reshape(D, H * K), compute_uv=False)
            # Newton-Schulz (5 steps, Jordan's coefficients) pushes singular values into ~[0.7, 1.2];
            # only the very smallest of a random square matrix stays lower.
            assert 0.6 < np.median(s) < 1.2 and s.max() < 1.5 and np.mean(s > 0.6) > 0.9, (layer, i, s)
    g2 = jax.tree.map(lambda g: g, grads)
    g2["h"]["attn"]["c_attn"]["kernel"] = grads["h"]["attn"]["c_attn"]["kernel"].at[1].multiply(-3.0)
    u2, _ = tx.update(g2, tx.init(params), params)
    np.testing.assert_allclose(u2["h"]["attn"]["c_attn"]["kernel"][0], k[0], rtol=1e-5, atol=1e-6)


def test_schedule_free_eval_params_is_optax_x(params):
    from optax.contrib import ScheduleFreeState, schedule_free_eval_params

    cfg = OptimConfig(name="schedule_free_adamw", lr=1e-2, schedule="constant")
    assert uses_eval_params(cfg.name) and not uses_eval_params("adamw")
    tx = make_optimizer(cfg, params)
    state, p = tx.init(params), params
    for i in range(3):
        grads = jax.tree.map(lambda q: jnp.sin(q + i), p)
        u, state = tx.update(grads, state, p)
        p = optax.apply_updates(p, u)
    sf = [s for s in jax.tree_util.tree_leaves(state, is_leaf=lambda s: isinstance(s, ScheduleFreeState))
          if isinstance(s, ScheduleFreeState)]
    x = eval_params(state, p)
    jax.tree.map(np.testing.assert_array_equal, x, schedule_free_eval_params(sf[0], p))
    assert float(optax.tree.norm(jax.tree.map(jnp.subtract, x, p))) > 0  # x differs from y
    adam = make_optimizer(OptimConfig(), params)
    assert eval_params(adam.init(params), params) is params


def test_new_config_fields_validate():
    assert from_dict(OptimConfig, {"name": "muon", "muon_beta": "0.9"}).muon_beta == 0.9
    for bad in ({"sf_b1": 0.0}, {"muon_ns_steps": 0}, {"momentum": 1.0}):
        with pytest.raises(ConfigError):
            from_dict(OptimConfig, bad)


def test_bf16_state_dtype_stores_first_moments_in_bf16_and_tracks_fp32_updates():
    import jax
    import jax.numpy as jnp

    from gpt1_jax.config import OptimConfig
    from gpt1_jax.optim import make_optimizer

    params = {"h": {"kernel": jnp.linspace(-1.0, 1.0, 64).reshape(8, 8)}, "ln": {"bias": jnp.zeros(8)}}
    grads = jax.tree.map(lambda p: jnp.cos(p * 3.0) + 0.1, params)
    outs = {}
    for dtype in ("float32", "bfloat16"):
        tx = make_optimizer(OptimConfig(name="adamw", lr=1e-2, warmup_steps=0, schedule="constant", state_dtype=dtype), params)
        state, p = tx.init(params), params
        for _ in range(3):
            updates, state = tx.update(grads, state, p)
            p = jax.tree.map(jnp.add, p, updates)
        outs[dtype] = (state, p)
    state = outs["bfloat16"][0]
    field = lambda path: next(k.name for k in reversed(path) if isinstance(k, jax.tree_util.GetAttrKey))  # noqa: E731
    floats = {field(path): str(x.dtype) for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
              if jnp.issubdtype(x.dtype, jnp.floating)}
    assert floats == {"mu": "bfloat16", "nu": "float32"}
    assert any(jnp.issubdtype(x.dtype, jnp.integer) for x in jax.tree.leaves(state))  # step counts stay integers
    for a, b in zip(jax.tree.leaves(outs["float32"][1]), jax.tree.leaves(outs["bfloat16"][1])):
        assert b.dtype == jnp.float32  # parameters are never narrowed
        assert jnp.allclose(a, b, atol=2e-4), float(jnp.max(jnp.abs(a - b)))


@pytest.mark.parametrize("name", ["adamw", "schedule_free_adamw"])
def test_bf16_state_keeps_training_what_fp32_state_trains(name):
    """Every float of the state was narrowed: Adam's nu (0.999 decay rounds back to nu in bf16's 8 bits) stopped
    falling when the gradient did, and schedule-free's z (the weights) and b1 (0.9 -> 0.8984375) were bf16, so a
    LayerNorm gain near 1 never moved. 100 steps of a gradient of 1, then 2,000 of 0.01, on weights at 1: with the
    whole state narrowed, Adam moved them 0.158 against fp32's 0.199, schedule-free 0.0014 against 0.135."""
    from gpt1_jax.config import OptimConfig
    from gpt1_jax.optim import make_optimizer

    params = {"ln": {"scale": jnp.full(4, 1.0)}}
    grads = jnp.concatenate([jnp.ones(100), jnp.full(2000, 0.01)])
    ends = {}
    for dtype in ("float32", "bfloat16"):
        tx = make_optimizer(OptimConfig(name=name, lr=1e-3, warmup_steps=0, schedule="constant", weight_decay=0.0,
                                        clip_norm=0.0, state_dtype=dtype), params)

        def step(carry, g, tx=tx):
            p, s = carry
            updates, s = tx.update({"ln": {"scale": jnp.full(4, g)}}, s, p)
            return (jax.tree.map(jnp.add, p, updates), s), None

        (p, _), _ = jax.lax.scan(step, (params, tx.init(params)), grads)
        ends[dtype] = float(p["ln"]["scale"][0])
    moved = {dtype: 1.0 - end for dtype, end in ends.items()}
    assert moved["float32"] > 0.1
    assert moved["bfloat16"] == pytest.approx(moved["float32"], rel=0.02), ends
