"""Tokenize once (gpt1_jax/data/once.py), with real processes on 127.0.0.1 and real files: two processes of
one job tokenise a corpus once and read the same cache; a process whose builder never comes, or whose
disk is not the builder's, fails with one line; separate jobs meet through a lock that a dead builder
cannot hold forever; and the `gpt1-jax tokenize` verb builds the cache a job then reuses. Seconds each.

Subprocesses run with JAX_PLATFORMS=cpu: with libtpu installed, every JAX process would otherwise try to
open the TPU (and its lock file) side by side."""

import json
import os
import time
from pathlib import Path

import pytest

from gpt1_jax import cli
from gpt1_jax import workdir as run_folder
from gpt1_jax.config import DataConfig
from gpt1_jax.data.once import Peers, build_once
from gpt1_jax.data.pipeline import build_pipeline
from gpt1_jax.data.sources import open_source
from gpt1_jax.data.tokens import tokenize_to_cache
from gpt1_jax.errors import ConfigError
from gpt1_jax.tokenizer import GPT1Tokenizer
from tests.support.killed import gone_pid
from tests.support.tokenize_once import ERROR, HeldLock, cache_name, corpus, tok_path  # noqa: F401 (pytest fixtures)


# --- separate jobs: the lock ------------------------------------------------------------------------
def test_a_live_lock_makes_a_lone_process_wait_then_fail_in_one_line(tmp_path, corpus, tok_path, capsys):
    cache = tmp_path / "cache"
    final = cache / cache_name(corpus, tok_path, tmp_path / "probe")
    with HeldLock(cache / f".{final.name}.lock"):
        status = cli.main(["tokenize", "--data", str(corpus), "--tokenizer", str(tok_path), "--cache-dir", str(cache),
                           "--wait", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith(ERROR), err
    assert "still being built by pid 4242 on elsewhere" in err and "(waited 1 s, data.cache_wait_s=1)" in err


def test_a_dead_builders_lock_goes_stale_and_is_taken_over(tmp_path, corpus, tok_path):
    cache = tmp_path / "cache"
    final = cache / cache_name(corpus, tok_path, tmp_path / "probe")
    lock = cache / f".{final.name}.lock"
    cache.mkdir()
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 4242, "started": 0}))  # nobody touches it
    t0 = time.monotonic()
    stream = tokenize_to_cache(open_source(str(corpus)), GPT1Tokenizer.load(tok_path), cache, progress=False,
                               wait_s=30, stale_s=0.5)
    # well under wait_s=30 (what waiting for the dead builder would cost), with room for a loaded machine
    assert not stream.from_cache and stream.path == final and time.monotonic() - t0 < 20
    assert sorted(p.name for p in cache.iterdir()) == [final.name]  # the stale lock is gone with ours


def test_a_builder_killed_on_this_host_is_not_waited_for(tmp_path, corpus, tok_path):
    """kill -9 during `gpt1-jax tokenize` left its lock, and the rerun waited the whole LOCK_STALE_S (125 s) in
    silence, and its half-written tokens for good: a lock whose holder ran on this host and is gone is broken at once,
    and the folder it was writing is removed."""
    import socket

    cache = tmp_path / "cache"
    final = cache / cache_name(corpus, tok_path, tmp_path / "probe")
    cache.mkdir()
    gone = gone_pid()
    (cache / f".{final.name}.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": gone,
                                                           "started": 0}))
    left = cache / f".tmp-{final.name}-{gone}-0123abcd"  # and the half-written tokens it left (13 MB there)
    left.mkdir()
    (left / "tokens.bin").write_bytes(b"\0" * 64)
    quiet = time.time() - 30
    os.utime(left / "tokens.bin", (quiet, quiet))
    os.utime(left, (quiet, quiet))
    t0 = time.monotonic()
    stream = tokenize_to_cache(open_source(str(corpus)), GPT1Tokenizer.load(tok_path), cache, progress=False, wait_s=60)
    assert not stream.from_cache and time.monotonic() - t0 < 20  # not LOCK_STALE_S (120 s)
    assert sorted(p.name for p in cache.iterdir()) == [final.name]


def test_builds_killed_of_any_corpus_are_swept_when_a_cache_is_read(tmp_path, corpus, tok_path):
    """Only the run's own corpus's half-written tokens were swept, and only when it built them: a build killed of a
    corpus not tokenized again kept its (gigabytes of) tokens.bin through every later run."""
    cache = tmp_path / "cache"
    tokenize_to_cache(open_source(str(corpus)), GPT1Tokenizer.load(tok_path), cache, progress=False)
    built = sorted(p.name for p in cache.iterdir())
    gone = gone_pid()
    quiet = time.time() - 30
    left = [cache / f".tmp-tokens-{'0f' * 8}-{gone}-0123abcd", cache / f".tmp-tokens-{'ab' * 8}-{os.getpid()}-0123abcd"]
    for folder in left:  # a killed build of another corpus; a live one (this process) is left alone
        folder.mkdir()
        (folder / "tokens.bin").write_bytes(b"\0" * 64)
        for path in (folder / "tokens.bin", folder):
            os.utime(path, (quiet, quiet))
    stream = tokenize_to_cache(open_source(str(corpus)), GPT1Tokenizer.load(tok_path), cache, progress=False)
    assert stream.from_cache and sorted(p.name for p in cache.iterdir()) == sorted(built + [left[1].name])


def test_a_builders_heartbeat_keeps_its_lock_alive_and_it_goes_after(tmp_path):
    lock, result, mtimes = tmp_path / ".x.lock", tmp_path / "x", []

    def build():
        for _ in range(6):
            time.sleep(0.1)
            mtimes.append(lock.stat().st_mtime_ns)
        result.write_text("done")
        return "built"

    out = build_once(result.is_file, build, lambda: "loaded", key="x", what="x", path=result, wait_s=5, remedy="",
                     lock=lock, peers=Peers(), heartbeat_s=0.05)
    assert out == "built" and len(set(mtimes)) >= 3 and not lock.exists()
    assert build_once(result.is_file, build, lambda: "loaded", key="x", what="x", path=result, wait_s=5, remedy="",
                      lock=lock, peers=Peers()) == "loaded"


# --- the verb ---------------------------------------------------------------------------------------
def test_tokenize_verb_builds_the_cache_pretrain_reads(tmp_path, corpus, tok_path, capsys):
    cache = tmp_path / "cache"
    argv = ["tokenize", "--data", str(corpus), "--tokenizer", str(tok_path), "--cache-dir", str(cache), "--no-progress"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"cache", "n_tokens", "n_docs", "bytes", "seconds", "from_cache"}
    path = Path(out["cache"])
    n_docs = sum(1 for _ in open_source(str(corpus)).documents())
    assert out["from_cache"] is False and out["n_docs"] == n_docs and path.parent == cache
    assert out["bytes"] == sum(f.stat().st_size for f in path.iterdir()) >= 2 * out["n_tokens"]
    assert cli.main(argv) == 0 and json.loads(capsys.readouterr().out)["from_cache"] is True
    # pretrain's data pipeline, with the same data.source / data.tokenizer / data.cache_dir: the same cache.
    config = DataConfig(source=str(corpus), tokenizer=str(tok_path), cache_dir=str(cache), progress=False)
    stream = build_pipeline(config, tmp_path / "run").stream
    assert stream.from_cache and stream.path == path and len(stream) == out["n_tokens"]


def test_a_corpus_the_tokenizer_cannot_read_is_said_when_it_is_tokenized(tmp_path, tok_path, capsys):
    """CJK text through a BPE trained on English: every token <unk>, and tokenize, then pretrain, went on without a
    word (a loss of 9.2, samples of <unk>)."""
    cjk = tmp_path / "cjk.txt"
    cjk.write_text("\n\n".join("漢字かな交じり文の段落 " * 20 for _ in range(30)) + "\n")
    argv = ["tokenize", "--data", str(cjk), "--tokenizer", str(tok_path), "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "tokens of " in err and "are <unk>: the tokenizer cannot read much of this text" in err


@pytest.mark.parametrize("case", ["missing data", "bad gzip", "missing tokenizer", "train without workdir"])
def test_tokenize_verb_bad_input_is_one_line_and_writes_nothing(tmp_path, corpus, tok_path, capsys, case):
    bad_gzip = tmp_path / "x.txt.gz"
    bad_gzip.write_bytes(b"not gzip at all" * 100)
    data, tokenizer, more, message = {
        "missing data": (tmp_path / "nope.txt", tok_path, [], "no such file or directory"),
        "bad gzip": (bad_gzip, tok_path, [], "x.txt.gz: not readable gzip data"),
        "missing tokenizer": (corpus, tmp_path / "nope.json", [], "expected 'train', a tokenizer .json"),
        "train without workdir": (corpus, "train", [], "--tokenizer train needs --workdir"),
    }[case]
    cache = tmp_path / "cache"
    status = cli.main(["tokenize", "--data", str(data), "--tokenizer", str(tokenizer), "--cache-dir", str(cache),
                       "--no-progress", *more])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith(ERROR) and message in err, err
    assert not [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else True


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    """A pre-training and a fine-tuning run folder, as run.json makes them, each with a checkpoint folder."""
    pre, fine = tmp_path / "pre", tmp_path / "fine"
    for run, record in ((pre, {"kind": "pretrain"}), (fine, {"kind": "finetune", "task": "rte", "init": "none"})):
        (run / "checkpoints" / "20").mkdir(parents=True)
        (run / run_folder.RUN_FILE).write_text(json.dumps(record))
    return pre, fine


@pytest.mark.parametrize("case", ["a file", "under a file", "a pre-training run", "its checkpoint", "a fine-tuning run",
                                  "its own workdir"])
def test_a_cache_dir_that_cannot_hold_a_cache_or_lies_in_a_run_is_refused_before_the_bpe_trains(
        tmp_path, corpus, capsys, monkeypatch, case):
    """A file as --cache-dir failed only when the trained BPE was kept (three lines, the workdir's tokenizer.json
    written); a run's folder (or the job's own workdir) took bpe-*/tokens-* folders with exit 0."""
    from gpt1_jax.data import tokens

    (tmp_path / "afile").write_text("not a folder")
    pre, fine = _runs(tmp_path)
    workdir = tmp_path / "w"
    cache, message = {
        "a file": ("afile", "afile (data.cache_dir, --cache-dir) is a file, not a folder: give another folder"),
        "under a file": ("afile/sub", f"lies under {tmp_path / 'afile'}, which is a file"),
        "a pre-training run": ("pre", f"lies in {pre}, the folder of a pre-training run: its bpe-*/tokens-* folders"),
        "its checkpoint": ("pre/checkpoints/20", f"lies in {pre}, the folder of a pre-training run"),
        "a fine-tuning run": ("fine/cache", f"lies in {fine}, the folder of a fine-tuning run of rte from none"),
        "its own workdir": ("w/cache", f"lies in --workdir {workdir}, the run's own folder"),
    }[case]
    monkeypatch.setattr(tokens, "_train_bpe", lambda *a, **k: pytest.fail("the BPE was trained"))
    status = cli.main(["tokenize", "--data", str(corpus), "--tokenizer", "train", "--workdir", str(workdir),
                       "--vocab-size", "300", "--cache-dir", str(tmp_path / cache), "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith(ERROR) and message in err, err
    assert not workdir.exists()
    assert [sorted(p.name for p in run.iterdir()) for run in (pre, fine)] == [["checkpoints", "run.json"]] * 2


def test_a_cache_beside_run_folders_and_the_default_one_are_taken(tmp_path, corpus, tok_path, capsys):
    from gpt1_jax.data.pipeline import default_cache_dir
    from gpt1_jax.data.tokens import check_cache_dir

    _runs(tmp_path)
    argv = ["tokenize", "--data", str(corpus), "--tokenizer", str(tok_path), "--cache-dir", str(tmp_path / "cache"),
            "--no-progress"]
    assert cli.main(argv) == 0 and Path(json.loads(capsys.readouterr().out)["cache"]).parent == tmp_path / "cache"
    check_cache_dir(default_cache_dir())
    check_cache_dir(tmp_path / "cache", tmp_path / "run")  # a workdir beside it


def test_pretrain_refuses_a_file_as_its_cache_dir_before_writing(tmp_path, capsys):
    (tmp_path / "afile").write_text("not a folder")
    status = cli.main(["pretrain", "--config", "tiny", "--workdir", str(tmp_path / "w"), "--steps", "2",
                       "--no-progress", "--set", f"data.cache_dir={tmp_path / 'afile'}"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "afile (data.cache_dir, --cache-dir) is a file" in err, err
    assert not (tmp_path / "w").exists()


def test_an_unwritable_cache_dir_is_refused_unless_it_holds_a_cache_to_read(tmp_path, monkeypatch):
    """Found before the BPE is trained; a read-only cache built ahead of the job (`gpt1-jax tokenize`) is still read.
    os.access is the check's: a test run as root may write anywhere."""
    from gpt1_jax.data.tokens import check_cache_dir

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    for cache in (tmp_path, tmp_path / "new"):
        with pytest.raises(ConfigError, match=rf"cannot be written \({tmp_path} is not writable\) and holds no token "):
            check_cache_dir(cache)
    (tmp_path / "tokens-0123").mkdir()
    check_cache_dir(tmp_path)
