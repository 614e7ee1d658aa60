"""`gpt1-jax finetune` end to end on a tiny model and a few dozen examples: results.json, predictions,
GLUE's submission file; init from none, from a HF directory and from a pre-training workdir."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from gpt1_jax import cli, heads
from gpt1_jax.config import load_yaml, model_preset, save_yaml
from gpt1_jax.checkpoint import restore_params
from gpt1_jax.config import FinetuneConfig
from gpt1_jax.finetune import bucket_len, load_init, with_marker_rows
from gpt1_jax.tokenizer import GPT1Tokenizer

WORDS = "the a cat dog sat ran on under mat log quickly slowly big small red blue house tree".split()


def _sentences(n, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(3, 9))) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A small GLUE-layout folder: CoLA (header-less train/dev, test with index) and STS-B."""
    root = tmp_path_factory.mktemp("glue")
    (root / "CoLA").mkdir()
    for name, n, seed in (("train", 40, 0), ("dev", 12, 1)):
        rows = [f"src\t{int('cat' in s)}\t\t{s}\n" for s in _sentences(n, seed)]
        (root / "CoLA" / f"{name}.tsv").write_text("".join(rows))
    (root / "CoLA" / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, s in enumerate(_sentences(9, 2))))
    (root / "STS-B").mkdir()
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    for name, n, seed in (("train", 24, 3), ("dev", 8, 4)):
        a, b = _sentences(n, seed), _sentences(n, seed + 10)
        rows = [f"{i}\tg\tf\ty\t0\tn\tn\t{x}\t{y}\t{(i % 6) * 0.9:.3f}\n" for i, (x, y) in enumerate(zip(a, b))]
        (root / "STS-B" / f"{name}.tsv").write_text(head + "\tscore\n" + "".join(rows))
    return root


@pytest.fixture(scope="module")
def tokenizer(data_dir):
    return GPT1Tokenizer.train([_sentences(200, 9)], vocab_size=120)


def _finetune(tmp_path, data_dir, *extra, task="cola"):
    workdir = tmp_path / "run"
    argv = ["finetune", "--task", task, "--workdir", str(workdir), "--data-dir", str(data_dir), "--config", "tiny",
            "--tfds-dir", str(tmp_path / "tfds"), "--batch-size", "8", "--no-progress", *extra]
    if "--init" not in extra:
        argv += ["--init", "none"]
    assert cli.main(argv) == 0
    return workdir, json.loads((workdir / "results.json").read_text())


def test_finetune_from_scratch_writes_results_predictions_and_submission(tmp_path, data_dir):
    workdir, results = _finetune(tmp_path, data_dir, "--epochs", "2", "--predict-test", "--seed", "3",
                                 "--set", "optim.lr=1e-3")
    assert results["task"] == "cola" and results["seed"] == 3 and results["init"] == "none"
    assert results["metric_names"] == ["matthews_corr"] and -1 <= results["metrics"]["matthews_corr"] <= 1
    assert results["epoch"] in (1, 2) and len(results["history"]) == 2
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


def test_similarity_regression_without_aux_lm(tmp_path, data_dir):
    _, results = _finetune(tmp_path, data_dir, "--epochs", "1", "--lm-coef", "0", task="stsb")
    assert results["metric_names"] == ["pearson", "spearman"]
    assert results["config"]["lm_coef"] == 0.0


def _hf_dir(tmp_path, tok):
    from gpt1_jax import init_params, save_pretrained

    config = dataclasses.replace(model_preset("tiny"), vocab_size=tok.base_vocab_size)  # no marker rows yet
    params = init_params(config, 7)
    return save_pretrained(config, params, tmp_path / "hf"), config, params


def test_init_from_hf_dir_appends_the_marker_rows(tmp_path, data_dir, tokenizer):
    tok_path = tmp_path / "tok.json"
    tokenizer.save(tok_path)
    hf, config, params = _hf_dir(tmp_path, tokenizer)
    fcfg = FinetuneConfig(model=model_preset("tiny"))
    model_config, loaded, tok, _ = load_init(str(hf), fcfg, str(tok_path), lambda: [])
    model_config, loaded = with_marker_rows(model_config, loaded, tok, seed=0)
    table = np.asarray(loaded["tokens_embed"]["embedding"])
    assert model_config.vocab_size == tok.vocab_size == table.shape[0] == config.vocab_size + 3
    np.testing.assert_array_equal(table[:-3], np.asarray(params["tokens_embed"]["embedding"].value))
    assert 0.005 < table[-3:].std() < 0.05  # N(0, 0.02)
    _, results = _finetune(tmp_path, data_dir, "--init", str(hf), "--tokenizer", str(tok_path), "--epochs", "1")
    assert results["init"] == str(hf)
    # scratch:DIR = the same architecture and vocabulary, random weights (Table 5's no pre-training)
    scratch_config, none, _, described = load_init(f"scratch:{hf}", fcfg, str(tok_path), lambda: [])
    assert none is None and scratch_config.vocab_size == tok.vocab_size and described.startswith("scratch")


def test_init_errors(tmp_path, data_dir, tokenizer, capsys):
    hf, _, _ = _hf_dir(tmp_path, tokenizer)
    argv = ["finetune", "--task", "cola", "--workdir", str(tmp_path / "w"), "--data-dir", str(data_dir),
            "--tfds-dir", str(tmp_path / "tfds"), "--no-progress"]
    assert cli.main(argv + ["--init", str(hf)]) == 2
    assert "no tokenizer" in capsys.readouterr().err
    assert cli.main(argv + ["--init", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert cli.main(argv + ["--init", "none", "--task", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'nope'" in err and len(err.strip().splitlines()) == 1
    assert cli.main(argv + ["--init", "none", "--config", "tiny", "--batch-size", "6"]) == 2  # 8 devices
    assert "not divisible" in capsys.readouterr().err


def test_init_from_pretrain_workdir_restores_the_params(tmp_path, tokenizer):
    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.optim import OptimConfig
    from gpt1_jax.sharding import MeshConfig, make_mesh
    from gpt1_jax.step import Trainer

    config = dataclasses.replace(model_preset("tiny"), vocab_size=tokenizer.vocab_size)
    workdir = tmp_path / "pre"
    workdir.mkdir()
    trainer = Trainer(config, OptimConfig(total_steps=10, warmup_steps=1), make_mesh(MeshConfig()))
    state = trainer.init(seed=5)
    ckpt = Checkpointer(workdir / "checkpoints")
    ckpt.save(4, state, {"position": 0}, config)
    ckpt.close()
    save_yaml(FinetuneConfig(model=config), workdir / "config.yaml")  # any YAML with a `model` section
    tokenizer.save(workdir / "tokenizer.json")
    params, step = restore_params(workdir / "checkpoints", config)
    assert step == 4
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    model_config, loaded, tok, described = load_init(str(workdir), FinetuneConfig(), None, lambda: [])
    assert model_config.vocab_size == tok.vocab_size and "step 4" in described
    assert model_config.embd_dropout == 0.1  # run-time fields from the fine-tuning config


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


def test_bucket_len():
    assert [bucket_len(n, 64) for n in (1, 16, 17, 40, 63, 64)] == [16, 16, 32, 64, 64, 64]
    assert heads.max_segment_len(512) == 254


def test_glue_table_script_quick(tmp_path, data_dir):
    """experiments/glue/glue_table.py --quick: runs, then writes the markdown table beside the paper's numbers."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "experiments" / "glue" / "glue_table.py"
    out = tmp_path / "table"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--init", "none", "--tasks", "cola", "--seeds", "0",
                           "--data-dir", str(data_dir), "--out", str(out), "--", "--tfds-dir", str(tmp_path / "tfds")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (out / "table.md").read_text()
    assert "| cola | matthews_corr | 45.4 |" in table and (out / "full" / "cola" / "seed0" / "results.json").is_file()


def test_short_real_finetune_beats_the_majority_class(tmp_path, shared_dir):
    """Real SST-2 (4,000 training sentences, the whole dev set), tiny model from scratch, 250 steps."""
    workdir = tmp_path / "sst2"
    argv = ["finetune", "--task", "sst2", "--init", "none", "--config", "tiny", "--workdir", str(workdir),
            "--data-dir", str(shared_dir / "data" / "glue"), "--tfds-dir", str(tmp_path / "tfds"),
            "--max-train-examples", "4000", "--epochs", "2", "--lr", "3e-3", "--lm-coef", "0", "--no-progress"]
    assert cli.main(argv) == 0
    results = json.loads((workdir / "results.json").read_text())
    labels = [line.split("\t")[2] for line in (workdir / "predictions" / "validation.tsv").read_text().splitlines()[1:]]
    majority = max(labels.count(l) for l in set(labels)) / len(labels)
    assert len(labels) == 872 and majority < 0.52
    assert results["metrics"]["accuracy"] > majority + 0.05, (results["metrics"], majority)
