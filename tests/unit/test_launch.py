"""The launchers: the local one with trivial child processes (prefixes, environment, failure, signals),
the SLURM/TPU/Kubernetes ones checked for syntax and for generating the commands launch/README.md shows,
and the distributed start-up's flag/environment resolution. No jax start-up, no network: seconds."""

import os

import pytest
import yaml

from gpt1_jax import distributed
from tests.support.launch import LAUNCH, README


def test_kubernetes_manifests():
    jobset, = yaml.safe_load_all((LAUNCH / "k8s" / "jobset-tpu.yaml").read_text())
    assert jobset["kind"] == "JobSet"
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 2
    container = job["template"]["spec"]["containers"][0]
    assert container["command"] == ["gpt1-jax"] and container["args"][:3] == ["pretrain", "--workdir", "/workdir/gpt1"]

    service, job = yaml.safe_load_all((LAUNCH / "k8s" / "indexed-job-gpu.yaml").read_text())
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    n = job["spec"]["parallelism"]
    assert n == job["spec"]["completions"] == 2
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["GPT1_NUM_PROCESSES"]["value"] == str(n)
    host, port = env["GPT1_COORDINATOR"]["value"].split(":")
    assert host == f"{job['metadata']['name']}-0.{pod['subdomain']}" and pod["subdomain"] == service["metadata"]["name"]
    assert int(port) == service["spec"]["ports"][0]["port"]
    assert "job-completion-index" in env["GPT1_PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    for cmd in ("kubectl apply -f launch/k8s/jobset-tpu.yaml", "kubectl apply -f launch/k8s/indexed-job-gpu.yaml"):
        assert cmd in README


def test_resolve_flags_over_env():
    env = {"GPT1_COORDINATOR": "10.0.0.1:1234", "GPT1_NUM_PROCESSES": "4", "GPT1_PROCESS_ID": "3"}
    cfg = distributed.resolve(None, env)
    assert (cfg.coordinator, cfg.num_processes, cfg.process_id, cfg.explicit) == ("10.0.0.1:1234", 4, 3, True)
    import argparse

    args = argparse.Namespace(coordinator=None, num_processes=None, process_id=1, distributed=None,
                              heartbeat_timeout=5, shutdown_timeout=None, init_timeout=None)
    cfg = distributed.resolve(args, env)
    assert cfg.process_id == 1 and cfg.heartbeat_timeout_s == 5 and cfg.shutdown_timeout_s == distributed.DEFAULT_SHUTDOWN_S


@pytest.mark.parametrize("env, message", [
    ({"GPT1_COORDINATOR": "10.0.0.1:1234"}, "missing --num-processes, --process-id"),
    ({"GPT1_COORDINATOR": "nohost", "GPT1_NUM_PROCESSES": "2", "GPT1_PROCESS_ID": "0"}, "HOST:PORT"),
    ({"GPT1_COORDINATOR": "h:99999", "GPT1_NUM_PROCESSES": "2", "GPT1_PROCESS_ID": "0"}, "a port 1-65535"),
    ({"GPT1_COORDINATOR": "h:1", "GPT1_NUM_PROCESSES": "2", "GPT1_PROCESS_ID": "2"}, "not in [0, 2)"),
    ({"GPT1_NUM_PROCESSES": "two"}, "must be an integer"),
    ({"GPT1_DISTRIBUTED": "maybe"}, "auto, on or off"),
    ({"GPT1_HEARTBEAT_TIMEOUT": "0"}, "GPT1_HEARTBEAT_TIMEOUT) must be >= 1 second, got 0"),
])
def test_resolve_rejects_inconsistent_settings(env, message):
    with pytest.raises(distributed.DistributedConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        distributed.resolve(None, env)


def test_no_cluster_no_initialize(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("SLURM_", "OMPI_", "GPT1_", "TPU_", "KUBERNETES_")):
            monkeypatch.delenv(k)
    assert distributed.detected_cluster() is None
    assert distributed.initialize(None) is False
    monkeypatch.setenv("GPT1_DISTRIBUTED", "on")  # asked for, with nothing to start from: one line, not JAX's ValueError
    with pytest.raises(distributed.DistributedConfigError, match=r"no cluster JAX can detect here .* pass --coordinator"):
        distributed.initialize(None)
    monkeypatch.setenv("GPT1_COORDINATOR", "127.0.0.1:29500")  # on, with one of the three: JAX's ValueError before
    with pytest.raises(distributed.DistributedConfigError, match="missing --num-processes, --process-id, and no cluster"):
        distributed.initialize(None)


def test_slurm_is_detected_through_jax(monkeypatch):
    for k, v in dict(SLURM_JOB_ID="7", SLURM_STEP_NODELIST="node[1-2]", SLURM_NTASKS="2", SLURM_PROCID="0",
                     SLURM_LOCALID="0").items():
        monkeypatch.setenv(k, v)
    assert distributed.detected_cluster() == "SlurmCluster"
    monkeypatch.setenv("SLURM_NTASKS", "1")  # an interactive allocation running one process
    assert distributed.detected_cluster() is None
    assert distributed.detected_cluster(single_task=True) == "SlurmCluster"  # what --distributed on starts there


def test_a_process_that_finds_no_coordinator_says_so_in_one_line():
    """Process 1 started with nobody serving --coordinator: XLA's client ended it with a C++ check failure
    (status 134) blaming "another task". Probed on loopback first, it is one error at --init-timeout."""
    import socket
    import time

    with socket.socket() as s:  # a loopback port nobody listens on once this block ends
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(distributed.DistributedConfigError, match=rf"^no coordinator answered at 127.0.0.1:{port} "
                                                                  r"within 1 s \(--init-timeout\): start process 0"):
        distributed._wait_for_coordinator("127.0.0.1", port, 1)
    assert time.monotonic() - t0 < 5
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert distributed._wait_for_coordinator("127.0.0.1", server.getsockname()[1], 1) < 1


def test_a_coordinator_port_another_program_holds_is_one_line(monkeypatch):
    """JAX's "Failed to start RPC server" traceback on process 0, C++ check failures on the others."""
    import socket

    for k in list(os.environ):
        if k.startswith(("SLURM_", "OMPI_", "GPT1_")):
            monkeypatch.delenv(k)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for k, v in (("GPT1_COORDINATOR", f"127.0.0.1:{port}"), ("GPT1_NUM_PROCESSES", "2"), ("GPT1_PROCESS_ID", "0")):
            monkeypatch.setenv(k, v)
        with pytest.raises(distributed.DistributedConfigError, match=f"--coordinator port {port} cannot be served here"):
            distributed.initialize(None)


def test_a_slurm_jobs_coordinator_is_checked_as_a_given_one_is(monkeypatch):
    """Under SLURM JAX derives the coordinator itself (first node, port SLURM_JOB_ID % 4096 + 61440): a port
    another program held segfaulted process 0 (or gave JAX's "Failed to start RPC server" traceback), and a
    task whose task 0 never came ended in a C++ check failure. JAX's derivation now runs first, then the same
    checks as for --coordinator."""
    import socket

    for k in list(os.environ):
        if k.startswith(("SLURM_", "OMPI_", "GPT1_", "JAX_COORDINATOR")):
            monkeypatch.delenv(k)
    with socket.socket() as held:
        for job in range(4095, 0, -1):  # the port JAX derives for job `job`, once one is free to hold
            try:
                held.bind(("127.0.0.1", port := 61440 + job))
                break
            except OSError:
                continue
        held.listen()
        for k, v in dict(SLURM_JOB_ID=str(job), SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS="2", SLURM_PROCID="0",
                         SLURM_LOCALID="0", GPT1_INIT_TIMEOUT="1").items():
            monkeypatch.setenv(k, v)
        assert distributed.detected_params(distributed.resolve()) == (f"127.0.0.1:{port}", 2, 0, [0])
        monkeypatch.setenv("JAX_LOCAL_DEVICE_IDS", "0,1,2,3")  # as JAX reads it: it widened a task's devices
        assert distributed.detected_params(distributed.resolve())[3] == [0, 1, 2, 3]
        monkeypatch.delenv("JAX_LOCAL_DEVICE_IDS")
        with pytest.raises(distributed.DistributedConfigError,
                           match=f"^the coordinator \\(SlurmCluster\\) port {port} cannot be served here"):
            distributed.initialize(None)
        # --distributed on with a count alone: the rest comes from SLURM through the same path (it had printed
        # "coordinator None" and left the derivation, and the port, to JAX)
        monkeypatch.setenv("GPT1_DISTRIBUTED", "on")
        monkeypatch.setenv("GPT1_NUM_PROCESSES", "2")
        with pytest.raises(distributed.DistributedConfigError,
                           match=f"^the coordinator \\(SlurmCluster\\) port {port} cannot be served here"):
            distributed.initialize(None)
        monkeypatch.delenv("GPT1_DISTRIBUTED")
        monkeypatch.delenv("GPT1_NUM_PROCESSES")
        held.close()
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    with pytest.raises(distributed.DistributedConfigError, match=rf"^no coordinator answered at 127.0.0.1:{port} within "
                                                                  r"1 s \(--init-timeout\): start process 0"):
        distributed.initialize(None)


def test_a_collective_that_lost_its_peer_is_told_from_other_errors():
    """A process whose peer failed printed a 40-line JaxRuntimeError traceback that hid the peer's own line."""
    from jax.errors import JaxRuntimeError

    assert distributed.lost_peer(JaxRuntimeError("UNKNOWN: Gloo context initialization failed: DEADLINE_EXCEEDED"))
    assert distributed.lost_peer(JaxRuntimeError("INTERNAL: Gloo all-reduce failed: Connection reset by peer"))
    assert not distributed.lost_peer(JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1 GiB"))
    assert not distributed.lost_peer(ValueError("Gloo"))


def test_a_process_count_that_contradicts_the_cluster_is_one_line(monkeypatch):
    """--num-processes 3 in a SLURM step of 2 tasks: JAX kept the 3, took the coordinator and the process id from
    SLURM, and both tasks waited out --init-timeout for a third, then aborted in C++ (status 134, a page of stack).
    Refused now before JAX starts, naming both counts; a count that agrees, or a one-task step running a job of its
    own (launch/local.py under `srun -n 1`), is not."""
    import argparse

    for k in list(os.environ):
        if k.startswith(("SLURM_", "OMPI_", "GPT1_", "JAX_COORDINATOR")):
            monkeypatch.delenv(k)
    for k, v in dict(SLURM_JOB_ID="7", SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS="2", SLURM_PROCID="1",
                     SLURM_LOCALID="1").items():
        monkeypatch.setenv(k, v)
    flags = argparse.Namespace(distributed="on", num_processes=3, coordinator=None, process_id=None)
    with pytest.raises(distributed.DistributedConfigError, match=r"^--num-processes 3 contradicts this SLURM job "
                       r"step's SLURM_NTASKS=2: .*drop --num-processes to use the cluster's count, or start the job "
                       r"with 3$"):
        distributed.initialize(flags)
    monkeypatch.setenv("GPT1_COORDINATOR", "127.0.0.1:1")  # every value given, from the environment: still refused
    monkeypatch.setenv("GPT1_PROCESS_ID", "0")
    monkeypatch.setenv("GPT1_NUM_PROCESSES", "1")  # it ran each task as a job of one, all in the same workdir
    with pytest.raises(distributed.DistributedConfigError, match=r"^GPT1_NUM_PROCESSES=1 contradicts this SLURM job "
                                                                  r"step's SLURM_NTASKS=2"):
        distributed.initialize(None)
    monkeypatch.setenv("GPT1_NUM_PROCESSES", "2")
    distributed.check_process_count(distributed.resolve())  # agrees
    monkeypatch.setenv("SLURM_NTASKS", "1")
    distributed.check_process_count(distributed.resolve())  # one task, a job of its own
    monkeypatch.delenv("GPT1_COORDINATOR")
    monkeypatch.delenv("GPT1_PROCESS_ID")
    with pytest.raises(distributed.DistributedConfigError, match="SLURM_NTASKS=1"):  # ...unless SLURM is to fill it in
        distributed.check_process_count(distributed.resolve(flags))


@pytest.mark.parametrize("verb", ["run", "copy", "install"])
def test_tpu_sh_quotes_paths_for_the_remote_shell(tmp_path, verb):
    """`WORKDIR="/mnt/my runs/x" launch/tpu.sh run` started `gpt1-jax pretrain --workdir /mnt/my runs/x` on every
    worker: the remote shell split the path in two. The workers' shell reads the paths whole (`~/` still expands)."""
    import shlex
    import subprocess

    env = {**os.environ, "DRY_RUN": "1", "WORKDIR": "/mnt/my runs/x", "REMOTE_DIR": "it's mine",
           "TMPDIR": str(tmp_path)}
    done = subprocess.run(["bash", str(LAUNCH / "tpu.sh"), verb, "--config", "gpt1"], capture_output=True, text=True,
                          env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    remote = shlex.split(done.stdout.strip().splitlines()[-1])[-1]  # the --command the workers' shell runs
    words = shlex.split(remote)
    assert "~/it\\'s\\ mine" in remote and "it's mine" in words[words.index("cd" if verb != "copy" else "-C") + 1]
    if verb == "run":
        assert words[words.index("--workdir") + 1] == "/mnt/my runs/x"
