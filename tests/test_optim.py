"""The GPT-1 optimizer decays exactly kernels and embeddings (on the real param tree); schedules start
at 0, peak at the end of warmup and reach 0 at the end; optimizers are picked by name."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gpt1_jax.config import ConfigError, from_dict, model_preset
from gpt1_jax.model import init_params
from gpt1_jax.optim import OPTIMIZERS, OptimConfig, decay_mask, make_optimizer, make_schedule


@pytest.fixture(scope="module")
def params():
    return jax.tree.map(np.asarray, nn.meta.unbox(init_params(model_preset("tiny"), 0)))


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


@pytest.mark.parametrize("name", ["gpt1_adam", "adamw"])
def test_weight_decay_touches_only_intended_leaves(params, name):
    # Zero gradients: Adam's step is 0, so any change to a leaf is weight decay alone.
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


def test_gpt1_adam_is_optax_clip_then_adamw(params):
    cfg = OptimConfig(lr=1e-3, schedule="constant", clip_norm=1.0)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 3.0), params)  # global norm >> 1: clipping acts
    ref = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(1e-3, 0.9, 0.999, 1e-8, weight_decay=0.01, mask=decay_mask(params)))
    tx = make_optimizer(cfg, params)
    u, _ = tx.update(grads, tx.init(params), params)
    u_ref, _ = ref.update(grads, ref.init(params), params)
    jax.tree.map(np.testing.assert_array_equal, u, u_ref)


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


def test_registry_and_config_errors(params):
    assert {"gpt1_adam", "adamw"} <= set(OPTIMIZERS)
    for name in OPTIMIZERS:  # every registered optimizer builds and steps on the real tree
        tx = make_optimizer(OptimConfig(name=name, schedule="constant"), params)
        jax.jit(tx.update)(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
    assert from_dict(OptimConfig, {"name": "adamw", "lr": "1e-3"}).lr == 1e-3
    for bad in ({"name": "adamax_typo"}, {"schedule": "cosine"}, {"b2": 1.0}, {"warmup_steps": 10, "total_steps": 5}):
        with pytest.raises(ConfigError):
            from_dict(OptimConfig, bad)
