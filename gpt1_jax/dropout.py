"""Dropout from 16-bit random draws: the model's one dropout (embeddings, residuals, attention, heads).

jax.random.bernoulli spends a whole 32-bit threefry draw on every element. On CPU those bits were the
largest cost of a step after the matmuls (experiments/bench/README.md), and the attention probabilities
alone need B·H·T·T of them per layer. Each 32-bit draw here gives two elements their 16-bit uniform
instead: half the threefry work. An element is kept when its draw is below round(keep · 2^16), so the
rate actually applied differs from the asked one by at most 2^-17 (7.6e-6); kept values are scaled by
1 / (1 - rate) as in the paper's code. The masks are a pure function of the key, like any jax random
op, so a resumed run replays them.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


def keep_mask(rng: jax.Array, rate: float, shape: Sequence[int]) -> jax.Array:
    """Boolean mask of `shape`, each element True with probability 1 - rate (to within 2^-17)."""
    # Draw over the leading axes as they are (their sharding propagates to the draw), halving the last.
    *lead, last = tuple(shape) or (1,)
    bits = jax.random.bits(rng, (*lead, (last + 1) // 2), jnp.uint32)
    u16 = jnp.stack([bits & 0xFFFF, bits >> 16], axis=-1).reshape(*lead, -1)[..., :last].reshape(shape)
    return u16 < jnp.uint32(round((1.0 - rate) * 65536))


def dropout(x: jax.Array, rate: float, rng: jax.Array, broadcast_dims: Sequence[int] = ()) -> jax.Array:
    """Inverted dropout of `x`; axes in `broadcast_dims` share one mask (size 1 in the draw)."""
    if rate <= 0.0:
        return x
    if rate >= 1.0:
        return jnp.zeros_like(x)
    shape = [1 if i in broadcast_dims else d for i, d in enumerate(x.shape)]
    keep = keep_mask(rng, rate, shape)
    # A multiply, not a divide: the backward pass repeats it on every gradient, and division costs more.
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - rate), x.dtype), jnp.zeros((), x.dtype))


class Dropout(nn.Module):
    """`nn.Dropout`'s interface (rate, broadcast_dims; rng stream "dropout") on `dropout` above."""

    rate: float
    broadcast_dims: Sequence[int] = ()

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate <= 0.0:
            return x
        return dropout(x, self.rate, self.make_rng("dropout"), self.broadcast_dims)
