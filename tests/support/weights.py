"""What tests/unit/test_weights.py and tests/e2e/test_weights.py share."""

import json

import numpy as np
import pytest

import gpt1_jax
from gpt1_jax.config import ModelConfig


torch = pytest.importorskip("torch", reason="needs the dev extra: pip install -e .[dev]")


transformers = pytest.importorskip("transformers", reason="needs the dev extra: pip install -e .[dev]")


SMALL = ModelConfig(vocab_size=211, n_positions=64, d_model=64, n_layers=4, n_heads=4, d_mlp=256)


def hf_logits(path, tokens):
    model = transformers.OpenAIGPTLMHeadModel.from_pretrained(path).eval()
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


def random_params(config, seed=0):
    """Random weights of every kind (LayerNorm gains included), in our tree."""
    import jax

    params = gpt1_jax.init_params(config, seed)
    leaves, tree = jax.tree_util.tree_flatten(jax.tree_util.tree_map(np.asarray, __import__("flax").linen.meta.unbox(params)))
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_unflatten(tree, [(l + 0.1 * rng.standard_normal(l.shape)).astype(np.float32) for l in leaves])


def write_hf_dir(path, config, seed=0):
    """An HF directory written by transformers itself (the reference writer)."""
    hf_config = transformers.OpenAIGPTConfig(
        vocab_size=config.vocab_size, n_positions=config.n_positions, n_embd=config.d_model,
        n_layer=config.n_layers, n_head=config.n_heads,
    )
    torch.manual_seed(seed)
    model = transformers.OpenAIGPTLMHeadModel(hf_config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return model.eval()


def scaled_shapes(shapes_file, d=64, vocab=211, ctx=64, layers=3):
    """The release's shapes (params_shapes.json), scaled down: 768 -> d, 40478 -> vocab, 512 -> ctx."""
    full = json.loads(shapes_file.read_text())
    table = {768: d, 2304: 3 * d, 3072: 4 * d, 40478: vocab, 512: ctx}
    scaled = [[table.get(n, n) for n in s] for s in full]
    return scaled[: 2 + 12 * layers]


def write_original_release(path, shapes, seed=0, n_shards=10):
    """Random arrays in the release's exact layout: one flat float32 vector cut into n_shards .npy files."""
    rng = np.random.default_rng(seed)
    arrays = [(0.1 * rng.standard_normal(s)).astype(np.float32) for s in shapes]
    for i, a in enumerate(arrays[2:]):
        if i % 12 in (4, 10):  # ln_1/g, ln_2/g: gains around 1
            a += 1.0
    path.mkdir(parents=True, exist_ok=True)
    (path / "params_shapes.json").write_text(json.dumps(shapes))
    flat = np.concatenate([a.reshape(-1) for a in arrays])
    for i, chunk in enumerate(np.array_split(flat, n_shards)):
        np.save(path / f"params_{i}.npy", chunk)
    return arrays


def hf_model_from_original_arrays(arrays, n_heads):
    """The reference mapping, written from docs/gpt1.md independently of gpt1_jax.weights."""
    n_layers = (len(arrays) - 2) // 12
    V, D = arrays[1].shape
    hf_config = transformers.OpenAIGPTConfig(
        vocab_size=V, n_positions=arrays[0].shape[0], n_embd=D, n_layer=n_layers, n_head=n_heads
    )
    model = transformers.OpenAIGPTLMHeadModel(hf_config).eval()
    names = ["attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias", "ln_1.weight",
             "ln_1.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
             "ln_2.weight", "ln_2.bias"]
    state = {"positions_embed.weight": arrays[0], "tokens_embed.weight": arrays[1]}
    for layer in range(n_layers):
        for j, name in enumerate(names):
            state[f"h.{layer}.{name}"] = np.squeeze(arrays[2 + 12 * layer + j], 0) if arrays[2 + 12 * layer + j].ndim == 3 else arrays[2 + 12 * layer + j]
    missing, unexpected = model.transformer.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
    assert not unexpected and all(k.endswith("attn.bias") for k in missing)
    return model


@pytest.fixture
def small_release(tmp_path, vocab_dir):
    write_original_release(tmp_path / "release", scaled_shapes(vocab_dir / "params_shapes.json", layers=1))
    return tmp_path / "release"
