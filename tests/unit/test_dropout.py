"""Dropout from 16-bit draws (gpt1_jax/dropout.py): the rate asked for, independent elements, shared masks
along broadcast axes, the same masks on any mesh, the expectation kept, and jax.random.bits' own bits from the
written-out hash."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gpt1_jax.dropout import dropout, keep_mask, random_bits
from tests.support.jaxprs import all_eqns


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_keep_fraction_is_the_rate_asked_for(rate):
    mask = np.asarray(keep_mask(jax.random.key(0), rate, (64, 8, 257)))  # odd last axis: half a draw unused
    n = mask.size
    tolerance = 5 * np.sqrt(rate * (1 - rate) / n)  # 5 sigma of a fair coin count
    assert abs(mask.mean() - (1 - rate)) < tolerance + 2 ** -17


def test_both_halves_of_a_draw_are_independent():
    """Elements 2i and 2i+1 come from one 32-bit draw; their keep decisions must not correlate."""
    mask = np.asarray(keep_mask(jax.random.key(1), 0.5, (512, 512)), np.float64)
    even, odd = mask[:, 0::2].ravel(), mask[:, 1::2].ravel()
    assert abs(np.corrcoef(even, odd)[0, 1]) < 5 / np.sqrt(even.size)
    rows = mask[:-1].ravel(), mask[1:].ravel()
    assert abs(np.corrcoef(*rows)[0, 1]) < 5 / np.sqrt(rows[0].size)


def test_keys_give_different_masks_and_the_same_key_the_same():
    a, b = (np.asarray(keep_mask(jax.random.key(k), 0.1, (8, 100))) for k in (0, 1))
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, np.asarray(keep_mask(jax.random.key(0), 0.1, (8, 100))))


def test_dropout_scales_kept_values_and_broadcast_axes_share_one_mask():
    x = jnp.ones((4, 6, 50))
    y = np.asarray(dropout(x, 0.25, jax.random.key(2), broadcast_dims=(1,)))
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.75], rtol=1e-6)
    np.testing.assert_array_equal(y, np.broadcast_to(y[:, :1], y.shape))  # one mask along axis 1
    big = np.asarray(dropout(jnp.ones((200_000,)), 0.1, jax.random.key(3)))
    assert abs(big.mean() - 1.0) < 5 * np.sqrt(0.1 / 0.9 / big.size)  # E[dropout(x)] = x
    np.testing.assert_array_equal(np.asarray(dropout(x, 0.0, jax.random.key(2))), np.asarray(x))


def test_masks_do_not_depend_on_the_mesh():
    """A sharded draw (batch over 4 devices, heads over 2) gives the single-device masks bit for bit."""
    mesh = jax.make_mesh((4, 2), ("data", "tensor"))
    sharding = NamedSharding(mesh, P("data", "tensor"))
    draw = lambda k: keep_mask(k, 0.1, (8, 4, 16, 16))  # noqa: E731
    single = np.asarray(jax.jit(draw)(jax.random.key(4)))
    sharded = jax.jit(draw, out_shardings=sharding)(jax.random.key(4))
    assert len(sharded.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(sharded), single)


@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 16, 24), (0, 4)])
def test_random_bits_are_jaxs_own_bit_for_bit(shape):
    """Typed and raw keys, eagerly, jitted and vmapped: the same uint32 draws as jax.random.bits, so every mask
    (and every run's numbers) stayed as they were when the hash was written out."""
    for seed in (0, 12345):
        key = jax.random.fold_in(jax.random.key(seed), 7)
        want = jax.random.bits(key, shape, jnp.uint32)
        assert np.array_equal(random_bits(key, shape), want)
        assert np.array_equal(jax.jit(lambda k: random_bits(k, shape))(key), want)
        raw = jax.random.PRNGKey(seed)
        assert np.array_equal(random_bits(raw, shape), jax.random.bits(raw, shape, jnp.uint32))
    keys = jax.random.split(jax.random.key(3), 4)
    assert np.array_equal(jax.vmap(lambda k: random_bits(k, shape))(keys),
                          jax.vmap(lambda k: jax.random.bits(k, shape, jnp.uint32))(keys))


def test_random_bits_compile_to_one_pass_and_leave_other_keys_to_jax():
    key = jax.random.key(0)
    hlo = jax.jit(lambda k: random_bits(k, (4, 64))).lower(key).as_text()
    assert "while" not in hlo and "threefry" not in hlo  # jax's CPU lowering is a 5-iteration loop
    rbg = jax.random.key(0, impl="rbg")  # another generator: jax's own draw
    assert np.array_equal(random_bits(rbg, (4, 64)), jax.random.bits(rbg, (4, 64), jnp.uint32))
    with pytest.raises(ValueError, match="bits accepts a single key"):  # a batch of keys: jax's own word for it
        random_bits(jax.random.split(key, 3), (4,))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_gradient_is_the_masks_and_computed_once_in_float32(dtype):
    """dropout's gradient equals autodiff's of the same select, bit for bit; in float32 it is kept behind an
    optimization barrier (so XLA computes it once for all its readers), in bf16 it is left to fuse."""
    x = jax.random.normal(jax.random.key(0), (4, 8, 32)).astype(dtype)
    keep = keep_mask(jax.random.key(1), 0.1, x.shape)

    def loss(drop, x):
        y = drop(x)
        return jnp.sum((y * y).astype(jnp.float32))
    ours = jax.jit(jax.grad(lambda x: loss(lambda x: dropout(x, 0.1, jax.random.key(1)), x)))
    plain = jax.jit(jax.grad(lambda x: loss(lambda x: jnp.where(keep, x * jnp.asarray(1 / 0.9, dtype), 0), x)))
    got, want = (np.asarray(f(x).astype(jnp.float32)) for f in (ours, plain))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert ("optimization_barrier" in ours.lower(x).as_text()) == (dtype == jnp.float32)


def test_a_models_dropout_sites_of_one_shape_share_one_traced_hash():
    """Each site traced and lowered the 20-round hash anew: two thirds of the 117M train step's 16,062 jaxpr
    equations, ~0.4-1 s of its trace and lowering (experiments/bench/README.md, 2026-12-01)."""
    import dataclasses

    import flax.linen as nn

    from gpt1_jax.config import model_preset
    from gpt1_jax.model import GPT1, init_params

    config = dataclasses.replace(model_preset("tiny"), n_layers=4)
    params = {"params": nn.unbox(init_params(config, 0, 64))}

    def loss(params, key):
        out = GPT1(config).apply(params, jnp.zeros((2, 64), jnp.int32), deterministic=False, rngs={"dropout": key})
        return jnp.mean(out)
    calls = [eqn for eqn in all_eqns(jax.make_jaxpr(jax.grad(loss))(params, jax.random.key(0)).jaxpr)
             if eqn.params.get("name") == "_hashed_counts"]
    # the embeddings' and each layer's two residual dropouts draw [2, 64, 32] words, each layer's attention [2, 4, 64, 32]
    assert len(calls) == 1 + 3 * config.n_layers
    assert len({id(eqn.params["jaxpr"]) for eqn in calls}) == 2
