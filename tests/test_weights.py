"""Checkpoint formats: HF directories both ways, OpenAI's original release, ours, and their bad-input errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

import gpt1_jax
from gpt1_jax.config import ConfigError, ModelConfig
from gpt1_jax.weights import CheckpointFormatError, HF_BLOCK_KEYS, load_pretrained, save_jax, save_pretrained

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


def test_save_pretrained_loads_in_transformers(tmp_path):
    params = random_params(SMALL)
    save_pretrained(SMALL, params, tmp_path / "hf")
    tokens = np.random.default_rng(1).integers(0, SMALL.vocab_size, (2, SMALL.n_positions))
    expected = np.asarray(gpt1_jax.lm_logits(SMALL, params, tokens))
    assert np.abs(hf_logits(tmp_path / "hf", tokens) - expected).max() <= 1e-4


def test_hf_round_trip_gives_identical_logits(tmp_path):
    """HF (written by transformers) -> load_pretrained -> save_pretrained -> HF: same logits, bit for bit."""
    write_hf_dir(tmp_path / "a", SMALL, seed=3)
    config, params = load_pretrained(tmp_path / "a")
    assert config == SMALL
    save_pretrained(config, params, tmp_path / "b")
    tokens = np.random.default_rng(2).integers(0, SMALL.vocab_size, (2, 33))
    a, b = hf_logits(tmp_path / "a", tokens), hf_logits(tmp_path / "b", tokens)
    np.testing.assert_array_equal(a, b)
    assert np.abs(np.asarray(gpt1_jax.lm_logits(config, params, tokens)) - a).max() <= 1e-4


def test_pytorch_bin_is_read(tmp_path):
    model = write_hf_dir(tmp_path / "hf", SMALL, seed=4)
    torch.save(model.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
    (tmp_path / "hf" / "model.safetensors").unlink()
    config, params = load_pretrained(tmp_path / "hf")
    tokens = np.arange(20).reshape(1, 20)
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
    assert np.abs(np.asarray(gpt1_jax.lm_logits(config, params, tokens)) - expected).max() <= 1e-4


def test_jax_format_round_trip_and_cli(tmp_path):
    params = random_params(SMALL, seed=6)
    save_jax(SMALL, params, tmp_path / "ours")
    config, again = load_pretrained(tmp_path / "ours")
    assert config == SMALL
    tokens = np.arange(30).reshape(1, 30)
    np.testing.assert_array_equal(gpt1_jax.lm_logits(SMALL, params, tokens), gpt1_jax.lm_logits(config, again, tokens))
    # the CLI, HF direction, from our own format
    done = subprocess.run(
        [sys.executable, "-m", "gpt1_jax.cli", "convert", str(tmp_path / "ours"), str(tmp_path / "hf"), "--to", "hf"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert np.abs(hf_logits(tmp_path / "hf", tokens) - np.asarray(gpt1_jax.lm_logits(SMALL, params, tokens))).max() <= 1e-4


# ---------------------------------------------------------------------------------------------------
# OpenAI's original release layout


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
    """The reference mapping, written from REFERENCE.md independently of gpt1_jax.weights."""
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


def test_original_release_loads_every_tensor_in_place(tmp_path, vocab_dir):
    shapes = scaled_shapes(vocab_dir / "params_shapes.json")
    arrays = write_original_release(tmp_path / "release", shapes)
    config, params = load_pretrained(tmp_path / "release")
    assert (config.vocab_size, config.n_positions, config.d_model, config.n_layers, config.n_heads, config.d_mlp) == (
        211, 64, 64, 3, 1, 256
    )
    # Every array of the release is found, unchanged, somewhere in our tree (no value invented or lost)...
    ours = [np.asarray(x) for x in __import__("jax").tree_util.tree_leaves(params)]
    assert sum(x.size for x in ours) == sum(a.size for a in arrays)
    # ...and at the right place: logits equal HF's model loaded through the independent mapping above.
    reference = hf_model_from_original_arrays(arrays, n_heads=config.n_heads)
    tokens = np.random.default_rng(0).integers(0, 211, (2, 64))
    with torch.no_grad():
        expected = reference(torch.tensor(tokens)).logits.numpy()
    assert np.abs(np.asarray(gpt1_jax.lm_logits(config, params, tokens)) - expected).max() <= 1e-4
    # The head count is not in the release format: an explicit config chooses it.
    four_heads = ModelConfig(vocab_size=211, n_positions=64, d_model=64, n_layers=3, n_heads=4, d_mlp=256)
    config4, params4 = load_pretrained(tmp_path / "release", config=four_heads)
    reference4 = hf_model_from_original_arrays(arrays, n_heads=4)
    with torch.no_grad():
        expected4 = reference4(torch.tensor(tokens)).logits.numpy()
    assert np.abs(np.asarray(gpt1_jax.lm_logits(config4, params4, tokens)) - expected4).max() <= 1e-4


@pytest.mark.slow
def test_full_size_original_release(tmp_path, vocab_dir):
    """The real shapes (116,534,784 values in 10 shards), converted to HF and loaded by transformers."""
    shapes = json.loads((vocab_dir / "params_shapes.json").read_text())
    arrays = write_original_release(tmp_path / "release", shapes, seed=1)
    config, params = load_pretrained(tmp_path / "release")
    assert config == ModelConfig() and config.num_params() == sum(a.size for a in arrays) == 116_534_784
    assert np.array_equal(np.asarray(params["h"]["mlp"]["c_fc"]["kernel"][7]), arrays[2 + 12 * 7 + 6][0])
    assert np.array_equal(np.asarray(params["tokens_embed"]["embedding"]), arrays[1])
    done = subprocess.run(
        [sys.executable, "-m", "gpt1_jax.cli", "convert", str(tmp_path / "release"), str(tmp_path / "hf")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    tokens = np.random.default_rng(0).integers(0, 40478, (1, 24))
    reference = hf_model_from_original_arrays(arrays, n_heads=12)
    with torch.no_grad():
        expected = reference(torch.tensor(tokens)).logits.numpy()
    assert np.abs(hf_logits(tmp_path / "hf", tokens) - expected).max() <= 1e-4


# ---------------------------------------------------------------------------------------------------
# Bad input: one clear line each


def run_convert(*args):
    return subprocess.run([sys.executable, "-m", "gpt1_jax.cli", "convert", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def small_release(tmp_path, vocab_dir):
    write_original_release(tmp_path / "release", scaled_shapes(vocab_dir / "params_shapes.json", layers=1))
    return tmp_path / "release"


def test_missing_shard(small_release, tmp_path):
    (small_release / "params_3.npy").unlink()
    with pytest.raises(CheckpointFormatError, match=r"shard params_3.npy is missing"):
        load_pretrained(small_release)
    done = run_convert(small_release, tmp_path / "out")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "params_3.npy is missing" in done.stderr
    assert not (tmp_path / "out").exists()


def test_shapes_file_that_does_not_match_the_shards(small_release):
    shapes = json.loads((small_release / "params_shapes.json").read_text())
    shapes[1][0] += 1
    (small_release / "params_shapes.json").write_text(json.dumps(shapes))
    with pytest.raises(CheckpointFormatError, match="params_shapes.json describes .* values but the shards hold"):
        load_pretrained(small_release)


def test_config_whose_sizes_do_not_match_the_weights(tmp_path, small_release):
    write_hf_dir(tmp_path / "hf", SMALL)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg["n_embd"] = 128
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"tensor 'tokens_embed.weight' has shape \(211, 64\) but the config expects \(211, 128\)"):
        load_pretrained(tmp_path / "hf")
    wrong = ModelConfig(vocab_size=211, n_positions=64, d_model=64, n_layers=2, n_heads=1, d_mlp=256)
    with pytest.raises(CheckpointFormatError, match="missing tensor 'h.1.attn.c_attn.weight'"):
        load_pretrained(small_release, config=wrong)


def test_not_a_checkpoint_and_no_overwrite(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointFormatError, match="not a GPT-1 checkpoint"):
        load_pretrained(tmp_path / "empty")
    with pytest.raises(CheckpointFormatError, match="no such checkpoint directory"):
        load_pretrained(tmp_path / "nowhere")
    params = random_params(SMALL)
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        save_pretrained(SMALL, params, out)
    assert (out / "precious.txt").read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]


def test_block_key_order_matches_the_release(vocab_dir):
    shapes = json.loads((vocab_dir / "params_shapes.json").read_text())
    assert len(shapes) == 2 + 12 * len(HF_BLOCK_KEYS)
    expected = {"attn.c_attn.weight": [1, 768, 2304], "attn.c_attn.bias": [2304], "mlp.c_fc.weight": [1, 768, 3072],
                "mlp.c_proj.weight": [1, 3072, 768]}
    for key, shape in expected.items():
        assert shapes[2 + HF_BLOCK_KEYS.index(key)] == shape
