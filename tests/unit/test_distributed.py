"""gpt1_jax/distributed.py in process: the words of its refusals, the lost-peer test, the start-up watchdog and the
quieted pre-emption note. The same things in real processes: tests/e2e/test_multihost.py."""

import logging
import os
import subprocess
import sys
import time

import pytest

from gpt1_jax import distributed

SLURM_STEP = dict(SLURM_JOB_ID="12345", SLURM_NTASKS="4", SLURM_PROCID="1", SLURM_LOCALID="1",
                  SLURM_STEP_NODELIST="node[01-02]")


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("SLURM_", "OMPI_", "GPT1_", "JAX_COORDINATOR")):
            monkeypatch.delenv(k)
    return monkeypatch


def test_jobs_that_differ_are_named_field_by_field_per_process():
    job = {"verb": "pretrain", "workdir": "/runs/a", "optim.lr": 0.001, "steps": 4}
    assert distributed.disagreement([job, dict(job)]) is None
    assert distributed.disagreement([job, {**job, "optim.lr": 9e-3}]) == (
        "processes disagree on their job: optim.lr=0.001 in process 0, 0.009 in process 1; every process runs the "
        "same command")
    three = [job, {**job, "workdir": "/runs/b", "steps": 8}, job]
    assert distributed.disagreement(three) == (
        "processes disagree on their job: workdir=/runs/a in processes 0 and 2, /runs/b in process 1; steps=4 in "
        "processes 0 and 2, 8 in process 1; every process runs the same command")
    many = {**job, "verb": "finetune", "workdir": "/x", "optim.lr": 1.0, "steps": 1}
    assert distributed.disagreement([job, many]).endswith("; and 1 more; every process runs the same command")


def test_per_host_settings_are_left_out_of_the_job():
    """Each host may keep its token cache on a disk of its own (filled ahead by `gpt1-jax tokenize`)."""
    from gpt1_jax.config import PretrainConfig, flat_fields, to_dict

    fields = flat_fields(to_dict(PretrainConfig()))
    assert set(distributed.PER_HOST_FIELDS) <= set(fields)
    assert {"data.source", "optim.lr", "steps"} <= set(fields) - set(distributed.PER_HOST_FIELDS)


def test_a_peer_lost_under_another_error_type_is_still_a_lost_peer():
    """orbax's sync re-raised Gloo's error as a ValueError: process 0 printed a 58-line traceback."""
    gloo = "UNKNOWN: Gloo AllGather failed: [pair.cc:547] Connection closed by peer [127.0.0.1]:29094"
    assert distributed.lost_peer(ValueError(gloo))
    try:
        try:
            raise ValueError(gloo)
        except ValueError as e:
            raise RuntimeError("saving failed") from e
    except RuntimeError as e:
        assert distributed.lost_peer(e).args == (gloo,)
    try:
        try:
            raise ValueError(gloo)
        except ValueError:
            raise KeyError("while handling it")
    except KeyError as e:
        assert distributed.lost_peer(e) is e.__context__
    assert not distributed.lost_peer(ValueError("UNAVAILABLE: a file server"))  # JAX's own error only
    assert not distributed.lost_peer(None)


def test_the_start_up_watchdog_never_acts_after_initialize_returned(tmp_path):
    """It ends a process stuck in jax.distributed.initialize in one line (status 2); one that started is left be."""
    with distributed._Watchdog(0.2, "never said"):
        pass
    time.sleep(0.4)  # still here: the timer was cancelled
    script = ("import time\nfrom gpt1_jax import distributed\n"
              "with distributed._Watchdog(0.2, 'said'):\n    time.sleep(5)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.strip()) == (2, "said")


def test_a_process_id_from_the_environment_is_named_as_such(clean_env):
    env = {"GPT1_COORDINATOR": "h:1", "GPT1_NUM_PROCESSES": "2", "GPT1_PROCESS_ID": "5"}
    with pytest.raises(distributed.DistributedConfigError, match=r"^GPT1_PROCESS_ID=5 not in \[0, 2\) "
                                                                  r"\(GPT1_NUM_PROCESSES=2\)$"):
        distributed.resolve(None, env)
    import argparse

    flags = argparse.Namespace(process_id=5, num_processes=None, coordinator=None)
    with pytest.raises(distributed.DistributedConfigError, match=r"^--process-id 5 not in \[0, 2\)"):
        distributed.resolve(flags, env)


def test_a_count_alone_under_slurm_is_checked_against_the_step_first(clean_env):
    """`--num-processes 2` in a step of 4 tasks was told to add --coordinator and --process-id, and doing so met the
    count refusal; the count that agrees is told to go, as SLURM gives all three."""
    import argparse

    for k, v in SLURM_STEP.items():
        clean_env.setenv(k, v)
    flags = argparse.Namespace(num_processes=2)
    with pytest.raises(distributed.DistributedConfigError, match=r"^--num-processes 2 contradicts this SLURM job "
                                                                  r"step's SLURM_NTASKS=4"):
        distributed.resolve(flags)
    with pytest.raises(distributed.DistributedConfigError,
                       match=r"missing --coordinator, --process-id \(SlurmCluster gives them here: drop "
                             r"--num-processes 4 to let JAX"):
        distributed.resolve(argparse.Namespace(num_processes=4))


def test_python_m_distributed_refuses_the_count_gpt1_jax_refuses():
    """It reported num_processes 2 (exit 0) where gpt1-jax refuses the same environment."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GPT1_", "OMPI_"))}, **SLURM_STEP,
           "GPT1_DISTRIBUTED": "on", "GPT1_NUM_PROCESSES": "2", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "gpt1_jax.distributed"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 2 and not done.stdout, done
    assert done.stderr.strip().splitlines() == [
        "python -m gpt1_jax.distributed: error: GPT1_NUM_PROCESSES=2 contradicts this SLURM job step's SLURM_NTASKS=4: "
        "its processes would not agree on the job (JAX waits for processes that never start, then aborts); drop "
        "GPT1_NUM_PROCESSES to use the cluster's count, or start the job with 2"]


def test_the_preemption_sync_point_note_is_dropped_and_other_warnings_kept(caplog):
    """orbax's warning came 2-3 times per process on a clean pre-emption, beside the loop's own line."""
    from absl import logging as absl_logging

    absl = logging.getLogger("absl")
    try:
        distributed._quiet_preemption_notes()
        distributed._quiet_preemption_notes()  # once is enough, however many starts
        assert absl.filters.count(distributed._not_a_preemption_note) == 1
        with caplog.at_level(logging.WARNING):
            absl_logging.warning("[process=%s][thread=%s] Reached preemption sync point, step=%s", 0, "Main", 7)
            absl_logging.warning("a real problem at step %s", 7)
    finally:
        absl.removeFilter(distributed._not_a_preemption_note)
    assert [r.getMessage() for r in caplog.records] == ["a real problem at step 7"]


def test_native_writes_to_stdout_go_to_stderr_and_pythons_stdout_keeps_the_results(capsys):
    """What Gloo writes to descriptor 1 in a multi-process run ("[Gloo] Rank 0 is connected ...") lands on stderr;
    print() still reaches the command's stdout, buffered output included. A stdout that is not descriptor 1 (here
    pytest's capture) is left alone."""
    code = ("import os; from gpt1_jax import distributed; print('before', end=' '); "
            "distributed._native_stdout_to_stderr(); os.write(1, b'native\\n'); print('result')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # the buffered case: a file, a pipe
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "before result\n", "native\n"), done
    captured = sys.stdout
    distributed._native_stdout_to_stderr()
    assert sys.stdout is captured
