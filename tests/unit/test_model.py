"""The Flax model against HF transformers' PyTorch OpenAIGPT on identical random weights, and its invariants."""

import dataclasses
import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.ad_checkpoint import print_saved_residuals

import gpt1_jax
from gpt1_jax.attention import (_einsum_attention, _time_slices, causal_attention, check_runnable, query_blocks,
                                resolve_impl)
from gpt1_jax.config import ConfigError, ModelConfig, apply_overrides, model_preset
from gpt1_jax.model import GPT1, init_params
from gpt1_jax.weights import hf_state_to_params, params_to_hf_state
from tests.support.jaxprs import all_eqns

torch = pytest.importorskip("torch", reason="parity tests need the dev extra: pip install -e .[dev]")
transformers = pytest.importorskip("transformers", reason="parity tests need the dev extra: pip install -e .[dev]")

# Two shapes: a 2-layer toy and one with >= 4 layers and >= 128 positions, as the issue asks.
PARITY_CONFIGS = [
    ModelConfig(vocab_size=97, n_positions=32, d_model=48, n_layers=2, n_heads=3, d_mlp=192),
    ModelConfig(vocab_size=301, n_positions=160, d_model=128, n_layers=4, n_heads=8, d_mlp=512),
]


def random_hf_model(config: ModelConfig, seed: int, cls=None):
    """An HF model whose every weight is random and large enough to matter (LayerNorm gains too)."""
    cls = cls or transformers.OpenAIGPTLMHeadModel
    hf_config = transformers.OpenAIGPTConfig(
        vocab_size=config.vocab_size, n_positions=config.n_positions, n_embd=config.d_model,
        n_layer=config.n_layers, n_head=config.n_heads, num_labels=1,
    )
    torch.manual_seed(seed)
    model = cls(hf_config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    state = {k: v.detach().numpy().copy() for k, v in model.transformer.state_dict().items()}
    return model, state


@pytest.mark.parametrize("config", PARITY_CONFIGS, ids=["2x48", "4x128"])
@pytest.mark.parametrize("scan_layers", [True, False], ids=["scan", "loop"])
def test_lm_logits_match_hf(config, scan_layers):
    config = dataclasses.replace(config, scan_layers=scan_layers)
    model, state = random_hf_model(config, seed=1)
    params = hf_state_to_params(config, state)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (3, config.n_positions))
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
    got = np.asarray(gpt1_jax.lm_logits(config, params, tokens))
    assert got.shape == (3, config.n_positions, config.vocab_size)
    assert np.abs(expected).max() > 1.0  # the comparison is not between two near-zero arrays
    delta = np.abs(got - expected).max()
    print(f"max |dlogits| {config.n_layers}x{config.d_model} scan={scan_layers}: {delta:.3g} (max |logit| {np.abs(expected).max():.3g})")
    assert delta <= 1e-4


def test_classify_hidden_state_matches_hf_double_heads():
    """The hidden state a task head reads at the _classify_ position equals HF's double-heads model's."""
    config = PARITY_CONFIGS[1]
    model, state = random_hf_model(config, seed=2, cls=transformers.OpenAIGPTDoubleHeadsModel)
    params = hf_state_to_params(config, state)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, config.vocab_size, (2, 3, 40))  # batch, choices, time
    cls_pos = rng.integers(5, 40, (2, 3))
    with torch.no_grad():
        out = model(torch.tensor(tokens), mc_token_ids=torch.tensor(cls_pos), output_hidden_states=True)
        hf_hidden = out.hidden_states[-1].numpy()
        hf_mc = out.mc_logits.numpy()
    hidden = np.asarray(GPT1(config).apply({"params": params}, tokens.reshape(6, 40))).reshape(2, 3, 40, -1)
    assert np.abs(hidden - hf_hidden).max() <= 1e-4
    at_cls = np.take_along_axis(hidden, cls_pos[..., None, None], axis=2)[:, :, 0]
    summary = model.multiple_choice_head.summary
    w, b = summary.weight.detach().numpy(), summary.bias.detach().numpy()
    assert np.abs(at_cls @ w.T + b - hf_mc[..., None]).max() <= 1e-4


def test_param_count_of_the_release():
    config = model_preset("gpt1")
    shapes = jax.eval_shape(lambda: init_params(config, 0))
    n = sum(int(np.prod(x.value.shape)) for x in jax.tree_util.tree_leaves(shapes, is_leaf=lambda x: isinstance(x, nn.Partitioned)))
    assert n == config.num_params() == 116_534_784


def test_every_parameter_has_logical_axes():
    params = init_params(model_preset("tiny"), 0)
    leaves = jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert leaves and all(isinstance(x, nn.Partitioned) and len(x.names) == x.value.ndim for x in leaves)


def test_init_is_traced_once_per_config_and_rules_and_seeds_still_differ(monkeypatch):
    """A notebook's or a sweep's second init_params of one config took as long as the first (2.7 CPU-s on `tiny`,
    a fresh trace and compile each time), and a run traced its model's init three times; the rules in force are
    part of the key, as they change the trace. The same seed gives the same parameters, however they are split."""
    from gpt1_jax.config import MeshConfig, OptimConfig
    from gpt1_jax.step import check_mesh_divides, lm_trainer

    traces = []  # the model's init runs in Python once a trace
    monkeypatch.setattr(GPT1, "init", lambda self, *args, **kw: traces.append(1) or nn.Module.init(self, *args, **kw))
    config = dataclasses.replace(model_preset("tiny"), n_layers=1)  # a config no other test of this process traces
    a, b = nn.meta.unbox(init_params(config, 0)), nn.meta.unbox(init_params(config, 1))
    assert len(traces) == 1
    assert not np.array_equal(a["tokens_embed"]["embedding"], b["tokens_embed"]["embedding"])
    with nn.logical_axis_rules((("batch", "data"),)):
        c = nn.meta.unbox(init_params(config, 0))
    assert len(traces) == 2
    jax.tree.map(np.testing.assert_array_equal, a, c)
    # a run's shape check, its Trainer and its state's init (over 8 devices, FSDP): one trace, under its rules
    mesh = MeshConfig(data=4, fsdp=2)
    check_mesh_divides(config, mesh, {"data": 4, "fsdp": 2, "tensor": 1})
    state = lm_trainer(config, OptimConfig(), mesh).init(0)
    assert len(traces) == 3
    jax.tree.map(np.testing.assert_array_equal, a, jax.device_get(state.params))


def test_init_statistics_and_structure():
    config = model_preset("tiny")
    p = nn.meta.unbox(init_params(config, 3))
    emb = np.asarray(p["tokens_embed"]["embedding"])
    assert abs(emb.std() - 0.02) < 0.002 and np.abs(emb).max() > 2.5 * 0.02  # plain, not truncated, normal
    assert sorted(k for k in p if k.startswith("h")) == ["h_0", "h_1"]  # unrolled blocks by default
    assert np.all(np.asarray(p["h_1"]["ln_1"]["scale"]) == 1) and np.all(np.asarray(p["h_1"]["attn"]["c_attn"]["bias"]) == 0)
    assert p["h_0"]["attn"]["c_attn"]["kernel"].shape == (64, 3, 4, 16)
    scanned = nn.meta.unbox(init_params(dataclasses.replace(config, scan_layers=True), 3))
    assert scanned["h"]["attn"]["c_attn"]["kernel"].shape == (2, 64, 3, 4, 16)


def test_causality_and_dropout():
    config = model_preset("tiny")
    params = init_params(config, 0)
    model = GPT1(config)
    a = jnp.array([[1, 2, 3, 4, 5, 6]])
    b = a.at[0, 4:].set(9)
    ha, hb = model.apply({"params": params}, a), model.apply({"params": params}, b)
    np.testing.assert_array_equal(ha[:, :4], hb[:, :4])  # the future never leaks into the past
    assert not np.allclose(ha[:, 4:], hb[:, 4:])
    d1 = model.apply({"params": params}, a, deterministic=False, rngs={"dropout": jax.random.key(1)})
    d2 = model.apply({"params": params}, a, deterministic=False, rngs={"dropout": jax.random.key(2)})
    assert not np.allclose(d1, d2) and not np.allclose(d1, ha)


def test_bf16_compute_close_to_fp32():
    config = model_preset("tiny")
    params = init_params(config, 0)
    tokens = np.arange(32).reshape(2, 16)
    ref = gpt1_jax.lm_logits(config, params, tokens)
    low = gpt1_jax.lm_logits(dataclasses.replace(config, dtype="bfloat16"), params, tokens)
    assert low.dtype == jnp.float32
    assert np.abs(np.asarray(low) - np.asarray(ref)).max() < 0.05


def test_attention_implementation_choice():
    """auto takes cuDNN's flash kernel only where it runs: a GPU, bf16/fp16 queries, no attention dropout.
    cuDNN refuses float32 (the first float32 117M step on an H100 died in init: experiments/bench/README.md)."""
    assert resolve_impl("auto", False, jnp.bfloat16, backend="gpu") == "cudnn"
    assert resolve_impl("auto", False, jnp.float16, backend="gpu") == "cudnn"
    assert resolve_impl("auto", False, jnp.float32, backend="gpu") == "xla"
    assert resolve_impl("auto", True, jnp.bfloat16, backend="gpu") == "xla"
    assert resolve_impl("auto", False, jnp.bfloat16, backend="cpu") == "xla_blocked"
    assert resolve_impl("auto", True, jnp.float32) == "xla_blocked"  # this machine: a CPU
    assert resolve_impl("auto", True, jnp.bfloat16, backend="tpu") == "xla"
    with pytest.raises(ConfigError, match="'cudnn' needs bf16 or fp16 compute, got float32"):
        resolve_impl("cudnn", False, jnp.float32, backend="gpu")
    with pytest.raises(ConfigError, match="has no attention dropout"):
        resolve_impl("dot_product", True, jnp.float32)
    with pytest.raises(ConfigError, match="model.attention='cudnn' needs model.dtype=bfloat16"):
        dataclasses.replace(model_preset("tiny"), attention="cudnn", dtype="float32")
    assert dataclasses.replace(model_preset("tiny"), attention="cudnn", dtype="bfloat16").attention == "cudnn"
    # head dims cuDNN refuses (jax: a multiple of 8, at most 128 before Hopper) stay on the einsum core
    assert resolve_impl("auto", False, jnp.bfloat16, backend="gpu", head_dim=25) == "xla"
    assert resolve_impl("auto", False, jnp.bfloat16, backend="gpu", head_dim=256) == "xla"
    with pytest.raises(ConfigError, match="head dim that is a multiple of 8 up to 128, got 25"):
        resolve_impl("cudnn", False, jnp.bfloat16, backend="gpu", head_dim=25)
    # what a training verb checks before it writes anything
    check_runnable("cudnn", 0.0, True, 64, backend="gpu")
    check_runnable("cudnn", 0.1, False, 64, backend="gpu")  # evaluation: no dropout to apply
    with pytest.raises(ConfigError, match="'cudnn' needs an NVIDIA GPU, and this run's devices are cpu"):
        check_runnable("cudnn", 0.0, False, 64, backend="cpu")
    with pytest.raises(ConfigError, match="has no attention dropout"):
        check_runnable("cudnn", 0.1, True, 64, backend="gpu")
    with pytest.raises(ConfigError, match="got 12"):
        check_runnable("cudnn", 0.0, True, 12, backend="gpu")
    check_runnable("xla", 0.1, True, 12)


def test_dot_product_attention_matches_the_einsum_core():
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 9, 3, 8)) for i in range(3))
    ref = causal_attention(q, k, v, impl="xla")
    np.testing.assert_allclose(causal_attention(q, k, v, impl="dot_product"), ref, rtol=1e-5, atol=1e-5)
    # the first query sees only the first key: its output is that key's value
    np.testing.assert_allclose(ref[:, 0], v[:, 0], rtol=1e-6, atol=1e-6)


def test_query_blocked_attention_matches_float64_and_the_unblocked_gradients():
    """At 520 positions the blocked einsum core runs 4 query blocks of 130 (each over the keys up to its end):
    outputs as float64 NumPy's causal softmax attention, gradients as the one-block core's."""
    B, T, H, K = 1, 520, 2, 8
    assert [query_blocks(t) for t in (64, 128, 255, 256, 511, 520, 4096)] == [1, 1, 1, 2, 3, 4, 4]
    q, k, v = (jax.random.normal(jax.random.key(i), (B, T, H, K)) for i in range(3))
    q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
    scores = np.einsum("bthk,bshk->bhts", q64, k64) / np.sqrt(K)
    scores = np.where(np.tri(T, dtype=bool), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    expected = np.einsum("bhts,bshk->bthk", probs / probs.sum(-1, keepdims=True), v64)
    blocked_core = functools.partial(causal_attention, impl="xla_blocked")
    # no array of all T x S scores: the masked triangle above the blocks is never computed
    assert ",520,520]" not in str(jax.make_jaxpr(blocked_core)(q, k, v))
    assert ",520,520]" in str(jax.make_jaxpr(functools.partial(causal_attention, impl="xla"))(q, k, v))
    np.testing.assert_allclose(blocked_core(q, k, v), expected, rtol=1e-5, atol=1e-5)

    def loss(core, q, k, v):
        return jnp.sum(jnp.sin(core(q, k, v)))
    blocked = jax.jit(jax.grad(functools.partial(loss, blocked_core), argnums=(0, 1, 2)))(q, k, v)
    one_block = functools.partial(_einsum_attention, dropout_rate=0.0, dropout_rng=None, query_offset=None)
    for a, b in zip(blocked, jax.jit(jax.grad(functools.partial(loss, one_block), argnums=(0, 1, 2)))(q, k, v)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("bounds", [((0, 130), (0, 260), (0, 390), (0, 520)),  # a block's keys
                                    ((0, 130), (130, 260), (260, 390), (390, 520)),  # the query blocks
                                    ((0, 2), (3, 7), (1, 5))])  # a gap, overlaps out of order
def test_time_slices_give_autodiffs_gradients_bit_for_bit_with_no_pad(bounds, dtype):
    """The blocked core's slices along time sum their gradients span by span: the same bits as autodiff's padded
    sum (jitted: as the step computes them), and no pad in the compiled backward pass."""
    T = bounds[-1][1] if bounds[-1][1] > 100 else 8
    x = jax.random.normal(jax.random.key(0), (2, T, 3, 4)).astype(dtype)
    cotangents = tuple(jax.random.normal(jax.random.key(i + 1), (2, end - start, 3, 4)).astype(dtype)
                       for i, (start, end) in enumerate(bounds))

    def gradient(slices):
        return jax.jit(lambda x, g: jax.vjp(slices, x)[1](g)[0])
    ours = gradient(lambda x: _time_slices(x, bounds))
    autodiff = gradient(lambda x: tuple(x[:, start:end] for start, end in bounds))
    got, want = (np.asarray(f(x, cotangents).astype(jnp.float32)) for f in (ours, autodiff))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert " pad(" not in ours.lower(x, cotangents).compile().as_text()
    assert " pad(" in autodiff.lower(x, cotangents).compile().as_text()


def test_query_blocks_each_draw_their_own_dropout_mask():
    """With v the identity over 260 keys (2 query blocks), the output rows are the attention probabilities
    after dropout: causal in both blocks, dropped at the asked rate, kept ones scaled by 1 / (1 - rate), and
    the two blocks' masks are not one mask repeated."""
    T, rate = 260, 0.25
    q, k = (jax.random.normal(jax.random.key(i), (1, T, 1, 16)) for i in range(2))
    v = jnp.eye(T)[None, :, None, :]
    kept = causal_attention(q, k, v, impl="xla_blocked", dropout_rate=rate, dropout_rng=jax.random.key(3))
    kept, plain = (np.asarray(out)[0, :, 0] for out in (kept, causal_attention(q, k, v, impl="xla_blocked")))
    lower = np.tri(T, dtype=bool)
    assert not kept[~lower].any() and not plain[~lower].any()
    dropped = (kept == 0) & lower
    assert abs(dropped.sum() / lower.sum() - rate) < 0.01
    np.testing.assert_allclose(kept[~dropped & lower], plain[~dropped & lower] / (1 - rate), rtol=1e-5)
    first, second = dropped[:130, :130], dropped[130:, :130]
    assert (first[np.tri(130, dtype=bool)] != second[np.tri(130, dtype=bool)]).mean() > 0.2


def test_attention_recompute_keeps_gradients_and_drops_the_saved_scores(capsys):
    """model.remat=attention: the backward pass recomputes the attention core (its dropout mask from the same
    key), so gradients are those of the plain core, and nothing of size T x S is kept for it: the plain core
    keeps five such arrays (the causal mask, the masked scores, their exponentials, the dropout mask and the
    dropped probabilities; six before float32 dropout took its own backward pass, which keeps only the mask).
    The memory this saves shows on the TPU compiler (docs/scale.md); XLA:CPU's temporary size does not move with
    any remat policy."""
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 64, 4, 16)) for i in range(3))
    key = jax.random.key(7)

    def loss(q, k, v, recompute):
        out = causal_attention(q, k, v, dropout_rate=0.1, dropout_rng=key, recompute=recompute)
        return jnp.sum(out * jnp.cos(out))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    for a, b in zip(grad(q, k, v, True), grad(q, k, v, False)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    for recompute, scores_kept in ((False, 5), (True, 0)):
        print_saved_residuals(functools.partial(loss, recompute=recompute), q, k, v)
        assert capsys.readouterr().out.count("[2,4,64,64]") == scores_kept


def test_remat_dots_keeps_the_layers_products_in_bf16_as_in_fp32():
    """bf16 products run through mixed_einsum, a custom_vjp whose dot the `dots` policy cannot see: in bf16,
    model.remat=dots compiled to `full`'s program (the same peak memory and FLOPs on the TPU compiler). It keeps
    the same products as in fp32 now, each in bf16 (what the next op reads: half an fp32 product's bytes)."""
    from jax._src.ad_checkpoint import saved_residuals  # jax.ad_checkpoint exports only the printing twin

    tokens = np.arange(16).reshape(2, 8)
    kept = {}
    for dtype in ("float32", "bfloat16"):
        for remat in ("dots", "full"):
            config = dataclasses.replace(model_preset("tiny"), dtype=dtype, remat=remat, embd_dropout=0.0,
                                         attn_dropout=0.0, resid_dropout=0.0)
            params = nn.meta.unbox(init_params(config, 0))
            forward = lambda p: GPT1(config).apply({"params": p}, tokens).astype(jnp.float32).sum()  # noqa: E731
            kept[dtype, remat] = [(a.shape, str(a.dtype)) for a, why in saved_residuals(forward, params)
                                  if not why.startswith("from the argument")]
    assert [s for s, _ in kept["bfloat16", "dots"]] == [s for s, _ in kept["float32", "dots"]]
    assert len(kept["bfloat16", "dots"]) > len(kept["bfloat16", "full"]) == len(kept["float32", "full"])
    assert {d for s, d in kept["bfloat16", "dots"] if d != "int32"} == {"bfloat16"}  # int32: the token ids


def test_bad_inputs_raise_clear_errors():
    config = model_preset("tiny")
    params = init_params(config, 0)
    with pytest.raises(ValueError, match="longer than the model's n_positions=64"):
        gpt1_jax.lm_logits(config, params, np.zeros((1, 65), int))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 512\)"):
        gpt1_jax.lm_logits(config, params, np.full((1, 4), 512))
    with pytest.raises(ValueError, match="int array"):
        gpt1_jax.lm_logits(config, params, np.zeros((4,), int))
    with pytest.raises(ConfigError, match="not divisible"):
        ModelConfig(d_model=10, n_heads=3)
    with pytest.raises(ConfigError, match="unknown config key 'nope'"):
        apply_overrides(config, ["nope=1"])
    assert apply_overrides(config, ["d_model=128", "init_std=1e-3"]).init_std == 1e-3


def test_hf_state_round_trip_is_exact():
    config = model_preset("tiny")
    params = nn.meta.unbox(init_params(config, 5))
    again = hf_state_to_params(config, params_to_hf_state(config, params))
    jax.tree_util.tree_map(np.testing.assert_array_equal, again, params)


@pytest.mark.parametrize("spec", ["btd,dqhk->btqhk", "bthk,hkd->btd", "btd,vd->btv",
                                  "bthk,bshk->bhts", "bhts,bshk->bthk"])  # the attention core's two
def test_mixed_einsum_gradients_match_fp32(spec):
    """Run, not only traced: XLA:CPU refuses some bf16 x bf16 -> fp32 products at run time (`products`)."""
    from gpt1_jax.products import mixed_einsum

    x_axes, w_axes = spec.split("->")[0].split(",")
    sizes = dict(b=2, t=12, s=16, d=8, q=3, h=2, k=16, v=11)  # big enough for the kernels XLA:CPU uses at scale
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=[sizes[a] for a in x_axes]), jnp.float32)
    w = jnp.asarray(rng.normal(size=[sizes[a] for a in w_axes]), jnp.float32)
    probe = jnp.asarray(rng.normal(size=jnp.einsum(spec, x, w).shape), jnp.float32)
    f_ref = lambda x, w: jnp.sum(jnp.einsum(spec, x, w) * probe)
    f_mix = lambda x, w: jnp.sum(mixed_einsum(spec, x, w, jnp.bfloat16) * probe)
    (gx, gw), (rx, rw) = jax.grad(f_mix, argnums=(0, 1))(x, w), jax.grad(f_ref, argnums=(0, 1))(x, w)
    assert gx.dtype == gw.dtype == jnp.float32
    for got, ref in ((gx, rx), (gw, rw)):
        assert float(jnp.linalg.norm(got - ref) / jnp.linalg.norm(ref)) < 1e-2  # bf16 inputs: ~3 digits


@pytest.mark.parametrize("spec, x_shape, w_shape", [("btd,dqhk->btqhk", (2, 5, 6), (6, 3, 2, 4)),
                                                    ("bthk,hkd->btd", (2, 5, 2, 4), (2, 4, 6)),
                                                    ("btd,df->btf", (2, 5, 6), (6, 7))])  # the MLP's c_fc
def test_fp32_kernel_gradients_come_in_the_kernels_own_order(spec, x_shape, w_shape):
    """Autodiff computes a kernel's gradient in another order and transposes it, which XLA:CPU folded into every
    reader of the attention kernels' gradients (the norm, both Adam moments) and ran c_fc's on Eigen; model.Linear's
    fp32 path gives the same values as x^T·g, with no transpose."""
    from gpt1_jax.products import mixed_einsum

    x, w = jax.random.normal(jax.random.key(0), x_shape), jax.random.normal(jax.random.key(1), w_shape)
    probe = jax.random.normal(jax.random.key(2), jnp.einsum(spec, x, w).shape)
    plain = jax.grad(lambda x, w: jnp.sum(jnp.einsum(spec, x, w) * probe), argnums=(0, 1))
    ordered = jax.grad(lambda x, w: jnp.sum(mixed_einsum(spec, x, w, jnp.dtype(jnp.float32)) * probe), argnums=(0, 1))
    for got, want in zip(ordered(x, w), plain(x, w)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert "transpose" in str(jax.make_jaxpr(lambda w: plain(x, w)[1])(w))
    assert "transpose" not in str(jax.make_jaxpr(lambda w: ordered(x, w)[1])(w))


def test_mixed_products_contract_their_axes_in_the_operands_order():
    """jnp.einsum contracts `btqhk,dqhk->btd` (the qkv projection's input gradient) over h, k, q, by letter, and
    XLA:CPU copies both operands into that order first; `products._einsum` keeps q, h, k, the same sums up to
    their order, and leaves specs already in order to jnp.einsum itself (the attention's kernels need that)."""
    from gpt1_jax.products import _einsum

    g = jax.random.normal(jax.random.key(0), (2, 5, 3, 2, 4))
    w = jax.random.normal(jax.random.key(1), (6, 3, 2, 4))
    jaxpr = str(jax.make_jaxpr(lambda g, w: _einsum("btqhk,dqhk->btd", g, w))(g, w))
    assert "(([2, 3, 4], [1, 2, 3]), ([], []))" in jaxpr.replace("\n", " ").replace("  ", " ")
    np.testing.assert_allclose(_einsum("btqhk,dqhk->btd", g, w), jnp.einsum("btqhk,dqhk->btd", g, w), rtol=1e-5,
                               atol=1e-5)
    h, table = jax.random.normal(jax.random.key(2), (2, 5, 4)), jax.random.normal(jax.random.key(3), (7, 4))
    np.testing.assert_array_equal(_einsum("...d,vd->...v", h, table),
                                  jnp.einsum("...d,vd->...v", h, table, preferred_element_type=jnp.float32))
    q, k = (jax.random.normal(jax.random.key(i), (2, 5, 3, 4)) for i in (4, 5))
    assert str(jax.make_jaxpr(lambda q, k: _einsum("bthk,bshk->bhts", q, k))(q, k)) == str(
        jax.make_jaxpr(lambda q, k: jnp.einsum("bthk,bshk->bhts", q, k, preferred_element_type=jnp.float32))(q, k))


def _bf16_tiny_loss():
    config = dataclasses.replace(model_preset("tiny"), dtype="bfloat16")
    params = nn.meta.unbox(init_params(config, 0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (2, 17)), jnp.int32)

    def loss(params):
        model = GPT1(config)
        h = model.apply({"params": params}, tokens[:, :-1], deterministic=False, rngs={"dropout": jax.random.key(0)})
        logits = model.apply({"params": params}, h, method=GPT1.logits)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    return config, loss, params


def test_bf16_compute_keeps_no_fp32_mlp_activations_for_the_backward_pass(capsys):
    """GELU runs in fp32, but its backward pass recomputes it from the bf16 input: the gradient kept five fp32
    [B, T, F] intermediates per layer (the converted input, tanh, products), 26.7 instead of 21.9 GB per chip
    for 6.7B on v6e-256 (experiments/scale/README.md)."""
    config, loss, params = _bf16_tiny_loss()
    print_saved_residuals(loss, params)
    hidden = re.findall(rf"(\w+)\[\d+,\d+,{config.d_mlp}\]", capsys.readouterr().out)
    assert hidden and set(hidden) == {"bf16"}, hidden


def test_bf16_compute_multiplies_bf16_into_fp32_everywhere_on_cpu():
    """XLA:CPU runs a bf16 x bf16 -> bf16 dot on a slow path: the attention core's two products were such dots
    (forward and backward), at about half the rate of the same dot with an fp32 result (experiments/bench/
    README.md, 2026-11-29). In the bf16 loss's gradient every product takes bf16 and gives fp32."""
    _, loss, params = _bf16_tiny_loss()
    dots = [eqn for eqn in all_eqns(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
            if eqn.primitive.name == "dot_general"]
    kinds = {(tuple(str(v.aval.dtype) for v in eqn.invars), str(eqn.outvars[0].aval.dtype)) for eqn in dots}
    assert len(dots) >= 8 and kinds == {(("bfloat16", "bfloat16"), "float32")}, kinds


def test_bf16_compute_keeps_bias_gradients_and_gelu_in_fp32():
    """XLA:CPU has no bf16 arithmetic: it converts around every bf16 elementwise op, and a sum over a bf16
    gradient (a bias's) becomes a converted tree reduction (reduce-window), which cost the bf16 `small`
    step ~20% (experiments/bench/README.md). In bf16 compute the bias is added in fp32, and GELU
    runs in fp32: the loss gradient's jaxpr has no bf16 tanh and no bf16 sum of a bias's shape."""
    config, loss, params = _bf16_tiny_loss()
    text = str(jax.make_jaxpr(jax.grad(loss))(params))
    assert not re.search(r"bf16\[[^\]]*\] = tanh", text)
    bias_shapes = {",".join(map(str, b.shape)) for path, b in jax.tree_util.tree_leaves_with_path(params)
                   if path[-1].key == "bias" and b.ndim}
    bf16_sums = set(re.findall(r"bf16\[([^\]]*)\] = reduce_sum", text))
    assert bias_shapes and not bf16_sums & bias_shapes, bf16_sums & bias_shapes
