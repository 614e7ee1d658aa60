"""The GPT-1 optimizer decays exactly kernels and embeddings (on the real param tree); schedules start
at 0, peak at the end of warmup and reach 0 at the end; optimizers are picked by name."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gpt1_jax.config import ConfigError, from_dict, model_preset
from gpt1_jax.model import init_params
from gpt1_jax.optim import OPTIMIZERS, OptimConfig, decay_mask, make_optimizer
from tests.support.optim import params  # noqa: F401 (pytest fixtures)


def test_gpt1_adam_is_optax_clip_then_adamw(params):
    cfg = OptimConfig(lr=1e-3, schedule="constant", clip_norm=1.0)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 3.0), params)  # global norm >> 1: clipping acts
    ref = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(1e-3, 0.9, 0.999, 1e-8, weight_decay=0.01, mask=decay_mask(params)))
    tx = make_optimizer(cfg, params)
    u, _ = tx.update(grads, tx.init(params), params)
    u_ref, _ = ref.update(grads, ref.init(params), params)
    jax.tree.map(np.testing.assert_array_equal, u, u_ref)


def test_registry_and_config_errors(params):
    assert {"gpt1_adam", "adamw"} <= set(OPTIMIZERS)
    for name in OPTIMIZERS:  # every registered optimizer builds and steps on the real tree
        tx = make_optimizer(OptimConfig(name=name, schedule="constant"), params)
        jax.jit(tx.update)(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
    assert from_dict(OptimConfig, {"name": "adamw", "lr": "1e-3"}).lr == 1e-3
    for bad in ({"name": "adamax_typo"}, {"schedule": "cosine"}, {"b2": 1.0}, {"warmup_steps": 10, "total_steps": 5}):
        with pytest.raises(ConfigError):
            from_dict(OptimConfig, bad)


def test_muon_works_without_scan_layers():
    p = nn.meta.unbox(init_params(dataclasses.replace(model_preset("tiny"), scan_layers=False), 0))
    tx = make_optimizer(OptimConfig(name="muon", schedule="constant"), p)
    u, _ = tx.update(jax.tree.map(jnp.ones_like, p), tx.init(p), p)
    assert u["h_0"]["attn"]["c_attn"]["kernel"].shape == p["h_0"]["attn"]["c_attn"]["kernel"].shape
