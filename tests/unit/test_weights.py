"""Checkpoint formats: HF directories both ways, OpenAI's original release, ours, and their bad-input errors."""

import json

import jax
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
    (tmp_path / "empty" / "afile").write_text("x")  # was "no such checkpoint directory" too
    with pytest.raises(CheckpointFormatError, match="afile: a file, not a model's folder"):
        load_pretrained(tmp_path / "empty" / "afile")
    (tmp_path / "empty" / "afile").unlink()
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


# Not array_metadatas/process_0: orbax reads it only at times (a truncated one loaded in the full suite's run)
@pytest.mark.parametrize("damage", ["truncate d/*", "remove d/*", "truncate manifest.ocdbt", "truncate _METADATA",
                                    "truncate _sharding", "remove _METADATA", "truncate ocdbt.process_0/d/*"])
def test_a_damaged_jax_folder_is_one_error_naming_it(tmp_path, damage):
    """`convert --to jax` folders with a file of params/ truncated or deleted gave orbax's traceback (ValueError
    OUT_OF_RANGE/DATA_LOSS, JSONDecodeError, a bare Exception around an array's read) and "Event loop is closed"."""
    import jax

    import gpt1_jax.weights as weights

    # device arrays, as `convert` saves them: numpy ones leave _sharding out
    weights.save_jax(SMALL, jax.tree.map(jax.numpy.asarray, random_params(SMALL)), tmp_path / "ours")
    how, pattern = damage.split()
    for file in sorted((tmp_path / "ours" / "params").glob(pattern)):  # every data file: one holds the arrays
        file.write_bytes(file.read_bytes()[:5]) if how == "truncate" else file.unlink()
    with pytest.raises(CheckpointFormatError,
                       match=r"ours: its weights \(params/\) are damaged \(.+ (recorded|missing)"):
        load_pretrained(tmp_path / "ours")  # its digests say which file
    (tmp_path / "ours" / "params" / "integrity.json").unlink()  # a folder saved before the digests: orbax's failure
    with pytest.raises(CheckpointFormatError, match=r"ours: its weights \(params/\) are damaged and cannot be read "
                                                    r"\(.+\): truncated or corrupt; export the model again"):
        load_pretrained(tmp_path / "ours")


def test_a_flipped_byte_in_a_jax_folders_weights_is_refused_not_read_as_other_weights(tmp_path):
    """orbax does not check its data: one bit changed in an array file of a `convert --to jax` folder was read as
    other weights (`sample` printed other text, exit 0). The folder keeps each file's digest and is checked."""
    import jax

    import gpt1_jax.weights as weights

    params = jax.tree.map(jax.numpy.asarray, random_params(SMALL))
    weights.save_jax(SMALL, params, tmp_path / "ours")
    _, read = load_pretrained(tmp_path / "ours")
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool((a == b).all()), params, read)))
    data = max((tmp_path / "ours" / "params").rglob("d/*"), key=lambda f: f.stat().st_size)  # the arrays' file
    flipped = bytearray(data.read_bytes())
    flipped[len(flipped) // 2] ^= 1
    data.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointFormatError, match=rf"ours: its weights \(params/\) are damaged \("
                                                    rf"{data.relative_to(tmp_path / 'ours' / 'params')} differs from "
                                                    r"its recorded digest\); export the model again"):
        load_pretrained(tmp_path / "ours")




@pytest.mark.parametrize("shard, why", [
    (lambda f: f.write_bytes(f.read_bytes()[:100]), r"EOF: reading array header"),
    (lambda f: f.write_bytes(f.read_bytes()[:-7]), r"Failed to read all data"),
    (lambda f: f.write_text("hello\n"), r"not a .npy file"),
    (lambda f: np.save(f, np.array([1.0, None], dtype=object)), r"Object arrays cannot be loaded"),
])
def test_an_unreadable_release_shard_is_one_error_naming_it(small_release, shard, why):
    shard(small_release / "params_1.npy")
    with pytest.raises(CheckpointFormatError, match=rf"params_1.npy is unreadable \({why}.*\): truncated or corrupt; "
                                                    r"fetch the release again"):
        load_pretrained(small_release)


def test_a_release_shard_of_integers_is_refused(small_release):
    """An int64 params_1.npy was read as weights without a word."""
    np.save(small_release / "params_1.npy", np.zeros(np.load(small_release / "params_1.npy").size, np.int64))
    with pytest.raises(CheckpointFormatError, match=r"params_1.npy holds int64 values, not floating-point weights"):
        load_pretrained(small_release)


@pytest.mark.parametrize("edit, message", [
    (lambda s: 5, r"params_shapes.json holds int 5, not a list of shapes"),
    (lambda s: {"a": 1}, r"params_shapes.json holds dict \{'a': 1\}, not a list of shapes"),
    (lambda s: s[:2] + [[1, -64, 192]] + s[3:], r"params_shapes.json: entry 2 \(\[1, -64, 192\]\) is not a shape"),
    (lambda s: s[:3] + [[192.0]] + s[4:], r"params_shapes.json: entry 3 \(\[192.0\]\) is not a shape"),
    (lambda s: s[:3] + ["abc"] + s[4:], r"params_shapes.json: entry 3 \('abc'\) is not a shape"),
    (lambda s: [s[0], [s[1][0] * s[1][1]]] + s[2:], r"params_shapes.json: the token embedding \(tokens_embed.weight\) "
                                                    r"has shape \[13504\], not a matrix"),
])
def test_a_malformed_params_shapes_json_is_one_error(small_release, edit, message):
    """A shapes file that is not a list of lists of sizes was a TypeError, a numpy ufunc error or 'not enough values
    to unpack'."""
    shapes = json.loads((small_release / "params_shapes.json").read_text())
    (small_release / "params_shapes.json").write_text(json.dumps(edit(shapes)))
    with pytest.raises(CheckpointFormatError, match=message):
        load_pretrained(small_release)


@pytest.mark.parametrize("edit, message", [
    (lambda c: {**c, "n_embd": "64"}, r"config.json: n_embd must be an integer, not \"64\""),
    (lambda c: {**c, "n_head": True}, r"config.json: n_head must be an integer, not true"),
    (lambda c: {**c, "layer_norm_epsilon": None}, r"config.json: layer_norm_epsilon must be a number, not null"),
    (lambda c: {**c, "attn_pdrop": "0.1"}, r"config.json: attn_pdrop must be a number, not \"0.1\""),
    (lambda c: [1, 2], r"config.json holds a JSON list, not an object of settings"),
])
def test_an_hf_config_of_the_wrong_types_is_one_error(tmp_path, edit, message):
    """"n_embd": "64" or a null epsilon was a TypeError from ModelConfig's checks; a list, an AttributeError."""
    write_hf_dir(tmp_path / "hf", SMALL)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(edit(config)))
    with pytest.raises((ConfigError, CheckpointFormatError), match=message):
        load_pretrained(tmp_path / "hf")


def test_weights_of_more_layers_than_the_config_are_refused(tmp_path, small_release):
    """n_layer 3 of 4 layers loaded the first three and dropped the last without a word."""
    write_hf_dir(tmp_path / "hf", SMALL)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "n_layer": 3}))
    with pytest.raises(CheckpointFormatError, match=r"hf: the weights hold 4 layers \(h.0 ... h.3\) but the config has "
                                                    r"n_layers=3"):
        load_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    load_pretrained(tmp_path / "hf")  # lm_head.weight and the attention's bias buffers are no extra layer


def test_a_garbage_pytorch_bin_is_one_line(tmp_path):
    """torch's weights-only error is a page; unpickling garbage can also raise a KeyError (a text file)."""
    write_hf_dir(tmp_path / "hf", SMALL)
    (tmp_path / "hf" / "model.safetensors").unlink()
    for garbage in (np.random.default_rng(0).bytes(3000), b"hello\n"):
        (tmp_path / "hf" / "pytorch_model.bin").write_bytes(garbage)
        with pytest.raises(CheckpointFormatError, match=r"pytorch_model.bin is not a PyTorch state dict \(\w+: .+\): "
                                                        r"truncated or corrupt$") as caught:
            load_pretrained(tmp_path / "hf")
        assert "\n" not in str(caught.value)


def _finetune_run(folder, steps=(4, 8)):
    """A fine-tuning run's folder (config.yaml + checkpoints, no training): each step's transformer of its own seed."""
    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import FinetuneConfig, model_preset, save_yaml

    model = model_preset("tiny")
    folder.mkdir()
    save_yaml(FinetuneConfig(task="rte", model=model), folder / "config.yaml")
    ckpt = Checkpointer(folder / "checkpoints", async_save=False, keep=len(steps))
    transformers = {}
    for step in steps:
        transformers[step] = random_params(model, seed=step)
        ckpt.save(step, {"step": np.int32(step), "params": {"transformer": transformers[step]}}, {}, model)
    ckpt.close()
    return model, transformers


def test_a_finished_finetune_run_is_read_at_the_best_epoch_its_results_describe(tmp_path, capsys):
    """results.json said epoch 1 (step 4) while convert, sample, evaluate and finetune --init read step 8, the last
    checkpoint, an epoch of other (worse) scores."""
    from gpt1_jax.errors import WorkdirError
    from gpt1_jax.weights import convert, read_model

    run = tmp_path / "run"
    _, transformers = _finetune_run(run)
    same = lambda a, b: all(np.array_equal(np.asarray(x), np.asarray(y))  # noqa: E731
                            for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    assert read_model(run)[2] == 8  # still training (no results.json): its newest
    (run / "results.json").write_text(json.dumps({"task": "rte", "epoch": 1, "step": 4}))
    _, params, step = read_model(run)
    assert step == 4 and same(params, transformers[4]) and not same(params, transformers[8])
    assert read_model(run, step=8)[2] == 8  # a step given still wins
    assert convert(run, tmp_path / "hf")[2] == 4  # and convert can say which it wrote
    from gpt1_jax import cli

    assert cli.main(["convert", str(run), str(tmp_path / "hf2")]) == 0
    assert f"from {run} step 4 to {tmp_path / 'hf2'}" in capsys.readouterr().out
    (run / "results.json").write_text(json.dumps({"step": None}))  # rotated out by a version older than pinning
    assert read_model(run)[2] == 8
    (run / "results.json").write_text("{broken")
    with pytest.raises(WorkdirError, match=r"results.json is damaged .*: restore it, delete it \(the run's newest "
                                           r"checkpoint is then read\), or give the step to read \(--step\)"):
        read_model(run)
    (run / "results.json").write_text(json.dumps({"step": "4"}))
    with pytest.raises(CheckpointFormatError, match=r"results.json: step \"4\" is not a checkpoint's step"):
        read_model(run)


def test_a_config_preset_of_another_architecture_than_the_model_folder_is_refused(tmp_path):
    """`finetune --config tiny --init R` trained R's 4 x 256 model, not tiny's, without a word, where `--set
    model.n_layers=2` was refused; a preset of the folder's own architecture (its vocabulary aside) still goes."""
    import dataclasses

    from gpt1_jax.config import model_preset
    from gpt1_jax.weights import check_model_sets

    small = dataclasses.replace(model_preset("small"), vocab_size=515)  # a tokenizer's table, not the preset's 8192
    save_pretrained(small, random_params(small, seed=0), tmp_path / "hf")
    _finetune_run(tmp_path / "run")
    check_model_sets(tmp_path / "hf", ["dtype=bfloat16"], preset="small")
    check_model_sets(tmp_path / "run", [], preset="tiny")
    check_model_sets(tmp_path / "hf", [])  # no --config: the folder's own architecture, as before
    with pytest.raises(ConfigError, match=r"^--config tiny is another architecture than .*hf records \("
                                          r"n_positions=64 in tiny, 256 in the files, d_model=64 in tiny, 256 in "
                                          r"the files, n_layers=2 in tiny, 4 in the files\): leave --config out"):
        check_model_sets(tmp_path / "hf", [], preset="tiny")
    with pytest.raises(ConfigError, match=r"^--config small is another architecture than .*run records"):
        check_model_sets(tmp_path / "run", [], preset="small")


def test_a_bfloat16_folder_is_half_the_size_and_reads_back_as_float32(tmp_path):
    """save_pretrained(dtype="bfloat16") (the long release's weights, experiments/paper/settings.RELEASE_DTYPES):
    half the bytes, and every reader gets float32 parameters equal to the rounded ones."""
    from safetensors.numpy import load_file

    params = random_params(SMALL, seed=5)
    save_pretrained(SMALL, params, tmp_path / "f32")
    save_pretrained(SMALL, params, tmp_path / "bf16", dtype="bfloat16")
    f32, bf16 = (load_file(tmp_path / name / "model.safetensors") for name in ("f32", "bf16"))
    assert {str(v.dtype) for v in bf16.values()} == {"bfloat16"}
    assert sum(v.nbytes for v in bf16.values()) * 2 == sum(v.nbytes for v in f32.values())
    config, read = load_pretrained(tmp_path / "bf16")
    assert config == SMALL and {str(x.dtype) for x in jax.tree.leaves(read)} == {"float32"}
    _, exact = load_pretrained(tmp_path / "f32")
    rounded = jax.tree.map(lambda x: np.asarray(x).astype(jax.numpy.bfloat16).astype(np.float32), exact)
    jax.tree.map(np.testing.assert_array_equal, read, rounded)
    assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, read, exact)))  # rounded, not the same
