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
    assert np.array_equal(np.asarray(params["h_7"]["mlp"]["c_fc"]["kernel"]), arrays[2 + 12 * 7 + 6][0])
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


def test_truncated_safetensors_is_one_line(tmp_path):
    write_hf_dir(tmp_path / "hf", SMALL)
    weights = tmp_path / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointFormatError, match="model.safetensors is unreadable"):
        load_pretrained(tmp_path / "hf")
    done = run_convert(tmp_path / "hf", tmp_path / "out")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "model.safetensors is unreadable" in done.stderr.splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_release_whose_head_size_is_not_64(tmp_path, vocab_dir):
    """d_model=96 is no multiple of 64: the head count has to be given, and then it converts."""
    shapes = scaled_shapes(vocab_dir / "params_shapes.json", d=96, layers=1)
    arrays = write_original_release(tmp_path / "release", shapes)
    with pytest.raises(ConfigError, match="not a multiple of GPT-1's head size 64"):
        load_pretrained(tmp_path / "release")
    config, out = gpt1_jax.weights.convert(tmp_path / "release", tmp_path / "hf", overrides=["n_heads=3"])
    assert config.n_heads == 3 and config.d_model == 96
    tokens = np.random.default_rng(0).integers(0, 211, (1, 40))
    with torch.no_grad():
        expected = hf_model_from_original_arrays(arrays, n_heads=3)(torch.tensor(tokens)).logits.numpy()
    assert np.abs(hf_logits(out, tokens) - expected).max() <= 1e-4
    # The CLI spelling; formats that record their architecture take run-time fields only.
    done = run_convert(tmp_path / "release", tmp_path / "hf2", "--n-heads", "3", "--to", "jax")
    assert done.returncode == 0, done.stderr
    assert load_pretrained(tmp_path / "hf2")[0].n_heads == 3
    with pytest.raises(ConfigError, match="only run-time fields"):
        load_pretrained(out, overrides=["n_heads=6"])
    assert load_pretrained(out, overrides=["scan_layers=false"])[0].scan_layers is False


# ---------------------------------------------------------------------------------------------------
# Run workdirs: pre-training (made by the CLI) and fine-tuning (written in its layout here)

SENTENCES = ["Hello world, this is a test!", "The quick brown fox -- jumps over 42 lazy dogs.",
             "naïve café, «quotes» and <unk> _start_ markers"]


def cli(*args, **kwargs):
    env = {**__import__("os").environ, "XLA_FLAGS": "", **kwargs.pop("env", {})}  # one device: fast start-up
    return subprocess.run([sys.executable, "-m", "gpt1_jax.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env, **kwargs)


@pytest.fixture(scope="module")
def pretrain_run(tmp_path_factory):
    """A real 4-step tiny pre-training run with schedule-free AdamW (checkpoints at steps 2 and 4)."""
    root = tmp_path_factory.mktemp("run")
    done = cli("pretrain", "--workdir", root / "run", "--config", "tiny", "--steps", 4, "--set", "checkpoint_every=2",
               "--set", "eval_every=0", "--set", "optim.name=schedule_free_adamw",
               env={"XDG_CACHE_HOME": str(root / "cache")})
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "run"


def test_pretrain_run_loads_at_the_schedule_free_x(pretrain_run):
    """A schedule-free run is exported at x = (y - (1 - b1) z) / b1, not at the gradient point y."""
    import jax
    import orbax.checkpoint as ocp

    config, params = load_pretrained(pretrain_run)
    assert config.vocab_size == gpt1_jax.GPT1Tokenizer.load(pretrain_run / "tokenizer.json").vocab_size
    with ocp.StandardCheckpointer() as ckptr:
        raw = ckptr.restore((pretrain_run / "checkpoints" / "4" / "state").absolute())
    sf = next(s for s in raw["opt_state"] if isinstance(s, dict) and "z" in s)
    x = jax.tree.map(lambda y, z: (y - (1 - sf["b1"]) * z) / sf["b1"], raw["params"], sf["z"])
    tokens = np.arange(1, 30).reshape(1, 29)
    got = np.asarray(gpt1_jax.lm_logits(config, params, tokens))
    np.testing.assert_allclose(got, np.asarray(gpt1_jax.lm_logits(config, x, tokens)), atol=1e-5)
    assert np.abs(got - np.asarray(gpt1_jax.lm_logits(config, raw["params"], tokens))).max() > 1e-3  # x != y
    # Steps: the latest by default, any kept one by number, one clear line for another.
    assert not np.array_equal(np.asarray(gpt1_jax.lm_logits(config, load_pretrained(pretrain_run, step=2)[1], tokens)), got)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 3 \(have 2, 4\)"):
        load_pretrained(pretrain_run, step=3)


def test_pretrain_run_converts_to_hf_with_its_tokenizer(pretrain_run, tmp_path):
    config, params = load_pretrained(pretrain_run)
    done = cli("convert", pretrain_run, tmp_path / "hf")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "with its tokenizer" in done.stdout
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (2, config.n_positions))
    assert np.abs(hf_logits(tmp_path / "hf", tokens) - np.asarray(gpt1_jax.lm_logits(config, params, tokens))).max() <= 1e-4
    # transformers reads the tokenizer, from tokenizer.json and from vocab.json + merges.txt alone, with our ids.
    ours = gpt1_jax.GPT1Tokenizer.load(pretrain_run / "tokenizer.json")
    (tmp_path / "bpe_only").mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        (tmp_path / "bpe_only" / name).write_bytes((tmp_path / "hf" / name).read_bytes())
    for folder in (tmp_path / "hf", tmp_path / "bpe_only"):
        theirs = transformers.AutoTokenizer.from_pretrained(folder)
        assert [theirs(s, add_special_tokens=False)["input_ids"] for s in SENTENCES] == ours.encode_batch(SENTENCES)
    again = gpt1_jax.GPT1Tokenizer.from_path(tmp_path / "hf")
    assert again.vocab_size == ours.vocab_size and again.encode_batch(SENTENCES) == ours.encode_batch(SENTENCES)
    # --to jax keeps the tokenizer file as it was.
    gpt1_jax.weights.convert(pretrain_run, tmp_path / "ours", to="jax")
    assert (tmp_path / "ours" / "tokenizer.json").read_text() == (pretrain_run / "tokenizer.json").read_text()
    np.testing.assert_array_equal(gpt1_jax.lm_logits(config, load_pretrained(tmp_path / "ours")[1], tokens),
                                  gpt1_jax.lm_logits(config, params, tokens))


def test_sample_from_a_run_and_a_tokenizer_of_another_model(pretrain_run, vocab_dir):
    done = cli("sample", "--workdir", pretrain_run, "--prompt", "the", "--max-new-tokens", 4, "--num-samples", 1,
               "--step", 2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0].startswith(f"# {pretrain_run} step 2")
    done = cli("sample", "--workdir", pretrain_run, "--tokenizer", vocab_dir)  # OpenAI's format, another size
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-3000:]
    n = len(json.loads((vocab_dir / "encoder_bpe_40000.json").read_text(encoding="utf-8")))
    assert f"the tokenizer has {n} tokens + 3 markers but the model's embedding table has 512 rows" in done.stderr


@pytest.mark.parametrize("optimizer", ["adamw", "schedule_free_adamw"])
def test_finetune_run_gives_its_transformer(tmp_path, optimizer):
    """The fine-tuning layout: state.params = {"transformer", "head"}; the transformer comes back, at x
    for schedule-free, and in the layout the caller runs (here unscanned from a scanned save)."""
    import dataclasses

    import jax

    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import FinetuneConfig, OptimConfig, model_preset, save_yaml
    from gpt1_jax.optim import eval_params, make_optimizer

    model = dataclasses.replace(model_preset("tiny"), scan_layers=True)
    config = FinetuneConfig(task="sst2", model=model, optim=OptimConfig(name=optimizer, schedule="constant"))
    save_yaml(config, tmp_path / "config.yaml")
    params = {"transformer": random_params(model, seed=1), "head": {"kernel": np.ones((model.d_model, 2), np.float32)}}
    tx = make_optimizer(config.optim, params)
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda p: np.full(p.shape, 0.3, np.float32), params)
    for _ in range(2):  # two steps, so that a schedule-free x differs from y
        updates, opt_state = tx.update(grads, opt_state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
    ckpt = Checkpointer(tmp_path / "checkpoints", async_save=False)
    ckpt.save(7, {"step": np.int32(7), "params": params, "opt_state": opt_state}, {}, model)
    ckpt.close()

    got_config, got = load_pretrained(tmp_path, dataclasses.replace(model, scan_layers=False, dtype="bfloat16"))
    assert got_config == dataclasses.replace(model, scan_layers=False, dtype="bfloat16") and "h_1" in got
    expected = eval_params(opt_state, params)["transformer"]
    tokens = np.arange(1, 20).reshape(1, 19)
    np.testing.assert_allclose(np.asarray(gpt1_jax.lm_logits(dataclasses.replace(got_config, dtype="float32"), got, tokens)),
                               np.asarray(gpt1_jax.lm_logits(model, expected, tokens)), atol=1e-5)
    # A config.yaml that does not describe the checkpoint beside it is one error, not a shape crash later.
    save_yaml(dataclasses.replace(config, model=dataclasses.replace(model, n_layers=3)), tmp_path / "config.yaml")
    with pytest.raises(CheckpointFormatError, match=r"has shape \(2, .* but the saved config expects \(3, "):
        load_pretrained(tmp_path)
    save_yaml(dataclasses.replace(config, model=dataclasses.replace(model, scan_layers=False)), tmp_path / "config.yaml")
    with pytest.raises(CheckpointFormatError, match=r"parameter \['h'\]\S+ \(2, .*\) is not in the saved config's model"):
        load_pretrained(tmp_path)
