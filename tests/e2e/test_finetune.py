"""`gpt1-jax finetune` end to end on a tiny model and a few dozen examples: results.json, predictions,
GLUE's submission file; init from none, from a HF directory and from a pre-training workdir."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import pytest

from gpt1_jax import cli
from gpt1_jax.config import FinetuneConfig, load_yaml, model_preset, save_yaml
from gpt1_jax.finetune import open_source, transplant, with_marker_rows
from gpt1_jax.integrity import checkpoint_steps
from gpt1_jax.tokenizer import GPT1Tokenizer
from tests.support.env import xla_flags
from tests.support.finetune import WORDS, _hf_dir, _sentences, data_dir, tokenizer  # noqa: F401 (pytest fixtures)


def _finetune(tmp_path, data_dir, *extra, task="cola", progress=False):
    workdir = tmp_path / "run"
    argv = ["finetune", "--task", task, "--workdir", str(workdir), "--data-dir", str(data_dir), "--config", "tiny",
            "--tfds-dir", str(tmp_path / "tfds"), "--batch-size", "8", *([] if progress else ["--no-progress"]), *extra]
    if "--init" not in extra:
        argv += ["--init", "none"]
    assert cli.main(argv) == 0
    return workdir, json.loads((workdir / "results.json").read_text())


def test_out_of_memory_is_one_line_and_a_run_that_never_saved_takes_new_settings(tmp_path, data_dir, capsys,
                                                                                 monkeypatch):
    """A batch too large for the machine ended in XLA's RESOURCE_EXHAUSTED traceback, and the folder it left (no
    checkpoint) refused the same command with a sane batch: "other settings (batch_size=1000000 there, 8 now)"."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    argv = ["finetune", "--task", "cola", "--workdir", str(tmp_path / "run"), "--data-dir", str(data_dir), "--config",
            "tiny", "--tfds-dir", str(tmp_path / "tfds"), "--batch-size", "1000000", "--init", "none", "--no-progress"]
    assert cli.main(argv) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert re.fullmatch(r"gpt1-jax finetune: error: the device ran out of memory \(Out of memory allocating \d+ "
                        r"bytes\): lower --batch-size .*", last), last
    assert not checkpoint_steps(tmp_path / "run" / "checkpoints")
    _finetune(tmp_path, data_dir)


def test_finetune_from_scratch_writes_results_predictions_and_submission(tmp_path, data_dir, capsys):
    workdir, results = _finetune(tmp_path, data_dir, "--epochs", "2", "--predict-test", "--seed", "3",
                                 "--set", "optim.lr=1e-3", progress=True)
    _each_epoch_is_said_and_plotted(workdir, capsys.readouterr().err)
    assert results["task"] == "cola" and results["seed"] == 3 and results["init"] == "none"
    assert results["metric_names"] == ["matthews_corr", "accuracy"] and -1 <= results["metrics"]["matthews_corr"] <= 1
    assert results["epoch"] in (1, 2) and len(results["history"]) == 2 and results["selected_on"] == "dev"
    assert results["n_train"] == 40 and results["n_dev"] == {"validation": 12}
    assert results["steps"] == 10  # ceil(40 / 8) x 2: the last partial batch is padded, not dropped
    assert results["config"]["optim"]["lr"] == 1e-3 and results["config"]["lm_coef"] == 0.5
    dev = (workdir / "predictions" / "validation.tsv").read_text().splitlines()
    assert dev[0] == "index\tprediction\tlabel" and len(dev) == 13
    assert {line.split("\t")[1] for line in dev[1:]} <= {"acceptable", "unacceptable"}
    sub = (workdir / "CoLA.tsv").read_text().splitlines()
    assert sub[0] == "index\tprediction" and len(sub) == 10
    assert [line.split("\t")[0] for line in sub[1:]] == [str(i) for i in range(9)]
    assert {line.split("\t")[1] for line in sub[1:]} <= {"0", "1"}
    metrics = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert {"loss", "task_loss", "lm_loss", "lr"} <= set(metrics[0])
    saved = load_yaml(FinetuneConfig, workdir / "config.yaml")  # the resolved config round-trips
    assert saved.optim.total_steps == 10 and saved.model.vocab_size == GPT1Tokenizer.load(workdir / "tokenizer.json").vocab_size


def _scores(metrics: dict) -> str:
    return "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def _each_epoch_is_said_and_plotted(workdir, err: str) -> None:
    """Fine-tuning said nothing of its dev scores until the run's end ("best epoch 1: ..."), and drew no curve, where
    pre-training says each evaluation and plots its losses: now a line per epoch as it ends, and loss.png with the
    scores beside the loss."""
    import struct

    lines = [l.strip() for l in err.replace("\r", "\n").splitlines() if l.strip()]
    epochs = [l for l in lines if l.startswith("epoch ")]
    assert len(epochs) == 2, lines
    # and the bar says what it waits for: the step's compilations (one per batch length), each epoch's evaluation
    assert any(l.endswith(", compiling]") for l in lines), lines
    assert all(lines[lines.index(l) - 1].endswith(", evaluating dev]") for l in epochs), lines
    for epoch, line in enumerate(epochs, 1):
        assert re.fullmatch(rf"epoch {epoch} \(step {5 * epoch}\): train_loss \d+\.\d{{4}}  matthews_corr -?\d\.\d{{4}}  "
                            r"accuracy \d\.\d{4}  \((best|best: epoch 1)\)", line), line
    assert epochs[0].endswith("(best)") and lines[-1] == f"loss curve: {workdir / 'loss.png'}"
    width, height = struct.unpack(">II", (workdir / "loss.png").read_bytes()[16:24])  # the PNG header's size
    assert (width, height) == (1320, 440)  # two panels, 12 x 4 inches at 110 dpi (pre-training's: one, 7 x 4)


def test_a_rerun_keeps_its_seconds_and_what_it_cannot_give_is_refused(tmp_path, data_dir, capsys):
    """A finished run's rerun rewrote train_seconds as 0.0; with --predict-test added it listed a submission file
    that no epoch wrote; a dev file without labels (a test file in its place) made a run of no scores, status 0."""
    workdir, results = _finetune(tmp_path, data_dir, "--epochs", "1")
    # --no-progress: no bar, no epoch lines, but the run's result (it printed only the loss curve's line)
    assert capsys.readouterr().err == (f"best epoch 1: {_scores(results['metrics'])}  -> {workdir / 'results.json'}\n"
                                       f"loss curve: {workdir / 'loss.png'}\n")
    assert results["train_seconds"] > 0 and results["submission"] == {}
    # train_seconds is the run's wall time; the dev evaluation's share of it (compiling included) is told apart
    assert 0 < results["dev_seconds"] < results["train_seconds"]
    _, again = _finetune(tmp_path, data_dir, "--epochs", "1")
    assert again["train_seconds"] == results["train_seconds"] and again["metrics"] == results["metrics"]
    assert again["dev_seconds"] == results["dev_seconds"]
    # A damaged results.json ended the rerun in a JSONDecodeError traceback; deleted dev predictions were listed
    # again as if they were there, status 0 and no word.
    (workdir / "results.json").write_text("{broken")
    (workdir / "predictions" / "validation.tsv").unlink()
    _, mended = _finetune(tmp_path, data_dir, "--epochs", "1")
    assert mended["metrics"] == results["metrics"] and mended["predictions"] == {}
    assert "predictions/validation.tsv in " in capsys.readouterr().err
    # without --config the run folder's own config is the default, as --help says (it was pretrain's defaults:
    # "holds a fine-tuning run with other settings (model.d_mlp=256 there, 3072 now, ...)")
    bare = ["finetune", "--task", "cola", "--workdir", str(workdir), "--data-dir", str(data_dir), "--tfds-dir",
            str(tmp_path / "tfds"), "--batch-size", "8", "--no-progress", "--init", "none", "--epochs", "1"]
    assert cli.main(bare) == 0
    capsys.readouterr()
    # with it deleted, the defaults met the run's examples and were refused as "other examples" (the same files)
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    (copy / "config.yaml").unlink()
    assert cli.main([str(copy) if a == str(workdir) else a for a in bare]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt1-jax finetune: error: {copy} holds checkpoints but no config.yaml (deleted?): restore it, or give the "
        "run's own --config and flags to resume it")
    before = {p: p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()}
    argv = ["finetune", "--task", "cola", "--workdir", str(workdir), "--data-dir", str(data_dir), "--config", "tiny",
            "--tfds-dir", str(tmp_path / "tfds"), "--batch-size", "8", "--no-progress", "--init", "none",
            "--epochs", "1"]
    assert cli.main(argv + ["--predict-test"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt1-jax finetune: error: {workdir} holds a run that finished without --predict-test: test predictions "
        "are made at the best epoch while it trains; run it with --predict-test in another --workdir")
    assert {p: p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()} == before

    unlabelled = tmp_path / "unlabelled"
    shutil.copytree(data_dir, unlabelled)
    (unlabelled / "STS-B" / "dev.tsv").write_text("\n".join(l.rsplit("\t", 1)[0] for l in
                                                             (data_dir / "STS-B" / "dev.tsv").read_text().splitlines()) + "\n")
    fresh = tmp_path / "fresh"
    assert cli.main([a if a not in (str(workdir), str(data_dir), "cola") else
                     {str(workdir): str(fresh), str(data_dir): str(unlabelled), "cola": "stsb"}[a] for a in argv]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gpt1-jax finetune: error: stsb's validation split has no labels (a test file in place of the dev file?): "
        "there is nothing to score the run on")
    assert not (fresh / "config.yaml").exists()

    # A profile window past the last step was refused once the run folder was written (run.json, config.yaml, ...).
    assert cli.main([a if a != str(workdir) else str(fresh) for a in argv] + ["--profile", "2:9"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gpt1-jax finetune: error: profile 2:9 ends after the run's last step (5 = 1 epoch x 5 steps)")
    assert not fresh.exists()


def test_the_epoch_is_chosen_on_the_held_out_slice_and_dev_is_only_reported(tmp_path, data_dir):
    """--holdout-fraction 0.25 of CoLA's 40 training examples: 30 train, 10 choose the epoch; the reported dev
    score is the chosen epoch's, whatever dev says about the other epochs, and its checkpoint is kept beside the
    newest one (keep_checkpoints=1: an early best epoch's rotated out)."""
    workdir, results = _finetune(tmp_path, data_dir, "--epochs", "3", "--holdout-fraction", "0.25", "--set",
                                 "optim.lr=1e-3", "--group-by-length", "on",  # full_sets' batching (Table 5)
                                 "--set", "keep_checkpoints=1")
    assert results["selected_on"] == "holdout" and (results["n_train"], results["n_holdout"]) == (30, 10)
    assert results["config"]["group_by_length"] is True
    assert results["steps"] == 12  # ceil(30 / 8) x 3
    history = results["history"]
    assert all({"holdout/matthews_corr", "matthews_corr"} <= set(h) for h in history)
    held = [h["holdout/matthews_corr"] for h in history]
    chosen = history[results["epoch"] - 1]
    assert chosen["holdout/matthews_corr"] == max(held) and held.index(max(held)) == results["epoch"] - 1
    assert results["metrics"] == {k: chosen[k] for k in ("matthews_corr", "accuracy")}
    assert results["holdout"] == {k: chosen[f"holdout/{k}"] for k in ("matthews_corr", "accuracy")}
    assert results["step"] == 4 * results["epoch"]
    assert checkpoint_steps(workdir / "checkpoints") == sorted({results["step"], 12})


def test_similarity_regression_without_aux_lm(tmp_path, data_dir):
    _, results = _finetune(tmp_path, data_dir, "--epochs", "1", "--lm-coef", "0", task="stsb")
    assert results["metric_names"] == ["pearson", "spearman"]
    assert results["config"]["lm_coef"] == 0.0


def test_evaluation_batched_shortest_first_gives_the_file_order_outputs(tmp_path, data_dir):
    """predict_split batches by length, then puts every output back in its example's place: the same STS-B
    scores (here of its 24 training pairs) as batching them in file order (a causal model ignores the padding
    after a sequence)."""
    from gpt1_jax.data.layout import Markers
    from gpt1_jax.data.tasks import example_lengths, make_batch
    from gpt1_jax.finetune import predict_split, prepare, task_trainer

    config = dataclasses.replace(FinetuneConfig(task="stsb", model=model_preset("tiny"), batch_size=8), seed=1)
    task, source, config, splits = prepare(config, tmp_path, init="none", data_dir=str(data_dir), tokenizer=None,
                                           predict_test=False, tfds_dir=str(tmp_path / "tfds"))
    trainer = task_trainer(config, task, config.mesh)
    params = trainer.init(config.seed).params
    enc, markers = splits.train, Markers.of(source.tokenizer)  # 24 pairs: 3 batches of 8 (8 fake devices)
    lengths = example_lengths(enc)
    assert len(set(lengths)) > 1 and not np.all(np.diff(lengths) >= 0)  # file order is not length order
    in_file_order = np.concatenate([
        np.asarray(trainer.predict(params, trainer.put_batch(
            make_batch(enc, np.arange(i, min(i + 8, len(lengths))), 8, splits.n_ctx, markers), train=False)))[
            : min(8, len(lengths) - i), 0]
        for i in range(0, len(lengths), 8)])
    got = predict_split(trainer, params, enc, 8, splits.n_ctx, markers, task)
    assert got.shape == in_file_order.shape and np.allclose(got, in_file_order, atol=1e-5)
    assert np.std(got) > 0  # the outputs differ between examples, so a misplaced one would show


def test_init_from_hf_dir_appends_the_marker_rows(tmp_path, data_dir, tokenizer):
    tok_path = tmp_path / "tok.json"
    tokenizer.save(tok_path)
    hf, config, params = _hf_dir(tmp_path, tokenizer)
    fcfg = FinetuneConfig(model=model_preset("tiny"))
    source = open_source(str(hf), fcfg, str(tok_path))
    model_config, loaded = with_marker_rows(source.model_config, source.params, source.tokenizer, seed=0)
    table = np.asarray(loaded["tokens_embed"]["embedding"])
    assert model_config.vocab_size == source.tokenizer.vocab_size == table.shape[0] == config.vocab_size + 3
    np.testing.assert_array_equal(table[:-3], np.asarray(params["tokens_embed"]["embedding"].value))
    assert 0.005 < table[-3:].std() < 0.05  # N(0, 0.02)
    _, results = _finetune(tmp_path, data_dir, "--init", str(hf), "--tokenizer", str(tok_path), "--epochs", "1")
    assert results["init"] == str(hf)
    # scratch:DIR = the same architecture and vocabulary, random weights (Table 5's no pre-training)
    scratch = open_source(f"scratch:{hf}", fcfg, str(tok_path))
    assert scratch.params is None and scratch.model_config == source.model_config
    assert scratch.described.startswith("scratch")


def _pretrain_folder(workdir, tokenizer, steps=(4, 6)) -> dict:
    """A pre-training run's folder with a checkpoint of each step (no training: each a fresh init, of seed step + 1)
    -> {step: its state}."""
    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import MeshConfig, OptimConfig, PretrainConfig, preset
    from gpt1_jax.step import lm_trainer

    config = dataclasses.replace(model_preset("tiny"), vocab_size=tokenizer.vocab_size)
    workdir.mkdir(exist_ok=True)
    trainer = lm_trainer(config, OptimConfig(total_steps=10, warmup_steps=1), MeshConfig())
    states = {step: trainer.init(seed=step + 1) for step in steps}
    ckpt = Checkpointer(workdir / "checkpoints", keep=10)
    for step, state in states.items():
        ckpt.save(step, state, {"batches": {}}, config)
    ckpt.close()
    save_yaml(dataclasses.replace(preset(PretrainConfig, "tiny"), model=config), workdir / "config.yaml")
    tokenizer.save(workdir / "tokenizer.json")
    return states


def test_init_from_pretrain_workdir_restores_the_params(tmp_path, tokenizer):
    workdir = tmp_path / "pre"
    state = _pretrain_folder(workdir, tokenizer)[4]
    # --step picks a checkpoint (a fine-tuning run's best epoch: finetune had no --step, which its help named)
    source = open_source(str(workdir), FinetuneConfig(), None, step=4)
    assert source.described == f"{workdir} step 4"
    assert source.model_config.vocab_size == source.tokenizer.vocab_size
    assert source.model_config.embd_dropout == 0.1  # run-time fields from the fine-tuning config
    for a, b in zip(jax.tree.leaves(source.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_source_training_now_is_said_and_the_step_read_is_kept_for_the_run(tmp_path, data_dir, tokenizer, capsys):
    """Fine-tuning from a pre-training run still training took whichever checkpoint was newest and recorded no step
    ("init": ".../pre"): seeds of one sweep could start from different checkpoints without a word. Now it says
    so, and the run records the step it read, which its own command keeps to, whatever the source saved since."""
    import socket

    from gpt1_jax import workdir as wd

    pre = tmp_path / "pre"
    _pretrain_folder(pre, tokenizer)
    with wd.hold(pre, "pretrain"):  # a pre-training job holds its folder: training now
        workdir, results = _finetune(tmp_path, data_dir, "--init", str(pre), "--epochs", "1")
    err = capsys.readouterr().err
    assert (f"gpt1-jax finetune: --init {pre} is training now (pid {os.getpid()} on {socket.gethostname()}): this "
            "run starts from its checkpoint of step 6; give --step 6 to start other runs from the same one\n") in err
    assert results["init"] == f"{pre} step 6"
    assert json.loads((workdir / "run.json").read_text())["init"] == f"{pre.resolve()} step 6"
    _pretrain_folder(pre, tokenizer, steps=(8,))  # it trained on; then step 6 rotated out
    shutil.rmtree(pre / "checkpoints" / "6")
    _, again = _finetune(tmp_path, data_dir, "--init", str(pre), "--epochs", "1")  # the run's own command
    assert again["init"] == f"{pre} step 6" and again["metrics"] == results["metrics"]
    assert "training now" not in capsys.readouterr().err
    argv = ["finetune", "--task", "cola", "--workdir", str(workdir), "--data-dir", str(data_dir), "--config", "tiny",
            "--tfds-dir", str(tmp_path / "tfds"), "--batch-size", "8", "--no-progress", "--epochs", "1",
            "--init", str(pre), "--step", "8"]
    assert cli.main(argv) == 2
    refused = capsys.readouterr().err.strip()
    assert refused.endswith(f"holds a fine-tuning run of cola from {pre.resolve()} step 6, not from {pre.resolve()} "
                            "step 8: choose another --workdir (one folder per init source)"), refused


@pytest.mark.parametrize("scan_layers", [False, True], ids=["loop", "scan"])
def test_transplant_keeps_embeddings_and_the_first_layers(scan_layers):
    from gpt1_jax.model import init_params

    config = dataclasses.replace(model_preset("tiny"), n_layers=3, scan_layers=scan_layers)
    fresh, pre = (jax.tree.map(np.asarray, nn.meta.unbox(init_params(config, s))) for s in (0, 1))
    out = transplant(fresh, pre, config, 1)
    np.testing.assert_array_equal(out["tokens_embed"]["embedding"], pre["tokens_embed"]["embedding"])
    np.testing.assert_array_equal(out["positions_embed"]["embedding"], pre["positions_embed"]["embedding"])
    stack = (lambda t: t["h"]) if scan_layers else (lambda t: jax.tree.map(lambda *a: np.stack(a), *(t[f"h_{i}"] for i in range(3))))
    for got, p, f in zip(*(jax.tree.leaves(stack(t)) for t in (out, pre, fresh))):
        np.testing.assert_array_equal(got[:1], p[:1])
        np.testing.assert_array_equal(got[1:], f[1:])
    assert transplant(fresh, pre, config, -1) is pre and transplant(fresh, pre, config, 3) is pre


def test_race_multiple_choice_end_to_end(tmp_path):
    import io
    import tarfile

    path = tmp_path / "race.tar.gz"
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        for split, n in (("train", 6), ("dev", 2)):
            for level in ("middle", "high"):
                for k in range(n):
                    doc = {"id": f"{k}.txt", "article": " ".join(_sentences(30, k)), "questions": ["what sat?", "who ran?"],
                           "options": [WORDS[:4], WORDS[4:8]], "answers": [str("ABCD"[rng.integers(4)]), "B"]}
                    data = json.dumps(doc).encode()
                    info = tarfile.TarInfo(f"race/{split}/{level}/{k}.txt")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    _, results = _finetune(tmp_path, path, "--epochs", "1", task="race")
    assert results["n_train"] == 24 and results["n_dev"] == {"validation": 8}
    assert set(results["metrics"]) == {"accuracy", "accuracy_middle", "accuracy_high"}


def test_glue_table_script_quick(tmp_path, data_dir):
    """python -m experiments.glue.glue_table --quick: runs, then writes the markdown table beside the paper's numbers.
    On two CPU devices (--cpu-devices 2), whose record a rerun on one counts as done (the split is how a run
    computes, not what); a split that does not divide the batch is refused before the first run."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "table"
    proc = subprocess.run([sys.executable, "-m", "experiments.glue.glue_table", "--quick", "--init", "none", "--tasks", "cola",
                           "--seeds", "0", "--data-dir", str(data_dir), "--out", str(out), "--tfds-dir", str(tmp_path / "tfds"),
                           "--set", "lm_coef=0.25", "--cpu-devices", "2"],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mesh {'data': 2," in proc.stderr, proc.stderr[-2000:]  # the run trained over both devices
    table = (out / "table.md").read_text()
    assert "| cola | matthews_corr | 45.4 |" in table and (out / "full" / "cola" / "seed0" / "results.json").is_file()
    assert "Plot: `table.png`." in table and (out / "table.png").read_bytes()[:4] == b"\x89PNG"
    record = json.loads((out / "full" / "cola" / "seed0" / "record.json").read_text())  # the harness's done mark
    assert record["metrics"] == json.loads((out / "full" / "cola" / "seed0" / "results.json").read_text())["metrics"]
    assert "lm_coef: 0.25" in (out / "full" / "cola" / "seed0" / "config.yaml").read_text()  # --set reached the run
    again = subprocess.run(proc.args[:-2], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert again.returncode == 0 and "done before" in again.stderr and (out / "table.md").read_text() == table
    # a split that does not divide the batch (--quick's 8): one line before any run (each run failed with it)
    split = [*proc.args[:-1], "3"]
    split[split.index("--out") + 1] = str(tmp_path / "split")
    refused = subprocess.run(split, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "python -m experiments.glue.glue_table: error: --cpu-devices 3: batch_size 8 is not divisible by data x fsdp = "
        "3 (mesh {'data': 3, 'fsdp': 1, 'tensor': 1})"], refused.stderr
    assert not (tmp_path / "split").exists()


def test_short_real_finetune_beats_the_majority_class(tmp_path, shared_dir):
    """Real SST-2 (4,000 training sentences drawn once from its 67,349, the whole dev set), tiny model from
    scratch, one epoch: 125 steps (dev accuracy 0.63 against a majority of 0.51 here). The sentences are copied
    into a GLUE folder of their own, so tensorflow-datasets prepares and reads 4,000 rows, not 67,349; one CPU
    device in a subprocess (this process's 8 fake ones take half as long again)."""
    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    header, *rows = (shared_dir / "data" / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    drawn = np.sort(np.random.default_rng(0).choice(len(rows), 4000, replace=False))
    (glue / "train.tsv").write_text(header + "".join(rows[i] for i in drawn), encoding="utf-8")
    (glue / "dev.tsv").write_bytes((shared_dir / "data" / "glue" / "SST-2" / "dev.tsv").read_bytes())
    workdir = tmp_path / "sst2"
    argv = ["finetune", "--task", "sst2", "--init", "none", "--config", "tiny", "--workdir", str(workdir),
            "--data-dir", str(glue.parent), "--tfds-dir", str(tmp_path / "tfds"),
            "--epochs", "1", "--lr", "3e-3", "--lm-coef", "0", "--no-progress"]
    done = subprocess.run([sys.executable, "-m", "gpt1_jax.cli", *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    labels = [line.split("\t")[2] for line in (workdir / "predictions" / "validation.tsv").read_text().splitlines()[1:]]
    majority = max(labels.count(l) for l in set(labels)) / len(labels)
    assert len(labels) == 872 and results["n_train"] == 4000 and majority < 0.52
    assert results["metrics"]["accuracy"] > majority + 0.05, (results["metrics"], majority)


def _argv(workdir, data_dir, tmp_path, *extra):
    """A tiny CoLA run in a real subprocess: 40 examples, batch 8, 2 epochs of 5 steps, a checkpoint every step."""
    return [sys.executable, "-m", "gpt1_jax.cli", "finetune", "--task", "cola", "--init", "none", "--config", "tiny",
            "--workdir", str(workdir), "--data-dir", str(data_dir), "--tfds-dir", str(tmp_path / "tfds"),
            "--batch-size", "8", "--epochs", "2", "--predict-test", "--set", "checkpoint_every=1", *extra]


def _outputs(workdir):
    """What an interrupted run must reproduce: dev scores per epoch, best epoch, prediction files' bytes."""
    results = json.loads((workdir / "results.json").read_text())
    files = {p.name: p.read_bytes() for p in [*(workdir / "predictions").iterdir(), workdir / "CoLA.tsv"]}
    return [{k: v for k, v in h.items()} for h in results["history"]], results["epoch"], files


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("ft-ref")
    done = subprocess.run(_argv(tmp / "run", data_dir, tmp), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "run"


def _start_and_wait(argv, workdir, log, step):
    proc = subprocess.Popen(argv, stderr=open(log, "w"), stdout=subprocess.DEVNULL)
    t0 = time.time()
    while time.time() - t0 < 300:
        path = workdir / "metrics.jsonl"
        if path.exists() and any(json.loads(l).get("step", 0) >= step for l in path.read_text().splitlines() if l.strip()):
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {open(log).read()[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("timed out")


def test_finetune_kill_9_then_rerun_equals_an_uninterrupted_run(uninterrupted, tmp_path, data_dir):
    """Killed in the second epoch: the rerun restores the state, the batch position and the dev history."""
    workdir = tmp_path / "run"
    argv = _argv(workdir, data_dir, tmp_path)
    proc = _start_and_wait(argv, workdir, tmp_path / "log", 7)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (workdir / "results.json").exists()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming at" in done.stderr  # not a second run from scratch (which would give the same files)
    assert _outputs(workdir) == _outputs(uninterrupted)


def test_finetune_sigterm_saves_exits_0_and_resumes(uninterrupted, tmp_path, data_dir):
    workdir = tmp_path / "run"
    argv = _argv(workdir, data_dir, tmp_path, "--set", "checkpoint_every=0")  # epoch ends and the preemption only
    proc = _start_and_wait(argv, workdir, tmp_path / "log", 2)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert proc.returncode == 0 and "preempted: checkpoint saved at step" in open(tmp_path / "log").read()
    saved = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    first_session = json.loads((workdir / "checkpoints" / str(saved) / "data" / "metadata").read_text())["seconds"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _outputs(workdir) == _outputs(uninterrupted)
    # The training time counts the preempted session too (it once counted the last session's alone).
    assert json.loads((workdir / "results.json").read_text())["train_seconds"] > first_session > 0
    # each epoch end is a checkpoint (steps 5 and 10), not only the last step: the newest two are kept
    # (keep_checkpoints=2), of the epoch ends and the step the SIGTERM stopped at, and the best epoch's
    stopped = int(re.search(r"preempted: checkpoint saved at step (\d+)", open(tmp_path / "log").read()).group(1))
    best = json.loads((workdir / "results.json").read_text())["step"]
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == \
        sorted({best, *sorted({5, 10, stopped})[-2:]})


def test_accumulated_steps_train_like_the_whole_batch(tmp_path, data_dir):
    """--accum-steps 2 runs each batch of 16 as two micro-batches of 8 (one row per fake device): the same
    first loss and gradient norm (no dropout, so the masks' different streams cannot matter)."""
    runs = {}
    for k in (1, 2):
        workdir, results = _finetune(tmp_path / f"k{k}", data_dir, "--epochs", "1", "--accum-steps", str(k), "--batch-size", "16",
                                     "--set", "model.embd_dropout=0", "--set", "model.attn_dropout=0",
                                     "--set", "model.resid_dropout=0", "--set", "clf_dropout=0")
        runs[k] = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    first = [next(r for r in runs[k] if "loss" in r) for k in (1, 2)]
    assert first[0]["loss"] == pytest.approx(first[1]["loss"], rel=1e-5)
    assert first[0]["grad_norm"] == pytest.approx(first[1]["grad_norm"], rel=1e-4)


def test_schedule_free_is_scored_at_x(tmp_path, data_dir, monkeypatch):
    """The dev hook evaluates schedule-free runs at their x sequence (optim.eval_params), not at y."""
    from gpt1_jax import finetune, optim

    seen = []
    real = optim.eval_params
    monkeypatch.setattr(finetune, "eval_params", lambda opt_state, params: seen.append(real(opt_state, params) is not params) or real(opt_state, params))
    _finetune(tmp_path, data_dir, "--epochs", "1", "--set", "optim.name=schedule_free_adamw")
    assert seen and all(seen)


def test_two_processes_give_the_one_process_metrics(tmp_path, data_dir):
    """launch/local.py -n 2 -d 2 against one process with 4 devices, one epoch each: same dev scores, same
    prediction and submission files."""
    repo = Path(__file__).resolve().parents[2]
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPT1_")}
    args = _argv(tmp_path / "one", data_dir, tmp_path, "--set", "checkpoint_every=0", "--epochs", "1")[1:]
    one = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                         env={**base, "XLA_FLAGS": xla_flags(4), "JAX_PLATFORMS": "cpu"})
    assert one.returncode == 0, one.stderr[-3000:]
    args = _argv(tmp_path / "two", data_dir, tmp_path, "--set", "checkpoint_every=0", "--epochs", "1")[1:]
    two = subprocess.run([sys.executable, str(repo / "launch" / "local.py"), "-n", "2", "-d", "2", "--grace", "20", "--",
                          sys.executable, *args], capture_output=True, text=True, timeout=300,
                         env={**base, "JAX_PLATFORMS": "cpu"})
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-2000:]
    (h1, e1, f1), (h2, e2, f2) = _outputs(tmp_path / "one"), _outputs(tmp_path / "two")
    assert e1 == e2 and f1 == f2
    for a, b in zip(h1, h2):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6) for k in a)


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_finished_run_refuses_other_jobs_and_settings_byte_for_byte(uninterrupted, tmp_path, data_dir, capsys):
    """A sweep reusing a folder, a pre-training run or `evaluate` pointed at it, another tokenizer, other training
    files: one line each, nothing changed."""
    own = _argv(uninterrupted, data_dir, tmp_path)[3:]  # the run's own flags, without `python -m gpt1_jax.cli`
    # a BPE of the run's own size from other text: it passed every size check, and the run went on with other ids
    mine = GPT1Tokenizer.load(uninterrupted / "tokenizer.json")
    other = tmp_path / "other.json"
    GPT1Tokenizer.train([_sentences(300, 5)], vocab_size=mine.base_vocab_size).save(other)
    assert GPT1Tokenizer.load(other).vocab_size == mine.vocab_size and not GPT1Tokenizer.load(other).same_as(mine)
    # the same task's files with every training label flipped: its config and its folder's name say nothing of it
    flipped = tmp_path / "flipped"
    shutil.copytree(data_dir, flipped)
    rows = [r.split("\t") for r in (data_dir / "CoLA" / "train.tsv").read_text().splitlines()]
    (flipped / "CoLA" / "train.tsv").write_text("".join("\t".join([r[0], str(1 - int(r[1])), *r[2:]]) + "\n" for r in rows))
    before = _snapshot(uninterrupted)
    cases = [
        ([a if a != "cola" else "stsb" for a in own], f"{uninterrupted} holds a fine-tuning run of cola from none, "
         "not of stsb: choose another --workdir (one folder per task and setting)"),
        (own + ["--lr", "1e-3"], f"{uninterrupted} holds a fine-tuning run with other settings (optim.lr=6.25e-05 "
         "there, 0.001 now): choose another --workdir (one folder per setting), or repeat the run's own flags to "
         "resume it (or leave them out: its config.yaml is the default)"),
        (["pretrain", "--workdir", str(uninterrupted)], f"{uninterrupted} holds a fine-tuning run of cola from none; "
         "pretrain would overwrite it: choose another --workdir"),
        (["evaluate", "--workdir", str(uninterrupted)], f"{uninterrupted} holds a fine-tuning run of cola from none, "
         f"not a pre-training run: evaluate measures a pre-training checkpoint's LM loss; this run's dev scores are in "
         f"{uninterrupted / 'results.json'}"),
        (own + ["--tokenizer", str(other)], f"{uninterrupted} holds a fine-tuning run trained with another tokenizer "
         f"than --tokenizer {other} gives (its checkpoints use the ids of its own tokenizer.json): repeat the run's own "
         "--tokenizer, or choose another --workdir"),
        ([str(flipped) if a == str(data_dir) else a for a in own], f"{uninterrupted} holds a fine-tuning run trained on "
         "other examples (40 there, 40 now, or other tokens or labels: another --data-dir, or edited files): repeat the "
         "run's own --data-dir, or choose another --workdir"),
    ]
    for argv, message in cases:
        assert cli.main(argv) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"gpt1-jax {argv[0]}: error: {message}"
    assert _snapshot(uninterrupted) == before


def test_what_the_layout_cuts_and_a_subset_submission_are_said(tmp_path, data_dir, capsys):
    """Texts longer than a segment's n_ctx // 2 - 2 tokens were cut without a word (at tiny's n_ctx, most RACE
    articles), and --max-eval-examples cut the test split of a --predict-test run into a file GLUE's server
    refuses, also without a word; then --no-progress silenced the warnings with the bar. The cut counted training
    examples only (RACE's dev accuracy was on cut passages without a word), and a batch larger than the training
    set ran one step of mostly filler rows without one."""
    argv = ["finetune", "--task", "cola", "--workdir", str(tmp_path / "run"), "--data-dir", str(data_dir), "--config",
            "tiny", "--tfds-dir", str(tmp_path / "tfds"), "--batch-size", "16", "--max-train-examples", "10",
            "--init", "none", "--epochs", "1", "--set", "n_ctx=12", "--predict-test", "--max-eval-examples", "2",
            "--no-progress"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert re.search(r"finetune cola: \d+ of 10 training, [12] of 2 validation, [12] of 2 test examples have a text "
                     r"longer than a segment's 4 tokens \(n_ctx 12\): cut to it", err), err[-2000:]
    assert ("finetune cola: --batch-size 16 is larger than the 10 training examples: each epoch is one step whose "
            "other 6 rows are filler (weight 0)") in err
    assert ("--max-eval-examples 2 cuts the test split too (test): predictions for part of a split, which GLUE's "
            "server does not take") in err
