"""Checkpoint formats: HF directories both ways, OpenAI's original release, ours, and their bad-input errors."""

import json

import numpy as np
import pytest

import gpt1_jax
from gpt1_jax.config import ConfigError, ModelConfig
from gpt1_jax.weights import CheckpointFormatError, HF_BLOCK_KEYS, load_pretrained, save_pretrained
from tests.support.weights import SMALL, hf_logits, hf_model_from_original_arrays, random_params, scaled_shapes, small_release, torch, write_hf_dir, write_original_release  # noqa: F401 (pytest fixtures)


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


def test_weights_that_are_not_finite_are_refused_naming_the_array(tmp_path, vocab_dir):
    """A diverged run's NaN weights went on into sample (<unk> only), evaluate (a NaN loss), convert and fine-tuning
    (stopped at step 1, asking for a lower lr); OpenAI's format was not checked at all."""
    import jax

    params = jax.tree.map(np.asarray, random_params(SMALL))
    params["h_1"]["mlp"]["c_fc"]["kernel"][3, 5] = np.nan
    save_pretrained(SMALL, params, tmp_path / "hf")
    with pytest.raises(CheckpointFormatError, match=r"hf: h_1/mlp/c_fc/kernel holds NaN or inf weights: damaged, or "
                                                    r"converted from a run that had diverged; convert an earlier"):
        load_pretrained(tmp_path / "hf")
    write_original_release(tmp_path / "release", scaled_shapes(vocab_dir / "params_shapes.json", layers=1))
    shard = np.load(tmp_path / "release" / "params_0.npy")
    shard[-1] = np.inf  # in the token embedding, after the 64 x 64 position table
    np.save(tmp_path / "release" / "params_0.npy", shard)
    with pytest.raises(CheckpointFormatError, match=r"release: tokens_embed/embedding holds NaN or inf "
                                                    r"weights: the release's files are damaged; fetch them again"):
        load_pretrained(tmp_path / "release")


def test_an_hf_folder_with_an_untied_head_is_refused(tmp_path):
    """transformers saves OpenAIGPTLMHeadModel(tie_word_embeddings=False) with a head of its own: it was dropped
    without a word (HF's loss 6.525, ours 6.454 on the same folder) and `convert` wrote the folder back tied."""
    transformers = pytest.importorskip("transformers")
    config = transformers.OpenAIGPTConfig(vocab_size=96, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    transformers.OpenAIGPTLMHeadModel(config).save_pretrained(tmp_path / "tied")
    load_pretrained(tmp_path / "tied")
    untied = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(**{**config.to_dict(), "tie_word_embeddings": False}))
    with torch.no_grad():
        untied.lm_head.weight.add_(1.0)
    untied.save_pretrained(tmp_path / "untied")
    with pytest.raises(CheckpointFormatError, match=r"untied: its LM head \(lm_head.weight\) is not the token embedding"):
        load_pretrained(tmp_path / "untied")


def test_a_checkpoint_folder_of_a_run_names_the_run_and_its_step(tmp_path):
    """`convert RUN/checkpoints/30 DST` said only "not a GPT-1 checkpoint"."""
    (tmp_path / "run" / "checkpoints" / "30").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("steps: 30\n")
    with pytest.raises(CheckpointFormatError, match=r"30 is one checkpoint of the run .*run: give the run and the step "
                                                    r"\(--init .*run --step 30; `convert .*run DST --step 30`\)"):
        load_pretrained(tmp_path / "run" / "checkpoints" / "30")


def test_a_reader_that_lost_the_older_of_two_checkpoints_reads_again(tmp_path, monkeypatch):
    """keep_checkpoints=1: a run finished checkpoint 10 and then deleted 9 while a reader's orbax listing held both;
    its stat of 9 failed, and since the newest (10) had not changed the reader gave up with orbax's traceback (CI,
    tests/e2e/test_pretrain.py). Any change in the listing means the run moved on: read again."""
    from gpt1_jax import weights

    for step in (9, 10):
        (tmp_path / "checkpoints" / str(step)).mkdir(parents=True)
    calls = []

    def load(path, step):
        calls.append(step)
        if len(calls) == 1:  # the run deletes 9 under the reader
            (tmp_path / "checkpoints" / "9").rmdir()
            raise FileNotFoundError(f"{tmp_path}/checkpoints/9")
        return "config", {}, 10

    monkeypatch.setattr(weights, "_load_checkpoint", load)
    assert weights._load_run(tmp_path, None) == ("config", {}, 10) and calls == [None, None]
    calls.clear()
    (tmp_path / "checkpoints" / "9").mkdir()
    with pytest.raises(FileNotFoundError):  # a step asked for by number is not another one
        weights._load_run(tmp_path, 9)
    assert calls == [9]
