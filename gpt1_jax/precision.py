"""Mixed-precision products: bf16 (or fp16) inputs, float32 accumulation and result, forward and backward.

The model's Linear layers, its tied LM head and the attention core's two products all go through
`mixed_einsum` when the compute dtype is not float32 (docs: experiments/bench/README.md, "bf16 compute").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def mixed_einsum(spec: str, x, w, dtype):
    """einsum with `dtype` (bf16) inputs and float32 accumulation, forward *and* backward.

    XLA:CPU runs bf16 x bf16 -> bf16 dots on a slow path (~300 GFLOP/s here) but bf16 inputs with an
    fp32 result at ~830; jax's own backward of a plain einsum would mix dtypes and fall off the fast
    path again. Gradients come back in the operands' own dtypes (fp32 parameters stay fp32).
    """
    return jnp.einsum(spec, x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


def _mixed_einsum_fwd(spec, x, w, dtype):
    return mixed_einsum(spec, x, w, dtype), (x, w)


def _mixed_einsum_bwd(spec, dtype, residuals, g):
    x, w = residuals
    inputs, out = spec.split("->")
    x_axes, w_axes = inputs.split(",")
    g = g.astype(dtype)
    dx = jnp.einsum(f"{out},{w_axes}->{x_axes}", g, w.astype(dtype), preferred_element_type=jnp.float32)
    dw = jnp.einsum(f"{x_axes},{out}->{w_axes}", x.astype(dtype), g, preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), dw.astype(w.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)

