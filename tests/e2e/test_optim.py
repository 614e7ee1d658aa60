"""The GPT-1 optimizer is optax's clip then AdamW; every optimizer builds by name; each reads exactly the config fields
config.py's OPTIMIZER_READS says it does (the table that refuses a given field it would not read)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gpt1_jax.config import (FIRST_MOMENT_FIELD, OPTIM_SHARED, OPTIMIZER_NAMES, OPTIMIZER_READS, ConfigError,
                             ModelConfig, from_dict, model_preset)
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


# The table check: every OptimConfig field but the name changed on its own, to a valid value other than BASE's, must
# change the updates of each optimizer whose row (config.py OPTIMIZER_READS, with OPTIM_SHARED) says it reads it;
# all the others changed at once must leave them bit-identical (they trained so, config.yaml recording them).
OTHER = dict(lr=2e-2, schedule="warmup_linear", warmup_steps=3, total_steps=8, weight_decay=0.3, clip_norm=0.05,
             b1=0.99, b2=0.9, eps=0.5, state_dtype="bfloat16", momentum=0.5, muon_beta=0.5, muon_ns_steps=2,
             muon_consistent_rms=0.0, muon_adam_lr_ratio=0.5, sf_b1=0.5, sf_weight_lr_power=0.0,
             adafactor_decay_rate=0.5, adafactor_momentum=0.9)
# Four steps through a warmup of 2 into the decay (total_steps shows at the fourth; schedule-free weighs its average by
# lr^sf_weight_lr_power, which differs only while the lr still rises); clipping at 10 acts on the later, larger
# gradients only (a clip acting alike on every step leaves Lion's signs as they were); b2 0.5, so that Lion's momentum
# weighs in its sign; an Adafactor momentum for state_dtype to narrow (without one it reads none: test below); one
# Newton-Schulz iteration of Muon's, not 5 (its eager updates were a third of this file's time).
BASE = dict(lr=1e-2, schedule="warmup_cosine", warmup_steps=2, total_steps=5, b2=0.5, clip_norm=10.0, muon_ns_steps=1,
            adafactor_momentum=0.5)


@pytest.fixture(scope="module")
def small():
    """GPT-1's parameter tree at its smallest (eager muon steps cost ~0.6 s on the tiny preset's), with four gradients
    of random signs and growing norms (~7 to ~140)."""
    shape = ModelConfig(vocab_size=32, n_positions=8, d_model=16, n_layers=2, n_heads=2, d_mlp=32, scan_layers=True)
    p = jax.tree.map(np.asarray, nn.meta.unbox(init_params(shape, 0)))
    rng = np.random.default_rng(0)
    return p, [jax.tree.map(lambda x, s=s: (s * rng.normal(size=x.shape)).astype(x.dtype), p) for s in (0.1, .5, 1, 2)]


def _updates(cfg: OptimConfig, small) -> list:
    tree, grads = small
    tx = make_optimizer(cfg, tree)
    state, p, out = tx.init(tree), tree, []
    for g in grads:  # eager: a compile per config would cost more than these four small steps
        u, state = tx.update(g, state, p)
        out += jax.tree.leaves(u)
        p = optax.apply_updates(p, u)
    return out


def _same(a: list, b: list) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_the_fields_an_optimizer_reads_are_its_row_of_the_table(small, name):
    assert set(OTHER) == {f.name for f in dataclasses.fields(OptimConfig)} - {"name"}
    base = OptimConfig(name=name, **BASE)
    reads = set(OPTIM_SHARED + OPTIMIZER_READS[name]) - {"name"}
    ref = _updates(base, small)
    unchanged = [f for f in sorted(reads) if _same(ref, _updates(dataclasses.replace(base, **{f: OTHER[f]}), small))]
    assert not unchanged, f"{name} does not read {unchanged}, which config.py OPTIMIZER_READS says it reads"
    ignored = dataclasses.replace(base, **{f: v for f, v in OTHER.items() if f not in reads})
    assert _same(ref, _updates(ignored, small)), f"{name} reads a field its row leaves out"


@pytest.mark.parametrize("name, field", list(FIRST_MOMENT_FIELD.items()))
def test_state_dtype_is_read_only_with_a_first_moment(small, name, field):
    """Adafactor (by default) and SGD without momentum keep no first moment: bfloat16 state changed nothing, and
    check_optim_reads refuses it given so (tests/unit/test_config.py)."""
    base = OptimConfig(name=name, **{**BASE, field: 0.0})
    assert _same(_updates(base, small), _updates(dataclasses.replace(base, state_dtype="bfloat16"), small))
