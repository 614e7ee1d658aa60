"""Dropout from 16-bit random draws: the model's one dropout (embeddings, residuals, attention, heads).

jax.random.bernoulli spends a whole 32-bit threefry draw on every element. On CPU those bits were the
largest cost of a step after the matmuls (experiments/bench/README.md), and the attention probabilities
alone need B·H·T·T of them per layer. Each 32-bit draw here gives two elements their 16-bit uniform
instead: half the threefry work. An element is kept when its draw is below round(keep · 2^16), so the
rate actually applied differs from the asked one by at most 2^-17 (7.6e-6); kept values are scaled by
1 / (1 - rate) as in the paper's code. The masks are a pure function of the key, like any jax random
op, so a resumed run replays them.

The 32-bit draws are jax.random.bits' own, bit for bit, from Threefry-2x32 written out round by round
(`random_bits`): on CPU jax lowers the hash as a loop of five iterations, each a pass over memory with the
state copied between them; written out, XLA fuses all twenty rounds into one pass, 2-4x faster for the
attention's masks (experiments/bench/README.md, 2026-11-30).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


def keep_mask(rng: jax.Array, rate: float, shape: Sequence[int]) -> jax.Array:
    """Boolean mask of `shape`, each element True with probability 1 - rate (to within 2^-17)."""
    # Draw over the leading axes as they are (their sharding propagates to the draw), halving the last.
    *lead, last = tuple(shape) or (1,)
    bits = random_bits(rng, (*lead, (last + 1) // 2))
    u16 = jnp.stack([bits & 0xFFFF, bits >> 16], axis=-1).reshape(*lead, -1)[..., :last].reshape(shape)
    return u16 < jnp.uint32(round((1.0 - rate) * 65536))


def random_bits(rng: jax.Array, shape: Sequence[int]) -> jax.Array:
    """`jax.random.bits(rng, shape, jnp.uint32)`, the same bits, through `_threefry2x32` for a Threefry key (jax's
    default, in its default partitionable mode) and fewer than 2^32 of them; jax's own draw otherwise."""
    typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
    impl = str(jax.random.key_impl(rng)) if typed else jax.config.jax_default_prng_impl
    one_key = rng.shape == (() if typed else (2,))  # a batch of keys: jax's own error
    if impl != "threefry2x32" or not jax.config.jax_threefry_partitionable or math.prod(shape) >= 2**32 or not one_key:
        return jax.random.bits(rng, shape, jnp.uint32)
    words = jax.random.key_data(rng) if typed else rng
    return _hashed_counts(words[0], words[1], tuple(shape))


@functools.partial(jax.jit, static_argnums=2)
def _hashed_counts(key0, key1, shape: tuple[int, ...]) -> jax.Array:
    """Threefry-2x32 of each element's count under (key0, key1), `high ^ low` as jax.random.bits gives it.

    A jit of its own, so that a model's dropout sites of one shape share one trace and one lowering (XLA inlines
    the calls: the same compiled step): written out at each site, the hash was two thirds of the 117M train step's
    jaxpr and ~0.4-1 s of its trace and lowering (experiments/bench/README.md, 2026-12-01)."""
    # jax counts the elements in 64 bits, (high word, low word); below 2^32 the high word is 0. The count is a sum of
    # iotas along each axis, as jax builds it, so that a sharded draw computes only its own elements.
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    count = sum((jax.lax.broadcasted_iota(jnp.uint32, shape, i) * jnp.uint32(stride)
                 for i, stride in enumerate(strides)), jnp.zeros(shape, jnp.uint32))
    high, low = _threefry2x32(key0, key1, jnp.zeros_like(count), count)
    return high ^ low


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(key0, key1, x0, x1):
    """The Threefry-2x32 hash (20 rounds; Salmon et al., 2011) as jax computes it (jax/_src/random/threefry2x32.py),
    its five groups of four rounds written out instead of looped."""
    keys = (key0, key1, key0 ^ key1 ^ jnp.uint32(0x1BD11BDA))
    x0, x1 = x0 + keys[0], x1 + keys[1]
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x0 = x0 + x1
            x1 = x0 ^ ((x1 << jnp.uint32(r)) | (x1 >> jnp.uint32(32 - r)))
        x0, x1 = x0 + keys[(group + 1) % 3], x1 + keys[(group + 2) % 3] + jnp.uint32(group + 1)
    return x0, x1


def dropout(x: jax.Array, rate: float, rng: jax.Array, broadcast_dims: Sequence[int] = ()) -> jax.Array:
    """Inverted dropout of `x`; axes in `broadcast_dims` share one mask (size 1 in the draw)."""
    if rate <= 0.0:
        return x
    if rate >= 1.0:
        return jnp.zeros_like(x)
    shape = [1 if i in broadcast_dims else d for i, d in enumerate(x.shape)]
    keep = keep_mask(rng, rate, shape)
    scale = 1.0 / (1.0 - rate)
    if x.dtype == jnp.float32:
        return _dropped_once(x, keep, scale)
    return _drop(x, keep, scale)


def _drop(x: jax.Array, keep: jax.Array, scale: float) -> jax.Array:
    # A multiply, not a divide: the backward pass repeats it on every gradient, and division costs more.
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dropped_once(x: jax.Array, keep: jax.Array, scale: float) -> jax.Array:
    """`_drop`, whose gradient is computed once and kept (an `optimization_barrier`). Without it XLA:CPU fused the
    float32 gradient into each of its readers: a residual dropout's feeds both of the projection's backward
    products, one of which reads it transposed, so the mask and the gradient were read twice, once column by column
    (3.6 ns an element, ~50 ms of the 117M fp32 step; experiments/bench/README.md, 2026-11-30 (late)). The same
    values. Not in bf16: there the products' backward casts the gradient once anyway, and a barrier made the 117M
    step 8% slower."""
    return _drop(x, keep, scale)


def _dropped_once_fwd(x, keep, scale):
    return _drop(x, keep, scale), keep


def _dropped_once_bwd(scale, keep, g):
    return jax.lax.optimization_barrier(_drop(g, keep, scale)), None


_dropped_once.defvjp(_dropped_once_fwd, _dropped_once_bwd)


class Dropout(nn.Module):
    """`nn.Dropout`'s interface (rate, broadcast_dims; rng stream "dropout") on `dropout` above."""

    rate: float
    broadcast_dims: Sequence[int] = ()

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate <= 0.0:
            return x
        return dropout(x, self.rate, self.make_rng("dropout"), self.broadcast_dims)
