"""experiments.paper.run: the whole pipeline at --quick (tiny model, 20 updates, the fixtures' GLUE files, a
tiny RACE archive, two CPU devices) writes the release, every result file and plot, under OUT only; a second
run does no work; the release is what `gpt1-jax sample --init` reads. For time, Table 5 and Figure 2 (left)
run SST-2 only; the pieces the full run adds (the goal over five tasks, the CoLA threshold, batched continuation scoring) are
checked directly."""

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from experiments.paper import zeroshot


ROOT = Path(__file__).resolve().parents[2]


PAPER = ROOT / "experiments" / "paper"


WORDS = "the a cat dog sat ran on under mat log quickly slowly big small red blue house tree".split()


def _write_race(path: Path) -> Path:
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        for split in ("train", "dev"):
            for level in ("middle", "high"):
                for k in range(2):
                    article = " ".join(" ".join(rng.choice(WORDS, 6)) + "." for _ in range(8))
                    doc = {"id": f"{k}.txt", "article": article, "questions": ["what sat?", "who ran?"],
                           "options": [WORDS[:4], WORDS[4:8]], "answers": ["A", "C"]}
                    data = json.dumps(doc).encode()
                    info = tarfile.TarInfo(f"race/{split}/{level}/{k}.txt")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return path


def _snapshot(folder: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.exists() else {}


@pytest.fixture(scope="module")
def quick(tmp_path_factory, glue_dir):
    out = tmp_path_factory.mktemp("paper")
    argv = [sys.executable, "-m", "experiments.paper.run", "--quick", "--data-dir", str(glue_dir), "--race",
            str(_write_race(tmp_path_factory.mktemp("race") / "race.tar.gz")), "--out", str(out), "--tfds-dir", str(out / "tfds"),
            "--tasks", "sst2", "--layer-tasks", "sst2", "--cpu-devices", "2"]
    committed = {name: _snapshot(PAPER / name) for name in ("release", "results")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    # --cpu-devices: pre-training and the fine-tuning runs all train over both
    assert "over 2 devices" in done.stderr and "mesh {'data': 2," in done.stderr and "'data': 1," not in done.stderr
    assert {name: _snapshot(PAPER / name) for name in committed} == committed  # --quick never writes there
    # what the user sees: a line before the release's perplexity on novel text, each zero-shot checkpoint's line, and
    # one count over each stage's runs, each run announced once (Table 5's seed-0 run is in its grid and its seeds)
    stages = {part.split("\n", 1)[0]: part for part in re.split(r"^== ", done.stderr, flags=re.M)[1:]}
    assert "release: measuring the model card's perplexity on novel text" in stages["release"]
    assert "zeroshot: step 20: sst2 " in stages["zeroshot"] and "| 9/9 [" in stages["zeroshot"]
    counts = {name: re.findall(r"^\[(\d+)/(\d+)\] ", stages[name], re.M) for name in ("table5", "layers", "diagnosis")}
    assert counts == {"table5": [("1", "3"), ("2", "3"), ("3", "3")], "layers": [("1", "3"), ("2", "3"), ("3", "3")],
                      "diagnosis": [("1", "2"), ("2", "2")]}
    assert stages["layers"].count("done before") == 1  # the full arm's grid run, made by Table 5
    return out, argv


def test_quick_pipeline_writes_every_output(quick, glue_dir):
    out, _ = quick
    results = out / "results"
    for name in ("README.md", "timings.json", "pretrain.json", "pretrain_loss.png", "table5.json", "table5.md",
                 "table5.png", "lr_grid.json", "layers.json", "layers.png", "zeroshot.json", "zeroshot.png",
                 "diagnosis.json", "diagnosis.md"):
        assert (results / name).is_file(), name
    table = json.loads((results / "table5.json").read_text())
    assert list(table) == ["sst2"] and list(table["sst2"]) == ["full", "no_pretrain", "no_aux_lm"]
    assert all(len(scores) == 1 and 0 <= scores[0] <= 100 for scores in table["sst2"].values())
    layers = json.loads((results / "layers.json").read_text())["sst2"]
    assert list(layers["scores"]) == ["0", "1", "2"] and layers["metric"] == "accuracy"
    zs = json.loads((results / "zeroshot.json").read_text())
    assert sorted(zs["steps"], key=int) == ["5", "10", "20"]  # keep_steps of the quick recipe
    assert set(zs["steps"]["20"]) == {"sst2", "cola", "race"}
    assert zs["n"] == {"sst2": 3, "cola_train": 6, "cola": 3, "race": 8} and 50 <= zs["baseline"]["sst2"] <= 100  # the fixtures' rows
    timings = json.loads((results / "timings.json").read_text())["stages"]
    assert list(timings) == ["pretrain", "release", "zeroshot", "table5", "layers", "diagnosis"]
    diagnosis = json.loads((results / "diagnosis.json").read_text())
    assert diagnosis["max_train"] == 32 and set(diagnosis["tasks"]["sst2"]) == {"full", "no_pretrain"}
    lr_grid = json.loads((results / "lr_grid.json").read_text())
    for arm, found in diagnosis["tasks"]["sst2"].items():  # each arm at Table 5's lr for it, with its scores beside
        assert found["lr"] == lr_grid["sst2"][arm]["lr"] and found["table5"] == table["sst2"][arm]
        assert 0 <= found["score"] <= 100
    readme = (results / "README.md").read_text()
    assert "goal not assessed" in readme and str(ROOT) not in readme
    # the command that wrote them is this run's, with its own inputs and --out (it named the committed corpus)
    assert f"--budget quick --corpus default --data-dir {glue_dir.relative_to(ROOT)}" in readme
    assert f"--out {results.parent}" in readme


def test_release_is_a_hf_folder_that_sample_reads(quick):
    from gpt1_jax.tokenizer import find_tokenizer
    from gpt1_jax.weights import load_pretrained

    out, _ = quick
    release = out / "release"
    config, _ = load_pretrained(release)
    assert (config.n_layers, config.d_model) == (2, 64)
    assert find_tokenizer(None, release, model_vocab_size=config.vocab_size).vocab_size == config.vocab_size
    card = (release / "README.md").read_text()
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    assert "pretrain_step: 20" in card and f"exported from commit\n{head[:12]}" in card  # the card is exact:
    assert "20 updates of 8 x 64 tokens = 10,240 tokens seen" in card and "that saw 0.0M tokens" in card
    assert "--budget quick --corpus default" in card and "Python Software Foundation License" in card
    # a command that runs as written (the card's said "the zeroshot stage needs --race"): the stages that made it
    assert "--race " in card and f"--out {out} --stages pretrain,release" in card
    done = subprocess.run([sys.executable, "-m", "gpt1_jax.cli", "sample", "--init", str(release), "--prompt", "the",
                           "--max-new-tokens", "3", "--num-samples", "1"], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0 and "the >> " in done.stdout, done.stderr[-2000:]
    # its perplexity on novel text (RACE's dev passages, each once) is the one `evaluate` gives on the same file
    row = next(line for line in card.splitlines() if line.startswith("| novel text |"))
    assert "on RACE's 4 dev passages" in row and "64-token windows" in row
    done = subprocess.run([sys.executable, "-m", "gpt1_jax.cli", "evaluate", "--init", str(release), "--data",
                           str(out / "race_dev_passages.txt")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"perplexity {json.loads(done.stdout.splitlines()[-1])['perplexity']:.1f} on RACE" in row


def test_rerun_does_no_work(quick):
    out, argv = quick
    before = (out / "results" / "timings.json").read_text()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done before" in done.stderr and "trained to step 20" in done.stderr and "holds step 20" in done.stderr
    assert (out / "results" / "timings.json").read_text() == before  # no stage did any work


def test_kept_records_resume_the_sweeps_without_their_workdirs(quick):
    """A sweep that spans sessions (or a fresh clone) resumes from results/runs/, the records committed beside the
    results: with every fine-tuning workdir gone, the stages run nothing and give the same table."""
    import shutil

    out, argv = quick
    records = sorted((out / "results" / "runs").rglob("*.json"))
    # sst2 x 3 arms at seed 0; layers k=0, 1 (k=2 is the full arm's own run); diagnosis full and no_pretrain
    assert len(records) == 3 + 2 + 2
    assert all(str(ROOT) not in r.read_text() and "/tmp" not in r.read_text() for r in records)
    table = (out / "results" / "table5.json").read_text()
    curve = (out / "results" / "README.md").read_text().split("## Pre-training")[1].split("##")[0]
    for sweep in ("table5", "layers", "diagnosis", "pretrain"):  # the pre-training run too: results/ keeps its curve
        shutil.rmtree(out / sweep)
    done = subprocess.run(argv + ["--stages", "table5,layers,diagnosis"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finetune sst2:" not in done.stderr and "done before" in done.stderr  # no run started
    assert (out / "results" / "table5.json").read_text() == table
    assert "Validation perplexity" in curve
    assert (out / "results" / "README.md").read_text().split("## Pre-training")[1].split("##")[0] == curve


def test_continuation_logprobs_match_the_models_logits():
    import dataclasses

    import flax.linen as nn
    import jax

    from gpt1_jax.config import model_preset
    from gpt1_jax.model import init_params, lm_logits

    config = dataclasses.replace(model_preset("tiny"), n_positions=32)
    params = nn.meta.unbox(init_params(config, 0))
    rng = np.random.default_rng(0)
    pairs = [(list(rng.integers(1, 500, n)), list(rng.integers(1, 500, c))) for n, c in ((1, 5), (7, 1), (40, 3), (3, 20))]
    got = zeroshot.continuation_logprobs(config, params, pairs)
    for (context, continuation), (total, count) in zip(pairs, got):
        seq = (context + continuation)[-(config.n_positions + 1):]  # the context gives way
        logp = jax.nn.log_softmax(lm_logits(config, params, np.asarray([seq[:-1]])))[0]
        c = len(continuation)
        want = sum(float(logp[len(seq) - 1 - c + j, t]) for j, t in enumerate(continuation))
        assert count == c and total == pytest.approx(want, abs=1e-4)


def test_a_stopped_pretraining_is_kept_beside_the_results_and_a_fresh_clone_resumes_it(tmp_path, capsys):
    """Sessions end and their workdirs with them: a stopped pre-training keeps its newest checkpoint and run files
    in results/pretraining/ (committed), and the pretrain stage of an empty OUT resumes from that copy."""
    import dataclasses
    import shutil

    from experiments.paper import release
    from experiments.paper.settings import RECIPE, Paper
    from gpt1_jax import pretrain
    from gpt1_jax.metrics import read_metrics

    paper = Paper(out=tmp_path / "out", budget_name="quick", pretrain_config=str(RECIPE), tasks=("sst2",),
                  layer_tasks=("sst2",), corpus="default")
    config = release.pretrain_config(paper)  # 20 updates, checkpoints every 10 and at 5 (a zero-shot step)
    assert pretrain.run(dataclasses.replace(config, steps=15), paper.pretrain_dir).finished  # as if stopped at 15
    assert release.keep_pretraining(paper) == 15
    kept = release.kept_pretraining(paper)
    assert sorted(p.name for p in (kept / "checkpoints").iterdir()) == ["15"]  # the newest only, not 5 or 10
    assert sorted(p.name for p in kept.iterdir()) == sorted(["checkpoints", *release.KEPT_RUN_FILES])
    files = [f for f in (kept / "checkpoints").rglob("*") if f.is_file()]  # orbax names its folder in a marker file
    assert files and not [f for f in files if str(tmp_path).encode() in f.read_bytes()]
    info = (kept / "data_info.json").read_text()  # the run's, not the kept copy's, names its token cache
    assert "cache" in (paper.pretrain_dir / "data_info.json").read_text() and str(tmp_path) not in info
    (paper.pretrain_dir / "checkpoints" / "15").rename(tmp_path / "15-aside")  # a newer copy replaces it whole
    assert release.keep_pretraining(paper) == 10 and (kept / "checkpoints" / "10").is_dir()
    assert not (kept / "checkpoints" / "15").exists() and not kept.with_name("pretraining.old").exists()
    (tmp_path / "15-aside").rename(paper.pretrain_dir / "checkpoints" / "15")
    assert release.keep_pretraining(paper) == 15

    shutil.rmtree(paper.pretrain_dir)  # a fresh clone: only results/ is there
    assert release.pretrain_stage(paper) is True
    steps = [r["step"] for r in read_metrics(paper.pretrain_dir) if "loss" in r]
    assert steps[0] == 1 and steps[-1] == 20 and sorted(set(steps)) == list(range(1, 21))  # 1-15 kept, 16-20 new
    assert release.trained_step(paper.pretrain_dir) == 20 and not kept.exists()  # finished: nothing left to resume
    assert release.release_stage(paper) is True
    capsys.readouterr()
    assert release.pretrain_stage(paper) is False  # the run's own corpus: nothing to say of it
    assert "trained to step 20\n" in capsys.readouterr().err
    other = dataclasses.replace(paper, corpus="tfds:wikipedia")  # another text, which a finished run will not read
    assert release.pretrain_stage(other) is False
    assert "(--corpus tfds:wikipedia not read: the run trained on default; a new --out" in capsys.readouterr().err
    shutil.rmtree(paper.pretrain_dir)  # a fresh clone of the finished pipeline: its release says it is done
    assert release.pretrain_stage(other) is False and not paper.pretrain_dir.exists()
    assert "(--corpus tfds:wikipedia not read: the release is trained;" in capsys.readouterr().err


def test_options_sharing_their_context_score_as_separate_sequences_do():
    """option_logprobs runs a window-filling context once for its options (a KV cache): the same log-probabilities as
    each option after the same n_ctx - M context tokens, scored alone; shorter contexts are scored alone, whole."""
    import dataclasses

    import flax.linen as nn

    from gpt1_jax.config import model_preset
    from gpt1_jax.data.tasks import bucket_len
    from gpt1_jax.model import init_params

    config = dataclasses.replace(model_preset("tiny"), n_positions=64)
    params = nn.meta.unbox(init_params(config, 0))
    rng = np.random.default_rng(1)
    questions = [(list(rng.integers(1, 500, n)), [list(rng.integers(1, 500, c)) for c in lengths])
                 for n, lengths in ((200, (3, 1, 7, 2)), (60, (5, 5, 20, 1)), (10, (4, 2, 3, 9)), (70, (17, 2, 3, 4)))]
    got = zeroshot.option_logprobs(config, params, questions)
    assert got.shape == (4, 4, 2)
    for (context, options), scores in zip(questions, got):
        m = bucket_len(max(len(o) for o in options), 63)
        shared = context[-(64 - m):] if len(context) >= 64 - m else context  # the 10-token context is whole
        want = zeroshot.continuation_logprobs(config, params, [(shared, o) for o in options])
        np.testing.assert_allclose(scores[:, 1], [len(o) for o in options])
        np.testing.assert_allclose(scores[:, 0], want[:, 0], atol=2e-4)


@pytest.mark.parametrize("flags, message", [
    (["--tasks", "sst3"], "python -m experiments.paper.cost: error: unknown task 'sst3'; known: cola, sst2"),
    (["--tasks", "rte", "--release", "nowhere"],
     "python -m experiments.paper.cost: error: nowhere: no such checkpoint directory"),
    (["--train-tokens-per-s", "0"], "argument --train-tokens-per-s: must be a finite number > 0, got 0"),
    # README.md replaced by the numbers; a missing folder named a temp file, after the work
    (["--json", "README.md"], "--json README.md: exists and is not a .json file: it would be replaced"),
    (["--json", "nodir/x.json"], "--json nodir/x.json: its folder nodir does not exist"),
])
def test_the_cost_command_refuses_what_it_cannot_count_in_one_line(tmp_path, flags, message):
    """experiments.paper.cost ended in a traceback for an unknown task, a missing release, GLUE out of reach
    (offline, no --data-dir) and a zero throughput (ZeroDivisionError)."""
    (tmp_path / "glue").mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "experiments.paper.cost", "--data-dir", str(tmp_path / "glue"), *flags],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert message in done.stderr.splitlines()[-1]
