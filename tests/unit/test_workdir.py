"""A run folder belongs to one job (gpt1_jax/workdir.py), a run's config.yaml is guarded by a digest
(gpt1_jax/config.py), and a trained BPE is kept only while it fits its corpus (gpt1_jax/data/tokens.py):
in-process, no training. The command-line cases are in test_pretrain.py and test_finetune.py."""

import dataclasses
import json
import os
from pathlib import Path

import pytest

from gpt1_jax import workdir as wd
from gpt1_jax.config import GUARD_LINE, FinetuneConfig, PretrainConfig, load_yaml, save_yaml
from gpt1_jax.data.sources import open_source
from gpt1_jax.data.tokens import tokenizer_for
from gpt1_jax.errors import ConfigError, DataError, WorkdirError
from gpt1_jax.evaluate import check_same_tokens
from gpt1_jax.tokenizer import GPT1Tokenizer
from tests.support.workdir import PRETRAIN


def snapshot(folder):
    """Every file's bytes: what 'nothing changed' means."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "config.yaml"
    save_yaml(dataclasses.replace(PretrainConfig(), checkpoint_every=25, eval_every=25), path)
    return path


def test_a_saved_config_round_trips_and_starts_with_the_guard(saved):
    text = saved.read_text()
    assert text.startswith(GUARD_LINE) and text.splitlines()[-1].startswith("# sha256 ")
    assert load_yaml(PretrainConfig, saved).checkpoint_every == 25
    assert not [p for p in saved.parent.iterdir() if p.name.endswith(".tmp")]  # written atomically


@pytest.mark.parametrize("damage, message", [
    (lambda t: t[: len(t) // 2], "is cut short"),  # cut mid-line
    (lambda t: "\n".join(t.splitlines()[:-4]) + "\n", "is cut short"),  # lost its last lines
    (lambda t: t[:-20] + "\n", "is damaged or was edited by hand"),  # cut inside the digest
    (lambda t: t.replace("checkpoint_every: 25", "checkpoint_every: 26"), "is damaged or was edited by hand"),
], ids=["cut-mid-line", "lost-last-lines", "cut-in-digest", "edited"])
def test_a_damaged_config_names_itself(saved, damage, message):
    saved.write_text(damage(saved.read_text()))
    with pytest.raises(ConfigError, match=message) as e:
        load_yaml(PretrainConfig, saved)
    assert str(saved) in str(e.value) and "\n" not in str(e.value)


def test_deleting_the_guard_line_accepts_a_hand_edit(saved):
    text = saved.read_text().removeprefix(GUARD_LINE).replace("checkpoint_every: 25", "checkpoint_every: 26")
    saved.write_text(text)
    assert load_yaml(PretrainConfig, saved).checkpoint_every == 26


def _claimed(folder, job, config):
    wd.claim(folder, job, config.model.architecture())
    save_yaml(config, folder / "config.yaml")
    return folder


def test_a_run_records_the_software_it_began_with_and_a_resume_keeps_that_record(tmp_path):
    import platform

    import jax
    import optax

    wd.claim(tmp_path, PRETRAIN, PretrainConfig().model.architecture())
    software = json.loads((tmp_path / wd.RUN_FILE).read_text())["software"]
    assert set(software) == {"gpt1-jax", *wd.VERSIONED, "python"}
    assert (software["jax"], software["optax"], software["python"]) == (
        jax.__version__, optax.__version__, platform.python_version())
    before = (tmp_path / wd.RUN_FILE).read_bytes()
    wd.claim(tmp_path, PRETRAIN, PretrainConfig().model.architecture())  # a resume: the record stays as written
    assert (tmp_path / wd.RUN_FILE).read_bytes() == before and wd.read(tmp_path) == PRETRAIN


def test_a_new_or_empty_folder_or_a_tokenizer_trained_ahead_is_free(tmp_path):
    assert wd.check(tmp_path / "new" / "run", PRETRAIN, "pretrain") is None
    assert wd.check(tmp_path, PRETRAIN, "pretrain") is None
    (tmp_path / "tokenizer.json").write_text("{}")
    assert wd.check(tmp_path, PRETRAIN, "pretrain") is None
    assert not (tmp_path / "new").exists()  # checking writes nothing


def test_refusals_name_the_folder_and_change_nothing(tmp_path):
    pre = _claimed(tmp_path / "pre", PRETRAIN, PretrainConfig())
    ft_job = wd.Identity("finetune", "rte", wd.init_identity(str(pre)))
    ft = _claimed(tmp_path / "ft", ft_job, FinetuneConfig(task="rte"))
    (tmp_path / "stranger").mkdir()
    (tmp_path / "stranger" / "notes.txt").write_text("mine")
    (tmp_path / "a-file").write_text("x")
    before = snapshot(tmp_path)
    cases = [
        (tmp_path / "a-file", PRETRAIN, {}, "is a file, not a folder"),
        (tmp_path / "a-file" / "run", PRETRAIN, {}, "is a file, not a folder"),
        (tmp_path / "stranger", PRETRAIN, {}, r"is not empty and holds no gpt1-jax run \(notes.txt\)"),
        (ft, PRETRAIN, {}, "holds a fine-tuning run of rte from"),
        (pre, ft_job, {}, "holds a pre-training run; finetune would overwrite it"),
        (pre, ft_job, {"init_path": pre}, "is the --init source"),
        (ft, dataclasses.replace(ft_job, task="mrpc"), {}, "not of mrpc"),
        (ft, dataclasses.replace(ft_job, init="none"), {}, "not from none"),
    ]
    for folder, job, kw, message in cases:
        with pytest.raises(WorkdirError, match=message) as e:
            wd.check(folder, job, "finetune" if job.kind == "finetune" else "pretrain", **kw)
        assert "\n" not in str(e.value)
    assert wd.check(ft, ft_job, "finetune") == ft_job  # the same job resumes
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere (and a child as nobody cannot run this venv's "
                                             "interpreter where it lives under /root)")
def test_an_unwritable_folder_is_refused_before_anything_runs(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(WorkdirError, match="is not writable"):
            wd.check(locked / "run", PRETRAIN, "pretrain")
    finally:
        locked.chmod(0o700)


def test_runs_from_before_run_json_are_recognised_by_their_config(tmp_path):
    save_yaml(FinetuneConfig(task="sst2"), tmp_path / "config.yaml")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    assert wd.read(tmp_path) == wd.Identity("finetune", "sst2")
    with pytest.raises(WorkdirError, match="holds a fine-tuning run of sst2"):
        wd.check(tmp_path, PRETRAIN, "pretrain")


@pytest.mark.parametrize("beside", ["params", "notes.md"])
def test_a_config_yaml_alone_is_not_a_run(tmp_path, beside):
    """A `convert --to jax` folder (config.yaml + params/) and a folder holding a hand-written config were taken for
    runs from before run.json: `pretrain` wrote its run into them and replaced their config.yaml."""
    save_yaml(PretrainConfig(), tmp_path / "config.yaml")
    (tmp_path / beside).mkdir() if beside == "params" else (tmp_path / beside).write_text("my notes")
    before = (tmp_path / "config.yaml").read_text()
    assert wd.read(tmp_path) is None
    with pytest.raises(WorkdirError, match=f"holds no gpt1-jax run \\(config.yaml, {beside}\\)"):
        wd.check(tmp_path, PRETRAIN, "pretrain")
    assert (tmp_path / "config.yaml").read_text() == before


def test_a_task_recorded_as_typed_is_the_same_task(tmp_path):
    """Runs made before the task was recorded in one spelling kept `RTE`: the same command was then refused as
    "a fine-tuning run of RTE ..., not of rte"."""
    (tmp_path / wd.RUN_FILE).write_text(json.dumps({"kind": "finetune", "task": "RTE", "init": "none"}))
    assert wd.check(tmp_path, wd.Identity("finetune", "rte", "none"), "finetune") == wd.Identity("finetune", "rte", "none")


@pytest.mark.parametrize("text", [b"", b"[1]", b'{"kind": "pre', b"\xff\xfe"])
def test_a_damaged_data_info_json_is_named(tmp_path, text):
    """evaluate and a fine-tuning rerun read data_info.json: empty, cut short, a list or not UTF-8, it ended in a
    JSONDecodeError, AttributeError or UnicodeDecodeError traceback."""
    (tmp_path / "data_info.json").write_bytes(text)
    with pytest.raises(WorkdirError, match="data_info.json is damaged"):
        check_same_tokens(tmp_path, "0" * 64)


def test_a_damaged_run_json_is_named(tmp_path):
    (tmp_path / wd.RUN_FILE).write_text('{"kind": "pre')
    with pytest.raises(WorkdirError, match="run.json is damaged"):
        wd.read(tmp_path)


def test_a_finetune_rerun_with_other_settings_is_refused(tmp_path):
    saved = FinetuneConfig(task="rte")
    wd.check_same_settings(tmp_path, dataclasses.replace(saved, keep_checkpoints=5, eval_batch_size=64), saved)
    with pytest.raises(WorkdirError, match=r"epochs=3 there, 4 now, optim.lr=6.25e-05 there, 0.001 now"):
        wd.check_same_settings(tmp_path, dataclasses.replace(saved, epochs=4, optim=dataclasses.replace(
            saved.optim, lr=1e-3)), saved)


def _corpus(path, words, n=60):
    path.write_text("\n\n".join(" ".join(words[(i + j) % len(words)] for j in range(30)) for i in range(n)))
    return open_source(str(path))


WORDS = "alpha beta gamma delta python code tree river stone light".split()


OTHER_WORDS = "zebra yak wolf vole urchin tapir seal rook quail puma".split()


def test_an_empty_corpus_leaves_no_tokenizer_and_a_changed_one_retrains(tmp_path):
    run = tmp_path / "run"
    (tmp_path / "c.txt").write_text("")
    with pytest.raises(DataError, match="has no documents"):
        tokenizer_for(open_source(str(tmp_path / "c.txt")), run, vocab_size=80)
    assert not run.exists()
    first = tokenizer_for(_corpus(tmp_path / "c.txt", WORDS), run, vocab_size=80)
    assert first.vocab_size > 10
    meta = json.loads((run / "tokenizer.meta.json").read_text())
    assert meta["n_docs"] == 60 and len(meta["sha256"]) == 64
    # The corpus changed and no checkpoint uses the BPE: retrained.
    second = tokenizer_for(_corpus(tmp_path / "c.txt", OTHER_WORDS), run, vocab_size=80)
    assert second.token_to_id("zebra</w>") is not None and first.token_to_id("zebra</w>") is None


def test_a_bpe_a_checkpoint_uses_is_kept_and_verified(tmp_path):
    run = tmp_path / "run"
    first = tokenizer_for(_corpus(tmp_path / "c.txt", WORDS), run, vocab_size=80)
    (run / "checkpoints" / "5").mkdir(parents=True)
    kept = tokenizer_for(_corpus(tmp_path / "c.txt", OTHER_WORDS), run, vocab_size=80)
    assert kept.backend.to_str() == first.backend.to_str()
    (run / "tokenizer.json").write_text((run / "tokenizer.json").read_text()[:-10])
    with pytest.raises(DataError, match="tokenizer.json is damaged"):
        tokenizer_for(open_source(str(tmp_path / "c.txt")), run, vocab_size=80)


def test_a_new_workdir_on_a_corpus_reads_the_bpe_trained_on_it_before(tmp_path, capsys):
    """HF's BpeTrainer is not deterministic (huggingface/tokenizers#1794): `pretrain --config small` in 8 fresh
    workdirs trained 8 different tokenizer.json, so two runs differing only in their optimizer read different
    tokens. The first BPE trained on a corpus is kept in the cache folder and copied by the runs after it."""
    from gpt1_jax.data.tokens import _kept_bpe

    source, cache = _corpus(tmp_path / "c.txt", WORDS), tmp_path / "cache"
    tokenizer_for(source, tmp_path / "a", vocab_size=80, cache_dir=cache)
    kept, = cache.glob("bpe-*")
    tokenizer_for(source, tmp_path / "b", vocab_size=80, cache_dir=cache, progress=True)
    assert (tmp_path / "b" / "tokenizer.json").read_bytes() == (tmp_path / "a" / "tokenizer.json").read_bytes()
    assert f"reusing the BPE trained before on {str(tmp_path / 'c.txt')!r} with vocab_size=80 ({kept})" in \
        capsys.readouterr().err
    assert json.loads((tmp_path / "b" / "tokenizer.meta.json").read_text())["n_docs"] == 60
    tokenizer_for(source, tmp_path / "c", vocab_size=70, cache_dir=cache)  # another size: a BPE of its own
    assert len(list(cache.glob("bpe-*"))) == 2
    (kept / "tokenizer.json").write_text("{}")  # damaged: trained again and kept in its place
    tokenizer_for(source, tmp_path / "d", vocab_size=80, cache_dir=cache)
    assert _kept_bpe(kept)[0].backend.to_str() == GPT1Tokenizer.load(tmp_path / "d" / "tokenizer.json").backend.to_str()
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == []


def test_a_bpe_from_before_fingerprints_is_retrained_while_no_checkpoint_uses_it(tmp_path):
    run = tmp_path / "run"
    tokenizer_for(_corpus(tmp_path / "c.txt", WORDS), run, vocab_size=80)
    (run / "tokenizer.meta.json").write_text(json.dumps({"source": str(tmp_path / "c.txt"), "vocab_size": 80}))
    stale = (run / "tokenizer.json").read_text()
    (run / "tokenizer.json").write_text(stale.replace("python", "pythn"))  # not what this corpus trains
    tokenizer_for(open_source(str(tmp_path / "c.txt")), run, vocab_size=80)
    assert "fingerprint" in json.loads((run / "tokenizer.meta.json").read_text())
    assert (run / "tokenizer.json").read_text() != stale.replace("python", "pythn")


def test_one_job_at_a_time_in_a_run_folder(tmp_path):
    """Two pre-trainings (or fine-tunings) on one folder both trained: metrics.jsonl with every step twice,
    interleaved, and saves failing under each other. The second is refused now; a holder that is gone is not
    waited for."""
    import socket
    import subprocess
    import sys
    import time

    from gpt1_jax.lockfile import LOCK_STALE_S

    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from gpt1_jax import workdir as wd\n"
                               f"with wd.hold({str(folder)!r}, 'pretrain'):\n    print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkdirError, match=rf"^{folder} is in use by pid {holder.pid} on {socket.gethostname()} "
                                               r"\(a job training there now\): wait for it to end, or stop it; "
                                               "finetune would write the same checkpoints and metrics$"):
            with wd.hold(folder, "finetune"):
                pass
    finally:
        holder.kill()  # kill -9: its lock stays behind, and its pid is gone
    # killed but not yet reaped by its parent (this process), a zombie: gone all the same (it held the rerun off)
    for _ in range(100):
        if b") Z" in Path(f"/proc/{holder.pid}/stat").read_bytes():
            break
        time.sleep(0.02)
    assert (folder / wd.LOCK_FILE).is_file()
    with wd.hold(folder, "pretrain"):
        assert json.loads((folder / wd.LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (folder / wd.LOCK_FILE).exists()
    holder.wait()

    # another host's lock: alive while it beats, broken once it has been silent for LOCK_STALE_S
    (folder / wd.LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "t"}))
    with pytest.raises(WorkdirError, match="is in use by pid 1 on elsewhere"):
        with wd.hold(folder, "pretrain"):
            pass
    old = time.time() - LOCK_STALE_S - 5
    os.utime(folder / wd.LOCK_FILE, (old, old))
    with wd.hold(folder, "pretrain"):
        pass
    assert not (folder / wd.LOCK_FILE).exists()
    # a folder the lock made for a job refused before its first write is not left behind
    with pytest.raises(RuntimeError):
        with wd.hold(tmp_path / "new", "pretrain"):
            raise RuntimeError("refused")
    assert not (tmp_path / "new").exists()


def test_a_workdir_that_is_a_link_to_nothing_is_named_as_such(tmp_path):
    """A dangling link was "cannot create the folder: File exists; it is a file"."""
    (tmp_path / "run").symlink_to(tmp_path / "gone")
    with pytest.raises(WorkdirError, match=r"run is a symbolic link to nothing \(.*gone does not exist"):
        wd.check(tmp_path / "run", wd.Identity("pretrain"), "pretrain")


def test_a_run_records_the_step_of_its_source_and_its_own_command_still_resumes_it(tmp_path):
    """Fine-tuning from a run recorded no step ("init": ".../pt"): seeds of a sweep started while it trained began
    from different checkpoints without a word. The step read is recorded now (`SOURCE step N`); the run's own
    command (no --step) is that source at that step, another step is refused."""
    source = tmp_path / "pt"
    run = tmp_path / "ft"
    wd.claim(run, wd.Identity("finetune", "rte", wd.init_identity(str(source), 6)), {})
    assert json.loads((run / wd.RUN_FILE).read_text())["init"] == f"{source.resolve()} step 6"
    assert wd.recorded_step(wd.read(run).init) == 6 and wd.recorded_step(str(source)) is None
    for step in (None, 6):
        job = wd.Identity("finetune", "rte", wd.init_identity(str(source), step))
        assert wd.check(run, job, "finetune") is not None
    with pytest.raises(WorkdirError, match=rf"holds a fine-tuning run of rte from {source.resolve()} step 6, not from "
                                           rf"{source.resolve()} step 8: choose another --workdir"):
        wd.check(run, wd.Identity("finetune", "rte", wd.init_identity(str(source), 8)), "finetune")
    with pytest.raises(WorkdirError, match="not from "):  # another source of the same name's start
        wd.check(run, wd.Identity("finetune", "rte", wd.init_identity(str(tmp_path / "p"))), "finetune")


def test_a_run_training_now_is_told_from_one_that_ended(tmp_path):
    """What fine-tuning asks of its --init run: is its newest checkpoint about to change (its run.lock held)?"""
    import socket
    import time

    from gpt1_jax.lockfile import LOCK_STALE_S

    folder = tmp_path / "pt"
    folder.mkdir()
    assert wd.training_now(folder) is None
    with wd.hold(folder, "pretrain"):
        assert wd.training_now(folder) == f"pid {os.getpid()} on {socket.gethostname()}"
    assert wd.training_now(folder) is None
    (folder / wd.LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "t"}))
    assert wd.training_now(folder) == "pid 1 on elsewhere"
    old = time.time() - LOCK_STALE_S - 5
    os.utime(folder / wd.LOCK_FILE, (old, old))
    assert wd.training_now(folder) is None  # silent too long: gone, as `hold` breaks it
