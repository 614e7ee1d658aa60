"""The model's matrix products in bfloat16: bf16 inputs, float32 accumulation, forward *and* backward.

XLA:CPU runs bf16 x bf16 -> bf16 dots on a slow path (~300 GFLOP/s on one of this project's machines) but bf16
inputs with an fp32 result at ~830, and the attention core's batched products at ~2x their bf16-result rate
(226 -> 552 GFLOP/s for q k^T at 2 x 512 x 12 heads, experiments/bench/README.md); jax's own backward of a plain
mixed einsum would mix dtypes and fall off the fast path again. Long bf16 sums also drift (docs/numerics.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# Products whose weight-side gradient must take the cotangent as its left operand: in the other order XLA:CPU has
# no bf16 x bf16 -> f32 kernel for it ("bthk,bhts->bshk", the attention keys' gradient: UNIMPLEMENTED at run time),
# while for the attention's other product ("bhts,bthk->bshk", the values' gradient) only the default order has one.
_COTANGENT_FIRST = frozenset({"bthk,bshk->bhts"})


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def mixed_einsum(spec: str, x, w, dtype):
    """einsum with `dtype` (bf16) inputs and a float32 result, forward and backward. Gradients come back in the
    operands' own dtypes (fp32 parameters stay fp32), the weight's in its own axis order (what fp32 runs use it
    for: model.Linear)."""
    return _einsum(spec, x.astype(dtype), w.astype(dtype))


def _mixed_einsum_fwd(spec, x, w, dtype):
    return mixed_einsum(spec, x, w, dtype), (x, w)


def _mixed_einsum_bwd(spec, dtype, residuals, g):
    x, w = residuals
    inputs, out = spec.split("->")
    x_axes, w_axes = inputs.split(",")
    g = g.astype(dtype)
    dx = _einsum(f"{out},{w_axes}->{x_axes}", g, w.astype(dtype))
    if spec in _COTANGENT_FIRST:
        dw = _einsum(f"{out},{x_axes}->{w_axes}", g, x.astype(dtype))
    else:
        dw = _einsum(f"{x_axes},{out}->{w_axes}", x.astype(dtype), g)
    return dx.astype(x.dtype), dw.astype(w.dtype)


def _einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """jnp.einsum of two operands with a float32 result, its batch and contracted axes taken in the order `a` holds
    them. jnp.einsum sorts them by letter: the qkv projection's input gradient (`btqhk,dqhk->btd`) contracted h, k,
    q, and XLA:CPU first copied both operands into that order, the cotangent with an axis of 3 innermost
    (experiments/bench/README.md, 2026-11-30 (late)). Where the letters are already in order this is jnp.einsum
    itself: XLA:CPU has a bf16 x bf16 -> f32 kernel for some operand orders of the attention's products only."""
    inputs, out = spec.split("->")
    a_axes, b_axes = inputs.split(",")
    if "..." in spec:  # the head's `...d,vd->...v`: the leading axes named by capitals
        holder, axes = (a, a_axes) if "..." in a_axes else (b, b_axes)
        named = "".join(chr(ord("A") + i) for i in range(holder.ndim - len(axes.replace("...", ""))))
        a_axes, b_axes, out = (axes.replace("...", named) for axes in (a_axes, b_axes, out))
    batch = [c for c in a_axes if c in b_axes and c in out]
    contracted = [c for c in a_axes if c in b_axes and c not in out]
    if batch == sorted(batch) and contracted == sorted(contracted):  # jnp.einsum's own order: its product as it was
        return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
    dims = (([a_axes.index(c) for c in contracted], [b_axes.index(c) for c in contracted]),
            ([a_axes.index(c) for c in batch], [b_axes.index(c) for c in batch]))
    result = jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)
    axes = batch + [c for c in a_axes if c not in b_axes] + [c for c in b_axes if c not in a_axes]
    return jnp.transpose(result, [axes.index(c) for c in out])


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)
