"""`gpt1-jax pretrain` end to end, in real subprocesses: falling loss, exact resume after kill -9 and SIGTERM,
mismatched workdirs, NaN stops, resharding on restore, and `evaluate`."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpt1_jax.metrics import read_metrics
from tests.support.pretrain import assert_same_tree, cache, cli  # noqa: F401 (pytest fixtures)


TIMEOUT = 300


# One real CPU device unless a test asks for more (conftest gives this process 8 fake ones).


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, **kw)


def tiny(workdir, cache, *more):
    return cli("pretrain", "--config", "tiny", "--steps", "12", "--set", "checkpoint_every=4", "--set", "eval_every=6",
               *more, workdir=workdir, cache=cache)


def losses(workdir):
    return {r["step"]: r["loss"] for r in read_metrics(workdir) if "loss" in r}


def final_params(workdir):
    import orbax.checkpoint as ocp

    ckpt_dir = Path(workdir) / "checkpoints"
    step = max(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit())
    with ocp.StandardCheckpointer() as c:
        state = c.restore(ckpt_dir.absolute() / str(step) / "state")
    return step, state["params"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache):
    """One uninterrupted 12-step run that the interrupted ones must reproduce bit for bit."""
    workdir = tmp_path_factory.mktemp("reference")
    done = run(tiny(workdir, cache))
    assert done.returncode == 0, done.stderr[-3000:]
    # The bar sat silent at 0/12 through step 1's compilation, and frozen through each evaluation: it says them.
    lines = [l.strip() for l in done.stderr.replace("\r", "\n").splitlines() if l.strip()]
    assert any(l.endswith(", compiling]") for l in lines), lines
    evaluated = [i for i, l in enumerate(lines) if l.startswith("step ") and "val_loss" in l]
    assert len(evaluated) == 2 and all(lines[i - 1].endswith(", evaluating validation]") for i in evaluated), lines
    return workdir


def test_run_writes_everything_and_learns(reference):
    names = {p.name for p in reference.iterdir()}
    assert {"config.yaml", "tokenizer.json", "metrics.jsonl", "checkpoints", "tensorboard", "loss.png"} <= names
    assert list((reference / "tensorboard").glob("events.out.tfevents.*"))
    steps = losses(reference)
    assert sorted(steps) == list(range(1, 13))
    first, last = np.mean([steps[s] for s in (1, 2, 3)]), np.mean([steps[s] for s in (10, 11, 12)])
    assert last < first - 0.3, (first, last)
    val = [r for r in read_metrics(reference) if "val_loss" in r]
    assert [r["step"] for r in val] == [6, 12] and all(r["val_ppl"] > 1 for r in val)
    assert sorted(int(p.name) for p in (reference / "checkpoints").iterdir() if p.name.isdigit()) == [4, 8, 12]


def test_rerun_of_a_finished_run_changes_nothing(reference, cache):
    before = (reference / "metrics.jsonl").read_text()
    done = run(tiny(reference, cache))
    assert done.returncode == 0 and "nothing to do" in done.stderr and "not applied" not in done.stderr
    assert (reference / "metrics.jsonl").read_text() == before
    # settings given to a finished run were dropped without a word (the README's bf16 line, after its demo)
    done = run(tiny(reference, cache, "--set", "optim.lr=6e-4"))
    assert done.returncode == 0 and (f"{reference}: already trained to step 12 of 12; nothing to do (not applied: "
                                     "optim.lr=0.003 there, 0.0006 now; a new --workdir trains with them)") in done.stderr
    assert (reference / "metrics.jsonl").read_text() == before


def test_a_torn_metrics_line_and_a_missing_plot_are_mended_by_the_same_command(reference, cache, tmp_path):
    """A full disk (or a kill) tore metrics.jsonl's last line, and every resume then ended in a JSONDecodeError
    traceback, though the error had said the same command resumes; a kill between the last save and the plot left
    no loss.png, and the rerun said "nothing to do" without drawing it."""
    import shutil

    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    (workdir / "loss.png").unlink()
    done = run(tiny(workdir, cache))
    assert done.returncode == 0 and "nothing to do" in done.stderr and (workdir / "loss.png").is_file(), done.stderr
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "loss": 4.2, "mfu":')
    done = run(tiny(workdir, cache, "--steps", "14"))
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(losses(workdir)) == list(range(1, 15)) and len([r for r in records if "loss" in r]) == 14


def test_a_deleted_config_yaml_is_named_on_resume(reference, cache, tmp_path, capsys):
    """It was blamed on the tokenizer's vocab_size, and following that advice on another model's n_positions."""
    import shutil

    from gpt1_jax import cli

    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    (workdir / "config.yaml").unlink()
    assert cli.main(["pretrain", "--workdir", str(workdir), "--steps", "14", "--set", f"data.cache_dir={cache}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt1-jax pretrain: error: {workdir} holds checkpoints but no config.yaml (deleted?): restore it, or give "
        "the run's own --config and flags to resume it")


def start(argv, log):
    """A background run whose stderr goes to a file (a pipe nobody reads could fill and block it)."""
    return subprocess.Popen(argv, stderr=open(log, "w"), stdout=subprocess.DEVNULL, text=True)


def wait_for_step(workdir, step, proc, deadline=TIMEOUT):
    t0 = time.time()
    while time.time() - t0 < deadline:
        if any(s >= step for s in losses(workdir)) if (workdir / "metrics.jsonl").exists() else False:
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early with status {proc.returncode}")
        time.sleep(0.05)
    raise AssertionError("timed out waiting for the run")


@pytest.mark.parametrize("kill_after", [5, 9], ids=["between-saves", "after-second-save"])
def test_kill_9_then_resume_is_bit_identical(reference, tmp_path, cache, kill_after):
    workdir = tmp_path / "run"
    # Save every step so the kill lands in or right after an asynchronous save.
    argv = tiny(workdir, cache, "--set", "checkpoint_every=1")
    proc = start(argv, tmp_path / "log")
    try:
        wait_for_step(workdir, kill_after, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    resumed = run(tiny(workdir, cache, "--set", "checkpoint_every=1"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step" in resumed.stderr
    assert losses(workdir) == losses(reference)
    step_a, params_a = final_params(reference)
    step_b, params_b = final_params(workdir)
    assert step_a == step_b == 12
    assert_same_tree(params_a, params_b)


def test_sigterm_saves_and_exits_0(tmp_path, cache, reference):
    workdir = tmp_path / "run"
    proc = start(tiny(workdir, cache), tmp_path / "log")
    wait_for_step(workdir, 2, proc)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    err = (tmp_path / "log").read_text()
    assert proc.returncode == 0, err[-2000:]
    assert "preempted: checkpoint saved at step" in err
    saved = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert 2 <= saved < 12
    resumed = run(tiny(workdir, cache))
    assert resumed.returncode == 0 and losses(workdir) == losses(reference)


def test_a_second_job_on_a_training_runs_folder_is_refused(tmp_path, cache):
    """Two pre-trainings on one folder both trained: every step twice in metrics.jsonl, saves failing under each
    other (and one rewrote config.yaml under the other). The second is one line now, and the first goes on."""
    import socket

    workdir = tmp_path / "run"
    first = start(tiny(workdir, cache, "--steps", "400"), tmp_path / "log")
    try:
        wait_for_step(workdir, 2, first)
        done = run(tiny(workdir, cache, "--steps", "200"))
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1] == (
            f"gpt1-jax pretrain: error: {workdir} is in use by pid {first.pid} on {socket.gethostname()} (a job "
            "training there now): wait for it to end, or stop it; pretrain would write the same checkpoints and metrics")
        assert first.poll() is None
    finally:
        first.kill()
        first.wait()
    steps = [r["step"] for r in read_metrics(workdir) if "loss" in r]
    assert steps == list(range(1, len(steps) + 1))  # one job's steps, once each


def test_workdir_of_another_model_is_refused(reference, cache, tmp_path):
    before = {p: p.read_bytes() for p in [reference / "config.yaml", reference / "metrics.jsonl"]}
    done = run(tiny(reference, cache, "--set", "model.d_model=128", "--steps", "20"))
    assert done.returncode == 2
    lines = [l for l in done.stderr.splitlines() if l.strip()]
    assert lines[-1].startswith("gpt1-jax pretrain: error:") and "d_model 64 (checkpoint) vs 128 (requested)" in lines[-1]
    assert all(p.read_bytes() == b for p, b in before.items())


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, cache):
    workdir = tmp_path / "run"
    done = run(tiny(workdir, cache, "--set", "optim.lr=1e9", "--set", "optim.clip_norm=0", "--set", "checkpoint_every=1"))
    assert done.returncode == 1, done.stderr[-2000:]
    # a gradient norm that is not finite stops it too, one step sooner than the loss it makes (gpt1_jax/loop.py)
    assert re.search(r"error: (loss|grad_norm) is (nan|inf)", done.stderr), done.stderr[-2000:]
    bad = max(losses(workdir))
    saved = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert saved and max(saved) == bad - 1


def test_resume_on_another_mesh(reference, tmp_path, cache):
    """The first third of the run on 1 device, the rest on 4 fake devices with FSDP: the same losses (to fp32
    rounding). The first third is the reference's own (1 device), as a run stopped after its step-4 save
    leaves it: later checkpoints and metric lines gone."""
    import shutil

    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    for p in (workdir / "checkpoints").iterdir():
        if p.name.isdigit() and int(p.name) > 4:
            shutil.rmtree(p)
    kept = [l for l in (workdir / "metrics.jsonl").read_text().splitlines() if json.loads(l).get("step", 0) <= 4]
    (workdir / "metrics.jsonl").write_text("".join(l + "\n" for l in kept))
    assert sorted(losses(workdir)) == [1, 2, 3, 4]
    second = run(tiny(workdir, cache, "--simulate-devices", "4", "--mesh", "data=2,fsdp=2"))
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming at step 4" in second.stderr
    a, b = losses(reference), losses(workdir)
    assert sorted(b) == list(range(1, 13))
    np.testing.assert_allclose([b[s] for s in range(1, 13)], [a[s] for s in range(1, 13)], rtol=2e-4)
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [4, 8, 12]


def test_evaluate_verb(reference, cache):
    done = run(cli("evaluate", "--data", "default", workdir=reference, cache=cache))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["step"] == 12 and result["tokens"] > 1000
    assert np.isclose(result["perplexity"], np.exp(result["loss"]), rtol=1e-6) and result["loss"] < 6.3


def test_bad_data_source_is_one_clear_line(tmp_path, cache):
    done = run(tiny(tmp_path / "run", cache, "--data", str(tmp_path / "missing-*.txt")))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("gpt1-jax pretrain: error:")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_one_window_corpus_with_evaluations_on_says_why(tmp_path, cache, vocab_dir):
    """It blamed data.val_fraction (already above 0): one window is too few to hold one out."""
    corpus = tmp_path / "one.txt"
    corpus.write_text(" ".join(["the"] * 100) + "\n")
    done = run(cli("pretrain", "--config", "tiny", "--data", str(corpus), "--set", f"data.tokenizer={vocab_dir}",
                   "--set", "data.global_batch_size=1", workdir=tmp_path / "run", cache=cache))
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        "gpt1-jax pretrain: error: eval_every=25 evaluates on validation windows, and this corpus makes 1 window of "
        "65 tokens, too few to hold one out: give more text or a shorter seq_len, or eval_every=0"), done.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_run_saving_every_step_with_one_kept_is_read_while_it_trains(tmp_path, cache):
    """keep_checkpoints=1: the checkpoint a reader picked was deleted under it as the run saved the next, and
    sample/evaluate ended in orbax tracebacks (4 and 5 of 12 tries). The reader now reads the new newest one,
    and the failed read's abandoned shard reads no longer print a page each when garbage-collected later
    ("Exception ignored in: <coroutine object _read_array_index_and_device_put>", 27 in one suite run)."""
    import gc

    from gpt1_jax.weights import load_pretrained

    workdir = tmp_path / "run"
    proc = start(tiny(workdir, cache, "--steps", "5000", "--set", "checkpoint_every=1", "--set", "keep_checkpoints=1",
                      "--set", "eval_every=0"), tmp_path / "log")
    try:
        wait_for_step(workdir, 3, proc)
        for read in range(8):
            load_pretrained(workdir)  # raised in ~40% of reads
        gc.collect()  # the cut reads' abandoned shard reads close here: none may reach pytest's hook (an error here)
        for read in range(2):  # and the verbs, which picked the step themselves and never read the next
            done = run([sys.executable, "-m", "gpt1_jax.cli", "sample", "--workdir", str(workdir), "--prompt", "the",
                        "--max-new-tokens", "2"])
            assert done.returncode == 0, done.stderr[-2000:]
        assert proc.poll() is None, "the run ended before the reads did: they raced with nothing"
    finally:
        proc.kill()
        proc.wait()


def test_sample_verb(reference, cache):
    done = run([sys.executable, "-m", "gpt1_jax.cli", "sample", "--workdir", str(reference), "--prompt", "the python",
                "--max-new-tokens", "8", "--num-samples", "2"])
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("# ") and "step 12" in lines[0]
    assert len(lines) == 3 and all(l.startswith("the python >> ") and len(l) > len("the python >> ") for l in lines[1:])


def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_finetuning_into_its_own_init_run_is_refused_and_changes_nothing(reference, capsys):
    from gpt1_jax import cli

    before = snapshot(reference)
    status = cli.main(["finetune", "--task", "rte", "--init", str(reference), "--workdir", str(reference),
                       "--data-dir", str(reference / "nowhere")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1] == (f"gpt1-jax finetune: error: --workdir {reference} is the --init source: finetune "
                                       "would overwrite the run it starts from; choose another --workdir")
    assert snapshot(reference) == before


@pytest.mark.parametrize("damage", [lambda t: t[: len(t) // 2], lambda t: "\n".join(t.splitlines()[:-3]) + "\n"],
                         ids=["cut-mid-line", "lost-last-lines"])
def test_a_damaged_config_yaml_is_named_not_replaced_by_defaults(reference, tmp_path, cache, capsys, damage):
    import shutil

    from gpt1_jax import cli

    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    (workdir / "config.yaml").write_text(damage((workdir / "config.yaml").read_text()))
    before = snapshot(workdir)
    status = cli.main(["pretrain", "--workdir", str(workdir), "--steps", "14", "--set", f"data.cache_dir={cache}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1] == (f"gpt1-jax pretrain: error: {workdir}/config.yaml is cut short (its closing "
                                       "sha256 line is missing): restore it from a copy, or start a new run in another "
                                       "folder")
    assert snapshot(workdir) == before


def _other_corpus(folder: Path) -> Path:
    rng = np.random.default_rng(1)
    words = np.array(["alpha", "beta", "gamma", "delta", "module", "function", "returns", "the", "a", "value"])
    path = folder / "other.txt"
    path.write_text("\n\n".join(" ".join(rng.choice(words, 300)) for _ in range(40)) + "\n")
    return path


@pytest.mark.parametrize("flags, message", [
    (["--seq-len", "32"], "holds a pre-training run on other data (data.seq_len=64 there, 32 now): its checkpoints "
                          "continue only the batches they began; repeat the run's own flags"),
    (["--batch-size", "4"], "holds a pre-training run on other data (data.global_batch_size=8 there, 4 now)"),
    (["--data", "{other}"], "the checkpoint was saved with training windows "),
    # it drew the weights and draws each step's dropout masks: config.yaml recorded a seed that had not made them
    (["--set", "seed=5"], "holds a pre-training run of another seed or data (seed=0 there, 5 now)"),
], ids=["seq-len", "batch-size", "corpus", "seed"])
def test_a_resume_on_other_data_is_refused_and_leaves_the_run_as_it_was(reference, tmp_path, cache, capsys, flags,
                                                                        message):
    """Refused once config.yaml (with a fresh digest), data_info.json, metrics.jsonl and the TensorBoard events had
    been rewritten for the new flags: from then on the run's own command was refused too, and `verify` said ok."""
    import shutil

    from gpt1_jax import cli

    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    before = snapshot(workdir)
    flags = [f.format(other=_other_corpus(tmp_path)) for f in flags]
    status = cli.main(["pretrain", "--workdir", str(workdir), "--steps", "14", "--set", f"data.cache_dir={cache}", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1].startswith("gpt1-jax pretrain: error: ") and message in err[-1], err[-3:]
    assert snapshot(workdir) == before


def test_a_relative_corpus_read_from_another_folder_is_refused_by_resume_and_evaluate(tmp_path, cache):
    """`--data corpus.txt` is kept as typed; from another folder it names another file. With one word changed
    there (as many windows), the resume trained on it and exited 0, and evaluate scored the other file's
    "validation split" under the run's data name. The tokens' digest now tells, whatever the path."""
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir(), other.mkdir()
    text = _other_corpus(first).read_text()
    (first / "corpus.txt").write_text(text)
    (other / "corpus.txt").write_text(text.replace("alpha", "omega", 1))
    workdir = first / "run"
    argv = cli("pretrain", "--config", "tiny", "--data", "corpus.txt", "--steps", "2", "--set", "checkpoint_every=2",
               "--set", "eval_every=0", workdir=workdir, cache=cache)
    assert run(argv, cwd=first).returncode == 0
    before = snapshot(workdir)
    resumed = run(cli("pretrain", "--steps", "4", workdir=workdir, cache=cache), cwd=other)
    assert resumed.returncode == 2 and "saved on other tokens than this run's data gives" in resumed.stderr.splitlines()[-1]
    scored = run(cli("evaluate", workdir=workdir, cache=cache), cwd=other)
    assert scored.returncode == 2 and "corpus gives other tokens now than the run trained on" in scored.stderr.splitlines()[-1]
    assert snapshot(workdir) == before
    assert run(cli("pretrain", "--steps", "4", workdir=workdir, cache=cache), cwd=first).returncode == 0  # its own folder


def test_a_given_tokenizer_is_copied_into_the_workdir_so_the_workdir_alone_is_the_model(tmp_path, cache, vocab_dir):
    """data.tokenizer=PATH: the run keeps a copy, so `sample --init WORKDIR` (and evaluate, finetune, the paper's
    zero-shot stage) find the tokenizer without the path the config named. A BPE trained in the folder before
    (`tokenize --tokenizer train --workdir`) left its sha256 record, which then called the copy damaged."""
    from gpt1_jax.tokenizer import GPT1Tokenizer, find_tokenizer

    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "tokenizer.meta.json").write_text('{"vocab_size": 80, "sha256": "0000"}')
    done = run(cli("pretrain", "--config", "tiny", "--steps", "2", "--set", f"data.tokenizer={vocab_dir}",
                   workdir=workdir, cache=cache))
    assert done.returncode == 0, done.stderr[-3000:]
    given, kept = GPT1Tokenizer.from_path(vocab_dir), find_tokenizer(None, workdir)
    text = "The cat sat on the mat, quickly."
    assert kept is not None and kept.vocab_size == given.vocab_size and kept.encode(text) == given.encode(text)
    done = run([sys.executable, "-m", "gpt1_jax.cli", "sample", "--init", str(workdir), "--prompt", "the",
                "--max-new-tokens", "2", "--num-samples", "1"])
    assert done.returncode == 0 and "the >> " in done.stdout, done.stderr[-2000:]
