"""The causal self-attention core: softmax(q k^T / sqrt(d_head) + causal mask) v, swappable by name.

Shapes use nanodo's suffixes: B batch, T query time, S key time, H heads, K head dim.
Implementations:
  "xla"          masked softmax as two einsums (docs/stack.md: jax.nn.dot_product_attention's backward pass was
                 ~1.7x slower on CPU); with "xla_blocked", the only ones with attention dropout.
  "xla_blocked"  the same core in blocks of queries (`query_blocks`), each over the keys up to its own end: the
                 masked triangle above the blocks is never computed; in bf16 its two products take bf16 inputs
                 and give float32 (`products.mixed_einsum`, as the layers' do), which XLA:CPU runs ~2x faster
                 than bf16 results. Fastest on CPU. Not the default elsewhere: compiled for a TPU (v5e,
                 2026-11-28) it moved more bytes than "xla" (docs/scale.md).
  "dot_product"  jax.nn.dot_product_attention with XLA's own lowering.
  "cudnn"        jax.nn.dot_product_attention's cuDNN flash kernel (GPU; bf16/fp16 only, head dims a multiple of
                 8 up to 128 on every GPU: jax refuses the rest with NotImplementedError).
  "auto"         xla_blocked on CPU; cudnn on GPU where it runs and no dropout is asked for; xla otherwise.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from gpt1_jax.dropout import dropout
from gpt1_jax.errors import ConfigError
from gpt1_jax.products import mixed_einsum

# The original fills masked scores with -1e9 (HF: -1e4 for fp16). Any value that underflows exp() to 0
# gives identical probabilities; the dtype's own minimum is safe in bf16 too.


CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def resolve_impl(impl: str, dropout_active: bool, dtype, backend: str | None = None, head_dim: int = 64) -> str:
    """The implementation `impl` names for queries of `dtype` and `head_dim` on `backend` (default: jax's)."""
    cudnn_dtype = jnp.dtype(dtype) in CUDNN_DTYPES
    cudnn_head = head_dim % 8 == 0 and head_dim <= 128
    if impl == "auto":
        backend = backend or jax.default_backend()
        if backend == "cpu":
            return "xla_blocked"
        return "cudnn" if backend == "gpu" and cudnn_dtype and cudnn_head and not dropout_active else "xla"
    if impl in ("dot_product", "cudnn") and dropout_active:
        raise ConfigError(f"model.attention={impl!r} has no attention dropout; set attn_dropout=0 or attention='xla'")
    if impl == "cudnn" and not cudnn_dtype:
        raise ConfigError(f"model.attention='cudnn' needs bf16 or fp16 compute, got {jnp.dtype(dtype).name}; "
                          "set model.dtype=bfloat16 or attention='auto'")
    if impl == "cudnn" and not cudnn_head:
        raise ConfigError(f"model.attention='cudnn' needs a head dim that is a multiple of 8 up to 128, got {head_dim}; "
                          "set attention='auto'")
    return impl


def check_runnable(impl: str, attn_dropout: float, training: bool, head_dim: int, backend: str | None = None) -> None:
    """Raises ConfigError where `model.attention=impl` cannot run here (or, `training`, with attention dropout):
    a training verb calls it before it writes anything, not at the first step's trace."""
    backend = backend or jax.default_backend()
    if impl == "cudnn" and backend != "gpu":
        raise ConfigError(f"model.attention='cudnn' needs an NVIDIA GPU, and this run's devices are {backend}; "
                          "set attention=auto")
    resolve_impl(impl, training and attn_dropout > 0.0, jnp.bfloat16, backend, head_dim)


def model_impl(model, backend: str) -> str:
    """The implementation a ModelConfig's train step traces on `backend` (its attention dropout on)."""
    return resolve_impl(model.attention, model.attn_dropout > 0.0, model.dtype, backend, model.head_dim)


def causal_attention(
    q_BTHK: jax.Array,
    k_BSHK: jax.Array,
    v_BSHK: jax.Array,
    *,
    impl: str = "xla",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    query_offset: jax.Array | int | None = None,
    recompute: bool = False,
) -> jax.Array:
    """Causal attention over one sequence per batch row; dropout applies to the attention probabilities.

    Query t sits at position `query_offset + t` and sees keys 0..that position; by default the queries
    are the last T of the S keys (S - T), as in training where T == S. A KV-cache decode step passes its
    write position (xla implementation only). `recompute` (model.remat=attention): the backward pass
    recomputes the scores, probabilities and dropout mask from q, k, v and the key instead of keeping them,
    which at GPT-1's 512 tokens are about half a block's activations, for one more QK^T product."""
    dropout_active = dropout_rate > 0.0 and dropout_rng is not None
    impl = resolve_impl(impl, dropout_active, q_BTHK.dtype, head_dim=q_BTHK.shape[-1])
    rate = dropout_rate if dropout_active else 0.0
    mixed = impl == "xla_blocked" and jnp.dtype(q_BTHK.dtype) == jnp.dtype(jnp.bfloat16)
    if impl in ("dot_product", "cudnn"):
        def core(q_BTHK, k_BSHK, v_BSHK, _):
            return jax.nn.dot_product_attention(
                q_BTHK, k_BSHK, v_BSHK, is_causal=True, implementation=None if impl == "dot_product" else "cudnn"
            )
    elif impl == "xla_blocked" and query_offset is None and q_BTHK.shape[1] == k_BSHK.shape[1]:
        def core(q_BTHK, k_BSHK, v_BSHK, dropout_rng):
            return _query_blocked_attention(q_BTHK, k_BSHK, v_BSHK, rate, dropout_rng, mixed)
    else:
        def core(q_BTHK, k_BSHK, v_BSHK, dropout_rng):
            return _einsum_attention(q_BTHK, k_BSHK, v_BSHK, rate, dropout_rng, query_offset, mixed)
    if recompute and query_offset is None:  # a decode step has no backward pass
        core = jax.checkpoint(core)
    return core(q_BTHK, k_BSHK, v_BSHK, dropout_rng if dropout_active else None)


def query_blocks(T: int) -> int:
    """How many blocks the einsum core splits T queries into (at least 128 queries a block, at most 4 blocks).

    Block i's queries see only the keys up to the block's own end, so the products, the softmax and the
    dropout draws skip the masked triangle above the blocks: 4 blocks do 10/16 of the T x T work. On CPU the
    117M train step at 2 x 512 went from 2.75 to 2.53 s and the `small` one at 16 x 256 from 0.67 to 0.59 s;
    blocks of 32 queries made the `small` 16 x 128 step no faster in fp32 and slower in bf16, for twice the
    compile time (experiments/bench/README.md, 2026-11-28)."""
    return max(1, min(4, T // 128))


def _query_blocked_attention(q_BTHK, k_BSHK, v_BSHK, dropout_rate: float, dropout_rng, mixed: bool) -> jax.Array:
    """The causal core over T == S positions, query block by query block (`query_blocks`); each block
    draws its own dropout mask from `fold_in(dropout_rng, block)`."""
    T = q_BTHK.shape[1]
    n = query_blocks(T)
    if n == 1:
        return _einsum_attention(q_BTHK, k_BSHK, v_BSHK, dropout_rate, dropout_rng, None, mixed)
    ends = tuple(T * (i + 1) // n for i in range(n))
    blocks = tuple(zip((0,) + ends[:-1], ends))
    queries = _time_slices(q_BTHK, blocks)
    keys, values = (_time_slices(x_BSHK, tuple((0, end) for end in ends)) for x_BSHK in (k_BSHK, v_BSHK))
    out = []
    for i in range(n):
        rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, i)
        out.append(_einsum_attention(queries[i], keys[i], values[i], dropout_rate, rng, None, mixed))
    return jnp.concatenate(out, axis=1)


def _time_slices(x: jax.Array, bounds: tuple[tuple[int, int], ...]) -> tuple[jax.Array, ...]:
    """x[:, start:end] for each (start, end) of `bounds`: a query block's queries, or the keys (values) it sees."""
    return _slices(x, bounds, x.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _slices(x, bounds, shape):
    return tuple(x[:, start:end] for start, end in bounds)


def _slices_fwd(x, bounds, shape):
    return _slices(x, bounds, shape), None


def _slices_bwd(bounds, shape, _, grads):
    """The slices' gradients added up span by span (between consecutive bounds), the last slice's first as autodiff
    adds them, then concatenated: the same values. Autodiff pads each slice's gradient to the whole length and adds
    the padded arrays, which XLA:CPU fuses into one loop ~4.5x slower than this (a pad inside a loop fusion: 90 ms of
    the 117M bf16 step; experiments/bench/README.md, 2026-11-30 (late))."""
    points = sorted({0, shape[1], *(p for bound in bounds for p in bound)})
    spans = []
    for a, b in zip(points[:-1], points[1:]):
        parts = [g[:, a - start:b - start] for (start, end), g in zip(bounds, grads) if start <= a and b <= end]
        total = parts[-1] if parts else jnp.zeros((shape[0], b - a, *shape[2:]), grads[0].dtype)
        for part in reversed(parts[:-1]):
            total = total + part
        spans.append(total)
    return (jnp.concatenate(spans, axis=1),)


_slices.defvjp(_slices_fwd, _slices_bwd)


def _einsum_attention(q_BTHK, k_BSHK, v_BSHK, dropout_rate: float, dropout_rng, query_offset,
                      mixed: bool = False) -> jax.Array:
    """`mixed`: both products take the inputs' (bf16) dtype and give float32 (`products.mixed_einsum`)."""
    scale = q_BTHK.shape[-1] ** -0.5
    q_BTHK = q_BTHK * jnp.asarray(scale, q_BTHK.dtype)
    if mixed:
        scores_BHTS = mixed_einsum("bthk,bshk->bhts", q_BTHK, k_BSHK, q_BTHK.dtype)
    else:
        scores_BHTS = jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BSHK)
    # Softmax in float32 whatever the compute dtype: bf16 sums over 512 keys lose the small entries.
    scores_BHTS = scores_BHTS.astype(jnp.float32)
    T, S = scores_BHTS.shape[-2:]
    offset = S - T if query_offset is None else query_offset
    causal_TS = jnp.arange(S)[None, :] <= offset + jnp.arange(T)[:, None]
    scores_BHTS = jnp.where(causal_TS, scores_BHTS, jnp.finfo(jnp.float32).min)
    probs_BHTS = jax.nn.softmax(scores_BHTS, axis=-1)
    if dropout_rate > 0.0:
        probs_BHTS = dropout(probs_BHTS, dropout_rate, dropout_rng)
    if mixed:
        return mixed_einsum("bhts,bshk->bthk", probs_BHTS, v_BSHK, v_BSHK.dtype).astype(v_BSHK.dtype)
    return jnp.einsum("bhts,bshk->bthk", probs_BHTS.astype(v_BSHK.dtype), v_BSHK)
