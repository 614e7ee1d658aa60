"""The one command line: every verb that runs a model takes the shared flags; a flag that sets config fields
is declared once and says which in --help; --seed means one thing everywhere; evaluate and sample read the
same model sources; a project error ends as one line (exit 2, or 1 for a diverged run), anything else keeps
its traceback. One model runs: evaluate on the committed 5M release, seconds. And the command line's
surroundings: pipes, closed streams, the output's encoding, JAX_PLATFORMS, '~' in paths."""


import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpt1_jax import cli
from gpt1_jax.config import PretrainConfig, resolve
from tests.support.cli import _one_error_line

RELEASE = Path(__file__).resolve().parents[2] / "experiments" / "paper" / "release"


@pytest.mark.parametrize("where", ["workdir", "cache_dir"])
def test_a_read_only_disk_is_one_line(tmp_path, capsys, monkeypatch, mount_tmpfs, vocab_dir, where):
    """A real read-only file system (a tmpfs remounted ro; needs root): the run folder's check, and the token cache
    folder's (gpt1_jax/data/tokens.py `check_cache_dir`), both before anything is written."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    disk = mount_tmpfs(tmp_path / "disk", 1 << 20)
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    workdir = disk / "run" if where == "workdir" else tmp_path / "run"
    cache = disk / "cache" if where == "cache_dir" else tmp_path / "cache"
    status = cli.main(["pretrain", "--config", "tiny", "--data", "default", "--workdir", str(workdir),
                       "--set", f"data.cache_dir={cache}", "--set", f"data.tokenizer={vocab_dir}"])
    line = _one_error_line(capsys, "pretrain")
    assert status == 2 and str(disk) in line and "read-only" in line.lower(), line
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("argv, last", [
    # each ran on: the defaults printed for flags it never reads, nothing run, or a report of 0 tokens/s
    (["gpt1_jax.distributed", "--num-processes", "2"], "error: unrecognized arguments: --num-processes 2"),
    (["experiments.scale.hbm_fit", "--bogus"], "python -m experiments.scale.hbm_fit: error: unrecognized arguments: --bogus"),
    (["experiments.paper.run", "--stages", "", "--out", "{tmp}/p"],
     "python -m experiments.paper.run: error: --stages names no stage; "),
    (["gpt1_jax.data", "--workdir", "{tmp}/w", "--batches", "0"], "error: argument --batches: must be >= 1, got 0"),
    # argparse's usage block of six lines above the error (gpt1_jax/arguments.py Parser: one line, as the verbs')
    (["gpt1_jax.data", "--workdir", "{tmp}/w", "--bogus"], "python -m gpt1_jax.data: error: unrecognized arguments: "),
])
def test_the_tools_beside_the_verbs_refuse_what_they_would_ignore(tmp_path, argv, last):
    done = subprocess.run([sys.executable, "-m", *(a.format(tmp=tmp_path) for a in argv)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and last in done.stderr, done.stderr[-2000:]
    assert not list(tmp_path.iterdir())


def test_a_full_token_cache_disk_is_named(tmp_path, capsys, monkeypatch, mount_tmpfs, vocab_dir):
    """A write's ENOSPC names no file: the line said only "No space left on device", where the run's folder is on
    another disk than the full one."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    cache = mount_tmpfs(tmp_path / "cache", 64 << 10)
    status = cli.main(["pretrain", "--config", "tiny", "--data", "default", "--workdir", str(tmp_path / "run"),
                       "--set", f"data.cache_dir={cache}", "--set", f"data.tokenizer={vocab_dir}", "--no-progress"])
    assert status == 2 and _one_error_line(capsys, "pretrain") == (
        f"gpt1-jax pretrain: error: cannot write {cache}: No space left on device; free some space or choose a folder "
        "on another disk")


# A verb whose run prints far more than a pipe holds: what `gpt1-jax sample --num-samples 8000 | head -1` does, in
# a second instead of a minute.
CHATTY = """
import sys
from gpt1_jax import cli
def chatty(args):
    for i in range(100_000):
        print(f"line {i} of a long answer")
    return 0
cli.VERBS["verify"] = cli.VERBS["verify"]._replace(run=chatty)
sys.exit(cli.main())
"""


def test_the_streams_around_the_command_line(tmp_path):
    """`| head -1` ended in "error: Broken pipe; check the path and the disk it is on", exit 2 (now: quiet, 141,
    as `yes | head -1`); a pre-training run started with its stderr closed (`2>&-`) died at its first progress
    bar, exit 1, without a word; a prompt the output's encoding cannot show (PYTHONIOENCODING=ascii) was a
    UnicodeEncodeError; JAX_PLATFORMS=cuda on this CPU a bare AssertionError; a quoted '~' in --workdir a folder
    named '~'."""
    env = dict(os.environ)
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    chatty = shlex.join([sys.executable, str(script), "verify", "--workdir", str(tmp_path)])
    piped = subprocess.run(["bash", "-o", "pipefail", "-c", f"{chatty} | head -1"], capture_output=True, text=True,
                           timeout=120, env=env)
    assert (piped.returncode, piped.stdout, piped.stderr) == (141, "line 0 of a long answer\n", "")

    gpt1 = [sys.executable, "-m", "gpt1_jax.cli"]
    workdir = tmp_path / "quiet run"
    argv = [*gpt1, "pretrain", "--config", "tiny", "--steps", "2", "--set", "checkpoint_every=2", "--set", "eval_every=0",
            "--set", f"data.cache_dir={tmp_path / 'cache'}", "--workdir", str(workdir)]
    closed = subprocess.run(["bash", "-c", f"{shlex.join(argv)} 2>&-"], capture_output=True, text=True, timeout=300, env=env)
    assert closed.returncode == 0 and (workdir / "checkpoints" / "2").is_dir()

    sample = [*gpt1, "sample", "--init", str(RELEASE), "--max-new-tokens", "3", "--num-samples", "1"]
    ascii_out = subprocess.run([*sample, "--prompt", "thé"], capture_output=True, text=True, timeout=120,
                               env={**env, "PYTHONIOENCODING": "ascii"})
    assert ascii_out.returncode == 0 and "th\\xe9 >> " in ascii_out.stdout, ascii_out.stderr[-2000:]
    cuda = subprocess.run([*sample, "--prompt", "the"], capture_output=True, text=True, timeout=120,
                          env={**env, "JAX_PLATFORMS": "cuda"})
    assert cuda.returncode == 2 and cuda.stderr.strip().splitlines()[-1] == (
        "gpt1-jax sample: error: JAX cannot start JAX_PLATFORMS=cuda: no such device on this machine")
    home = subprocess.run([*gpt1, "verify", "--workdir", "~/nothing"], capture_output=True, text=True, timeout=120,
                          env={**env, "HOME": str(tmp_path)})
    assert home.returncode == 2 and home.stderr.strip().splitlines()[-1] == (
        f"gpt1-jax verify: error: {tmp_path / 'nothing'} does not exist: give a run's workdir")


def test_pretrain_without_progress_says_only_its_last_validation_and_where_its_plot_is(tmp_path, capsys):
    """--no-progress on pretrain and evaluate as on finetune: no bar, no status lines (the BPE trained, the run starting, the
    evaluations), for a log file; every step is in metrics.jsonl all the same. The last validation loss is a result,
    said as finetune says its best epoch (a batch job's log had no score at all)."""
    from gpt1_jax.metrics import read_metrics

    workdir = tmp_path / "run"
    status = cli.main(["pretrain", "--config", "tiny", "--steps", "3", "--set", "eval_every=2", "--tracker", "none",
                       "--set", f"data.cache_dir={tmp_path / 'cache'}", "--workdir", str(workdir), "--no-progress"])
    assert status == 0
    rows = read_metrics(workdir)
    last = rows[-1] if "val_loss" in rows[-1] else next(r for r in reversed(rows) if "val_loss" in r)
    assert capsys.readouterr().err == (f"step 3: val_loss {last['val_loss']:.4f}  val_ppl {last['val_ppl']:.2f}\n"
                                       f"loss curve: {workdir / 'loss.png'}\n")
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3] and [r["step"] for r in rows if "val_loss" in r] == [2, 3]
    assert cli.main(["evaluate", "--workdir", str(workdir), "--no-progress"]) == 0  # and evaluate's bar of batches
    out = capsys.readouterr()
    assert out.err == "" and json.loads(out.out)["step"] == 3


def test_pretrain_trains_with_its_optimizer_flags_and_says_them_unapplied_on_a_finished_run(tmp_path, capsys):
    """`pretrain --optim lion --lr 3e-4 --schedule constant --accum-steps 2` trains lion at 3e-4 on every step (no
    warmup: the schedule is the flag's, nothing else moved), and the same flags given to the finished run are said
    not applied, as --set's are."""
    from gpt1_jax.config import load_yaml
    from gpt1_jax.metrics import read_metrics

    workdir = tmp_path / "run"
    argv = ["pretrain", "--config", "tiny", "--steps", "6", "--set", "eval_every=0", "--tracker", "none", "--workdir",
            str(workdir), "--batch-size", "16", "--set", f"data.cache_dir={tmp_path / 'cache'}", "--no-progress"]
    assert cli.main([*argv, "--optim", "lion", "--lr", "3e-4", "--schedule", "constant", "--accum-steps", "2"]) == 0
    config = load_yaml(PretrainConfig, workdir / "config.yaml")
    assert (config.optim.name, config.optim.lr, config.optim.schedule, config.accum_steps) == ("lion", 3e-4,
                                                                                               "constant", 2)
    assert config.optim.warmup_steps == resolve(PretrainConfig, "tiny").optim.warmup_steps  # kept, not zeroed
    assert [r["lr"] for r in read_metrics(workdir) if "lr" in r] == pytest.approx([3e-4] * 6)
    capsys.readouterr()
    assert cli.main([*argv, "--optim", "lion", "--lr", "1e-3", "--schedule", "constant", "--accum-steps", "2"]) == 0
    said = capsys.readouterr().err
    assert "(not applied: optim.lr=0.0003 there, 0.001 now; a new --workdir trains with them)" in said
