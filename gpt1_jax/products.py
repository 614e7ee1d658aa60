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
    operands' own dtypes (fp32 parameters stay fp32)."""
    return jnp.einsum(spec, x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


def _mixed_einsum_fwd(spec, x, w, dtype):
    return mixed_einsum(spec, x, w, dtype), (x, w)


def _mixed_einsum_bwd(spec, dtype, residuals, g):
    x, w = residuals
    inputs, out = spec.split("->")
    x_axes, w_axes = inputs.split(",")
    g = g.astype(dtype)
    dx = jnp.einsum(f"{out},{w_axes}->{x_axes}", g, w.astype(dtype), preferred_element_type=jnp.float32)
    if spec in _COTANGENT_FIRST:
        dw = jnp.einsum(f"{out},{x_axes}->{w_axes}", g, x.astype(dtype), preferred_element_type=jnp.float32)
    else:
        dw = jnp.einsum(f"{x_axes},{out}->{w_axes}", x.astype(dtype), g, preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), dw.astype(w.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)
