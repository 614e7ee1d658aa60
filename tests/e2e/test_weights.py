"""Checkpoint formats: HF directories both ways, OpenAI's original release, ours, and their bad-input errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

import gpt1_jax
from gpt1_jax.config import ConfigError, ModelConfig
from gpt1_jax.weights import CheckpointFormatError, load_pretrained, save_jax, save_pretrained
from tests.support.weights import SMALL, hf_logits, hf_model_from_original_arrays, random_params, scaled_shapes, small_release, torch, transformers, write_hf_dir, write_original_release  # noqa: F401 (pytest fixtures)


def test_save_pretrained_loads_in_transformers(tmp_path):
    params = random_params(SMALL)
    save_pretrained(SMALL, params, tmp_path / "hf")
    tokens = np.random.default_rng(1).integers(0, SMALL.vocab_size, (2, SMALL.n_positions))
    expected = np.asarray(gpt1_jax.lm_logits(SMALL, params, tokens))
    assert np.abs(hf_logits(tmp_path / "hf", tokens) - expected).max() <= 1e-4


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


def run_convert(*args):
    return subprocess.run([sys.executable, "-m", "gpt1_jax.cli", "convert", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_missing_shard(small_release, tmp_path):
    (small_release / "params_3.npy").unlink()
    with pytest.raises(CheckpointFormatError, match=r"shard params_3.npy is missing"):
        load_pretrained(small_release)
    done = run_convert(small_release, tmp_path / "out")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "params_3.npy is missing" in done.stderr
    assert not (tmp_path / "out").exists()


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
    config, out, _ = gpt1_jax.weights.convert(tmp_path / "release", tmp_path / "hf", overrides=["n_heads=3"])
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


SENTENCES = ["Hello world, this is a test!", "The quick brown fox -- jumps over 42 lazy dogs.",
             "naïve café, «quotes» and <unk> _start_ markers"]


def cli(*args, **kwargs):
    env = {**__import__("os").environ, **kwargs.pop("env", {})}
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
