"""Tokenize once (gpt1_jax/data/once.py), with real processes on 127.0.0.1 and real files: two processes of
one job tokenise a corpus once and read the same cache; a process whose builder never comes, or whose
disk is not the builder's, fails with one line; separate jobs meet through a lock that a dead builder
cannot hold forever; and the `gpt1-jax tokenize` verb builds the cache a job then reuses. Seconds each.

Subprocesses run with JAX_PLATFORMS=cpu: with libtpu installed, every JAX process would otherwise try to
open the TPU (and its lock file) side by side."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.env import xla_flags
from tests.support.tokenize_once import ERROR, HeldLock, cache_name, corpus, tok_path  # noqa: F401 (pytest fixtures)


REPO = Path(__file__).resolve().parents[2]


LAUNCHER = REPO / "launch" / "local.py"


TIMEOUT = 120  # every subprocess is bounded; each test takes seconds


WAIT_S = 3  # data.cache_wait_s in the tests that time out


def env(**more) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPT1_")}
    base.update(JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(1), PYTHONUNBUFFERED="1")
    return {**base, **more}


def tokenize_argv(corpus, tokenizer, cache_dir, *more) -> list[str]:
    return [sys.executable, "-m", "gpt1_jax.cli", "tokenize", "--data", str(corpus), "--tokenizer", str(tokenizer),
            "--cache-dir", str(cache_dir), *more]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_job(argvs: list[list[str]], logs: Path) -> list[subprocess.Popen]:
    """Process i of a 2-process jax.distributed job runs argvs[i] (the launcher gives all the same argv)."""
    port, procs = free_port(), []
    for i, argv in enumerate(argvs):
        e = env(GPT1_COORDINATOR=f"127.0.0.1:{port}", GPT1_NUM_PROCESSES=str(len(argvs)), GPT1_PROCESS_ID=str(i))
        procs.append(subprocess.Popen(argv, env=e, stdout=open(logs / f"p{i}.out", "w"),
                                      stderr=open(logs / f"p{i}.err", "w")))
    return procs


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(ERROR)]


def json_lines(out: str, prefix: str) -> list[dict]:
    return [json.loads(line[len(prefix):]) for line in out.splitlines() if line.startswith(prefix + "{")]


# --- one job, two processes ------------------------------------------------------------------------
def test_two_processes_tokenize_once_and_read_the_same_cache(tmp_path, corpus, tok_path):
    cache = tmp_path / "cache"
    cmd = [sys.executable, str(LAUNCHER), "-n", "2", "--grace", "10", "--",
           *tokenize_argv(corpus, tok_path, cache, "--no-progress")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    p0, p1 = json_lines(done.stdout, "[p0] "), json_lines(done.stdout, "[p1] ")
    assert len(p0) == len(p1) == 1, done.stdout
    # Tokenised exactly once, by process 0; process 1 read what process 0 wrote.
    assert [p0[0]["from_cache"], p1[0]["from_cache"]] == [False, True], done.stdout
    assert p0[0]["cache"] == p1[0]["cache"] and p0[0]["n_tokens"] == p1[0]["n_tokens"] > 500_000
    assert [p.name for p in cache.iterdir()] == [Path(p0[0]["cache"]).name]  # no temporary, no lock left
    meta = json.loads((Path(p0[0]["cache"]) / "meta.json").read_text())
    assert meta["built_by"]["process_index"] == 0 and meta["n_tokens"] == p0[0]["n_tokens"]


def test_two_processes_train_the_bpe_once(tmp_path, corpus):
    """data.tokenizer=train: process 0 trains it into the workdir, process 1 waits for it and uses it."""
    cache, workdir = tmp_path / "cache", tmp_path / "run"
    cmd = [sys.executable, str(LAUNCHER), "-n", "2", "--grace", "10", "--",
           *tokenize_argv(corpus, "train", cache, "--workdir", str(workdir), "--vocab-size", "300")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    p0, p1 = json_lines(done.stdout, "[p0] ")[0], json_lines(done.stdout, "[p1] ")[0]
    # Process 1 waits for the BPE (then, most often, for the tokens); process 0 never waits.
    waited = [line for line in done.stdout.splitlines() if "waiting up to" in line]
    assert waited and all(line.startswith("[p1] ") for line in waited), done.stdout
    assert "process 0 to build the BPE tokenizer" in waited[0], waited
    assert (p0["cache"], p0["from_cache"], p1["from_cache"]) == (p1["cache"], False, True)  # same tokenizer => key
    assert sorted(p.name for p in workdir.iterdir()) == ["tokenizer.json", "tokenizer.meta.json"]


def test_a_waiter_whose_builder_never_comes_fails_in_one_line(tmp_path, corpus, tok_path):
    """Process 0 cannot build (another job holds the cache's lock, alive): both processes give up after
    data.cache_wait_s, each with one error line naming the cache, the wait and what to do."""
    cache = tmp_path / "cache"
    final = cache / cache_name(corpus, tok_path, tmp_path / "probe")
    argv = tokenize_argv(corpus, tok_path, cache, "--no-progress", "--wait", str(WAIT_S))
    with HeldLock(cache / f".{final.name}.lock"):
        t0 = time.monotonic()
        procs = start_job([argv, argv], tmp_path)
        try:
            codes = [p.wait(timeout=TIMEOUT) for p in procs]
        finally:
            for p in procs:
                p.kill()
        elapsed = time.monotonic() - t0
    errs = [(tmp_path / f"p{i}.err").read_text() for i in range(2)]
    assert codes == [2, 2], errs
    assert WAIT_S <= elapsed < WAIT_S + 30, elapsed
    # Process 1 gives up on its own clock, or first hears process 0's failure and passes it on: a race.
    whys = (("still being built by pid 4242 on elsewhere",),
            ("process 0 did not build it", "process 1: process 0 failed: "))
    for err, why in zip(errs, whys):
        lines = error_lines(err)
        assert len(lines) == 1, err
        assert str(final) in lines[0] and any(w in lines[0] for w in why), lines[0]
        assert f"(waited {WAIT_S} s, data.cache_wait_s={WAIT_S})" in lines[0], lines[0]
        assert "put data.cache_dir on a disk every host shares" in lines[0] and "gpt1-jax tokenize" in lines[0]
    assert not final.exists()


def test_a_host_that_does_not_see_process_0s_disk_says_so(tmp_path, corpus, tok_path):
    """Disks not shared (here: each process its own cache dir): process 0 builds, process 1 learns it is
    done but cannot see it, and fails in one line naming both paths, without waiting an hour."""
    argvs = [tokenize_argv(corpus, tok_path, tmp_path / f"disk{i}", "--no-progress", "--wait", "6")
             for i in range(2)]
    procs = start_job(argvs, tmp_path)
    try:
        code = procs[1].wait(timeout=TIMEOUT)
    finally:
        for p in procs:  # process 0 would wait for process 1 in the shutdown barrier: not what is tested
            p.kill()
    err = (tmp_path / "p1.err").read_text()
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1, err
    assert "this host does not see it: its disk is not shared with process 0's" in lines[0]
    assert str(tmp_path / "disk0") in lines[0] and str(tmp_path / "disk1") in lines[0]
    assert json.loads((tmp_path / "p0.out").read_text().splitlines()[0])["from_cache"] is False
