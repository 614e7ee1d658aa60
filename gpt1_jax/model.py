"""GPT-1 in Flax linen, as released (docs/gpt1.md): post-LayerNorm blocks, tanh GELU, learned positions,
tied LM head, no final LayerNorm.

Pure functions only: `GPT1(config).init(...)` makes the parameters, `.apply(...)` runs them. Every
parameter carries logical axis names (vocab, embed, heads, kv, mlp, ...); which mesh axis each name
lands on is decided once, by the rules table in `gpt1_jax.sharding`, never here.

Parameter tree (HF module names, so conversion is a rename):
  tokens_embed/embedding [V, D]      positions_embed/embedding [P, D]
  h/attn/c_attn/{kernel [D, 3, H, K], bias [3, H, K]}   h/attn/c_proj/{kernel [H, K, D], bias [D]}
  h/ln_1/{scale, bias} [D]   h/mlp/c_fc/{kernel [D, F], bias [F]}   h/mlp/c_proj/{kernel [F, D], bias [D]}
  h/ln_2/{scale, bias} [D]
With `scan_layers` every `h/...` array has a leading layer axis [L, ...]; without, the blocks are h_0..h_{L-1}.
"""

from __future__ import annotations

import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from gpt1_jax import sharding as shd
from gpt1_jax.attention import causal_attention
from gpt1_jax.config import ModelConfig
from gpt1_jax.dropout import Dropout
from gpt1_jax.errors import DataError
from gpt1_jax.products import mixed_einsum

Axes = Sequence[str | None]
MIXED_PRODUCT = "mixed_product"  # Linear's bf16 output, named for model.remat=dots (_REMAT_POLICIES)


def _normal(config: ModelConfig, axes: Axes):
    # Plain normal, not truncated: the original and HF both use N(0, 0.02).
    return nn.with_logical_partitioning(nn.initializers.normal(config.init_std), axes)


def _zeros(axes: Axes):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


class Linear(nn.Module):
    """y = einsum(spec, x, W) + b, with kernels of any rank so heads stay a real axis for sharding."""

    config: ModelConfig
    spec: str
    kernel_shape: tuple[int, ...]
    kernel_axes: Axes
    bias_shape: tuple[int, ...]
    bias_axes: Axes
    # float32: the kernel's gradient as mixed_einsum's backward computes it (False: autodiff's product; see MLP)
    gradient_x_first: bool = True

    @nn.compact
    def __call__(self, x):
        c = self.config
        kernel = self.param("kernel", _normal(c, self.kernel_axes), self.kernel_shape, c.param_dtype)
        bias = self.param("bias", _zeros(self.bias_axes), self.bias_shape, c.param_dtype)
        if c.dtype == "float32" and not self.gradient_x_first:
            return jnp.einsum(self.spec, x, kernel.astype(c.dtype)) + bias.astype(c.dtype)
        if c.dtype == "float32":
            # Autodiff's kernel gradient here is a product in the other order and a transpose. The attention's
            # kernels ([D, 3, H, K], [H, K, D]) got theirs transposed, read column by column in the gradient norm
            # and both Adam moments (~90 ms of the 117M step), and c_fc's ran on Eigen at half YNNPACK's rate;
            # mixed_einsum's backward computes x^T·g, in the kernel's own order (experiments/bench/README.md,
            # 2026-11-30 (night)).
            return checkpoint_name(mixed_einsum(self.spec, x, kernel, jnp.dtype(jnp.float32)) + bias, MIXED_PRODUCT)
        # The product is rounded before the bias joins it: where a mesh axis splits the contraction (c_proj's
        # heads or mlp over `tensor`), the cross-device sum then moves bf16, half the bytes (6.7B on v6e-256,
        # 1x32x8: 12.59 -> 8.83 GB all-reduced per chip; experiments/scale/README.md). The bias is still added
        # in float32, so its gradient is a float32 sum, which XLA:CPU reduces directly (over a bf16 cotangent
        # it converted and tree-reduced). Named in the compute dtype: what `dots` keeps is what the next op
        # reads, at half an fp32 product's bytes.
        product = mixed_einsum(self.spec, x, kernel, jnp.dtype(c.dtype)).astype(c.dtype)
        return checkpoint_name((product.astype(jnp.float32) + bias).astype(c.dtype), MIXED_PRODUCT)


def layer_norm(config: ModelConfig, name: str) -> nn.LayerNorm:
    # eps 1e-5 (Flax's 1e-6 default is wrong here); exact two-pass variance, as torch computes it.
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        use_fast_variance=False,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=_zeros(("embed",)),
        name=name,
    )


class CausalSelfAttention(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD, deterministic: bool, decode: bool = False, start=0):
        c = self.config
        H, K, D = c.n_heads, c.head_dim, c.d_model
        qkv_BT3HK = Linear(
            c, "btd,dqhk->btqhk", (D, 3, H, K), ("embed", "qkv", "heads", "kv"), (3, H, K), ("qkv", "heads", "kv"),
            name="c_attn",
        )(x_BTD)
        qkv_BT3HK = nn.with_logical_constraint(qkv_BT3HK, ("batch", "length", "qkv", "heads", "kv"))
        if qkv_BT3HK.dtype == jnp.bfloat16:
            # The backward of three slices is a sum of three padded cotangents, which XLA:CPU rounds to bf16 after
            # each add: split's is one concatenation (the bf16 fine-tuning step 7-9% faster, 117M's ~5%). In fp32 XLA
            # computes that concatenation twice, for the two products that read it (5% slower at `small`), so fp32
            # keeps the slices (experiments/bench/README.md, 2026-11-29 (later)). The gradients are the same bits.
            q_BTHK, k_BSHK, v_BSHK = (jnp.squeeze(x, 2) for x in jnp.split(qkv_BT3HK, 3, axis=2))
        else:
            q_BTHK, k_BSHK, v_BSHK = (qkv_BT3HK[:, :, i] for i in range(3))
        if decode:
            # KV cache: this call's keys/values land at positions start.., then queries attend over all
            # n_positions slots; the causal mask (offset by start) hides the slots not yet written.
            B, T = x_BTD.shape[:2]
            cache_shape = (B, c.n_positions, H, K)
            cached_k = self.variable("cache", "key", jnp.zeros, cache_shape, k_BSHK.dtype)
            cached_v = self.variable("cache", "value", jnp.zeros, cache_shape, v_BSHK.dtype)
            cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k_BSHK, (0, start, 0, 0))
            cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v_BSHK, (0, start, 0, 0))
            k_BSHK, v_BSHK = cached_k.value, cached_v.value
        training = not deterministic and c.attn_dropout > 0.0
        out_BTHK = causal_attention(
            q_BTHK, k_BSHK, v_BSHK,
            impl="xla" if decode else c.attention,
            dropout_rate=c.attn_dropout,
            dropout_rng=self.make_rng("dropout") if training else None,
            query_offset=start if decode else None,
            recompute=c.remat == "attention",
        )
        out_BTD = Linear(c, "bthk,hkd->btd", (H, K, D), ("heads", "kv", "embed"), (D,), ("embed",), name="c_proj")(
            out_BTHK
        )
        return Dropout(c.resid_dropout)(out_BTD, deterministic=deterministic)


def gelu(h):
    """tanh GELU, computed and differentiated in float32 whatever h's dtype.

    XLA:CPU has no bf16 arithmetic and would convert around every elementwise op of GELU, forward and
    backward. In bf16 compute the backward pass recomputes it from h rather than keep its float32
    intermediates: 6.7B on v6e-256 (1x32x8) peaks at 21.9 GB per chip instead of 26.7. In float32 they
    are kept (recomputing cost the CPU's fp32 `small` step a few percent).
    """
    def f(h):
        return jax.nn.gelu(h.astype(jnp.float32), approximate=True).astype(h.dtype)
    return f(h) if h.dtype == jnp.float32 else jax.checkpoint(f)(h)


class MLP(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD, deterministic: bool):
        c = self.config
        D, F = c.d_model, c.d_mlp
        h_BTF = Linear(c, "btd,df->btf", (D, F), ("embed", "mlp"), (F,), ("mlp",), name="c_fc")(x_BTD)
        h_BTF = gelu(h_BTF)
        h_BTF = nn.with_logical_constraint(h_BTF, ("batch", "length", "mlp"))
        # x^T·g would need the GELU output transposed, [F, B·T]: XLA:CPU fused that copy with GELU's last products,
        # one loop reading three arrays column by column (~7.6 ns an element, where a plain transposed copy takes
        # 0.2). Eigen's autodiff product packs x^T itself and is faster (117M, `small`; experiments/bench/README.md).
        out_BTD = Linear(c, "btf,fd->btd", (F, D), ("mlp", "embed"), (D,), ("embed",), name="c_proj",
                         gradient_x_first=False)(h_BTF)
        return Dropout(c.resid_dropout)(out_BTD, deterministic=deterministic)


class Block(nn.Module):
    """Post-LN: n = LN1(x + attn(x)); h = LN2(n + mlp(n)). The (carry, None) signature suits nn.scan."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD, deterministic: bool, decode: bool = False, start=0):
        c = self.config
        attn_BTD = CausalSelfAttention(c, name="attn")(x_BTD, deterministic, decode, start)
        n_BTD = layer_norm(c, "ln_1")(x_BTD + attn_BTD)
        h_BTD = layer_norm(c, "ln_2")(n_BTD + MLP(c, name="mlp")(n_BTD, deterministic))
        return nn.with_logical_constraint(h_BTD, ("batch", "length", "embed")), None


_REMAT_POLICIES = {
    "full": None,  # save nothing inside a block, recompute all of it
    # The layers' products: dot_generals, and in bf16 mixed_einsum's, which the policy sees only by name (a
    # custom_vjp hides its dot: `dots` compiled to `full`'s program in bf16, same memory and FLOPs).
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
        jax.checkpoint_policies.save_only_these_names(MIXED_PRODUCT)),
}


class GPT1(nn.Module):
    """The shared transformer. `__call__` gives final hidden states; `logits` the tied LM head."""

    config: ModelConfig

    def setup(self):
        c = self.config
        self.tokens_embed = nn.Embed(
            c.vocab_size, c.d_model, dtype=c.dtype, param_dtype=c.param_dtype,
            embedding_init=_normal(c, ("vocab", "embed")),
        )
        self.positions_embed = nn.Embed(
            c.n_positions, c.d_model, dtype=c.dtype, param_dtype=c.param_dtype,
            embedding_init=_normal(c, ("positions", "embed")),
        )
        self.embd_dropout = Dropout(c.embd_dropout)
        block = Block
        if c.remat in _REMAT_POLICIES:  # "attention" recomputes inside the attention core instead
            # arguments 2 and 3 (self counts as 0) are `deterministic` and `decode`, Python bools
            block = nn.remat(Block, policy=_REMAT_POLICIES[c.remat], prevent_cse=not c.scan_layers,
                             static_argnums=(2, 3))
        if c.scan_layers:
            stack = nn.scan(
                block,
                variable_axes={"params": 0, "cache": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=nn.broadcast,
                length=c.n_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            self.blocks = [stack(c, name="h")]
        else:
            self.blocks = [block(c, name=f"h_{i}") for i in range(c.n_layers)]

    def __call__(self, tokens_BT: jax.Array, *, deterministic: bool = True, decode: bool = False, start=0,
                 table_GVD: jax.Array | None = None) -> jax.Array:
        """Final hidden states. With `decode`, tokens_BT sit at positions start.. of a sequence whose
        earlier keys/values are in the mutable "cache" collection (see `gpt1_jax.generate`). `table_GVD`: the
        token table as `group_table` gives it, for a pass that hands the same to `logits`."""
        c = self.config
        T = tokens_BT.shape[-1]
        if T > c.n_positions:
            raise ValueError(f"sequence of {T} tokens is longer than the model's n_positions={c.n_positions}")
        x_BTD = self._embed_tokens(tokens_BT, table_GVD) + self.positions_embed(start + jnp.arange(T))[None]
        x_BTD = self.embd_dropout(x_BTD, deterministic=deterministic)
        x_BTD = nn.with_logical_constraint(x_BTD, ("batch", "length", "embed"))
        for block in self.blocks:
            x_BTD, _ = block(x_BTD, deterministic, decode, start)
        return x_BTD

    def logits(self, h_BTD: jax.Array, table_GVD: jax.Array | None = None) -> jax.Array:
        """Tied LM head over the token rows (specials included once appended), in float32 for the loss."""
        if table_GVD is None:
            return self._head(h_BTD, self.tokens_embed.embedding)
        h_GbTD = shd.split_groups(h_BTD, table_GVD.shape[0])
        logits_GbTV = jax.vmap(self._head)(h_GbTD, table_GVD)
        return logits_GbTV.reshape(*h_BTD.shape[:-1], logits_GbTV.shape[-1])

    def group_table(self) -> jax.Array | None:
        """The token table once per batch group ([G, V, D]: the batch split G ways over the mesh axes that do not
        split the table, i.e. data; copy g on the devices of group g), for a pass that uses it twice (input embedding
        and tied head); None where no such axis splits the batch.

        Each use's gradient is a [V, D] partial sum on every device, and the compiler reduced each across devices on
        its own: the table's gradient crossed the network twice per step. Read from one copy per group, the two
        gradients add on each device, and the copies' sum (the broadcast's transpose) is the one reduction."""
        groups, axes = shd.batch_groups()
        if groups == 1:
            return None
        table_VD = self.tokens_embed.embedding
        return shd.on_groups(jnp.broadcast_to(table_VD, (groups, *table_VD.shape)), axes)

    def _embed_tokens(self, tokens_BT: jax.Array, table_GVD: jax.Array | None) -> jax.Array:
        if table_GVD is None:
            return self.tokens_embed(tokens_BT)
        table_GVD = table_GVD.astype(self.config.dtype)  # as nn.Embed casts its table
        x_GbTD = jax.vmap(lambda table_VD, t: jnp.take(table_VD, t, axis=0))(
            table_GVD, shd.split_groups(tokens_BT, table_GVD.shape[0]))
        return x_GbTD.reshape(*tokens_BT.shape, x_GbTD.shape[-1])

    def _head(self, h_BTD: jax.Array, table_VD: jax.Array) -> jax.Array:
        if self.config.dtype == "float32":  # as nn.Embed.attend computes it
            return jnp.dot(h_BTD.astype(jnp.float32), table_VD.astype(jnp.float32).T)
        # "...": generation asks for the last position only, (B, D)
        return mixed_einsum("...d,vd->...v", h_BTD, table_VD, jnp.dtype(self.config.dtype))


def init_params(config: ModelConfig, rng: jax.Array | int = 0, seq_len: int | None = None):
    """Fresh N(0, 0.02) parameters, still wrapped in their logical-axis boxes (nn.Partitioned)."""
    if isinstance(rng, int):
        rng = jax.random.key(rng)
    # the rules in force are an argument: jax's trace cache cannot see flax's rules context, which the
    # activations' sharding constraints are resolved in
    return _init_jit(config, seq_len or min(config.n_positions, 8), nn.get_logical_axis_rules(), rng)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _init_jit(config: ModelConfig, seq_len: int, rules: shd.Rules, rng: jax.Array):
    """One compiled init instead of hundreds of eager ops (seconds saved even on `tiny`); one function for every
    caller, so a config is traced and compiled once per process: a second init_params took as long as the first
    (2.7 CPU-s on `tiny`), and a run's shape check, its Trainer and its state's init share one trace."""
    with nn.logical_axis_rules(rules):
        return GPT1(config).init(rng, jnp.zeros((1, seq_len), jnp.int32))["params"]


def _lm_logits(config: ModelConfig, params, tokens_BT):
    model = GPT1(config)
    return model.apply({"params": params}, model.apply({"params": params}, tokens_BT), method=GPT1.logits)


_lm_logits_jit = jax.jit(_lm_logits, static_argnums=0)


def lm_logits(config: ModelConfig, params, tokens) -> jax.Array:
    """LM logits [batch, time, vocab] for int tokens [batch, time]; deterministic (no dropout)."""
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise DataError(f"tokens must be an int array [batch, time], got {tokens.dtype}{list(tokens.shape)}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= config.vocab_size):
        raise DataError(f"token ids must lie in [0, {config.vocab_size}), got [{int(tokens.min())}, {int(tokens.max())}]")
    return _lm_logits_jit(config, nn.meta.unbox(params), tokens)
