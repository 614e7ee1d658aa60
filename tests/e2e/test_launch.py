"""The launchers: the local one with trivial child processes (prefixes, environment, failure, signals),
the SLURM/TPU/Kubernetes ones checked for syntax and for generating the commands launch/README.md shows,
and the distributed start-up's flag/environment resolution. No jax start-up, no network: seconds."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.support.env import FAST_COMPILE
from tests.support.launch import LAUNCH, README


def local(*args, timeout=60, **kw):
    return subprocess.run([sys.executable, str(LAUNCH / "local.py"), *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def test_local_launcher_env_and_prefixes():
    child = "import os; print(os.environ['GPT1_PROCESS_ID'], os.environ['GPT1_NUM_PROCESSES'], os.environ['GPT1_COORDINATOR'], os.environ['XLA_FLAGS'])"
    done = local("-n", "3", "-d", "2", "--", sys.executable, "-c", child)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {l[:5]: l[5:].split() for l in done.stdout.splitlines() if l.startswith("[p")}
    assert sorted(lines) == ["[p0] ", "[p1] ", "[p2] "]
    # -d 2 replaces the device count of this process's XLA_FLAGS (conftest: 8) and keeps its other flags
    kept = [f for f in os.environ["XLA_FLAGS"].split() if "device_count" not in f]
    assert FAST_COMPILE.split()[0] in kept
    for i in range(3):
        pid, n, coord, *flags = lines[f"[p{i}] "]
        assert (pid, n, flags) == (str(i), "3", [*kept, "--xla_force_host_platform_device_count=2"])
        assert coord.startswith("127.0.0.1:")
    assert "[launcher] exit statuses [0, 0, 0]" in done.stdout


@pytest.mark.parametrize("args, status, message", [
    (["-n", "2", "--", "no-such-command-here"], 127, "no-such-command-here: command not found (or not executable)"),
    (["-n", "2", "-d", "0", "--", "true"], 2, "-d must be >= 1"),
    (["-n", "2", "--port", "99999", "--", "true"], 2, "--port must be a TCP port, 1 to 65535, got 99999"),
    (["-n", "2", "--grace", "-1", "--", "true"], 2, "--grace must be >= 0 seconds, got -1.0"),
    (["-n", "0", "--", "true"], 2, "-n must be >= 1"),
    (["--", "true"], 2, "the following arguments are required: -n/--num-processes"),
])
def test_local_launcher_refuses_what_it_cannot_start_in_one_line(args, status, message):
    """A missing command was a FileNotFoundError traceback from the fork; -d 0, port 99999 and a negative grace ran."""
    done = local(*args)
    help = "" if status == 127 else " (see launch/local.py --help)"
    assert done.returncode == status and done.stderr.splitlines() == [f"launch/local.py: error: {message}{help}"]
    assert "[launcher]" not in done.stdout  # nothing started


@pytest.mark.parametrize("script, status, why", [
    ("#!/no/such/python\nprint(1)\n", 127, "its #! interpreter was not found"),
    ("echo hi\n", 126, "Exec format error: a script without a #! line?"),
])
def test_a_command_found_but_not_startable_is_one_line(tmp_path, script, status, why):
    """On the PATH and executable, yet the fork's exec failed: a FileNotFoundError or OSError traceback, exit 1."""
    command = tmp_path / "job"
    command.write_text(script)
    command.chmod(0o755)
    done = local("-n", "2", "--", str(command))
    assert done.returncode == status and done.stderr.splitlines() == [
        f"launch/local.py: error: {command}: cannot be started ({why})"]
    assert "[launcher]" not in done.stdout


def test_a_reader_that_goes_away_leaves_the_processes_running_to_their_end(tmp_path):
    """`local.py ... | head -3`: both pump threads died with BrokenPipeError tracebacks and the launcher exited 1
    though every process finished with 0."""
    child = ("import os, time\nfor i in range(40): print('line', i, flush=True); time.sleep(0.02)\n"
             "open(os.environ['GPT1_PROCESS_ID'] + '.done', 'w').close()")
    proc = subprocess.Popen([sys.executable, str(LAUNCH / "local.py"), "-n", "2", "--", sys.executable, "-c", child],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == b"", err.decode()[-2000:]
    assert sorted(p.name for p in tmp_path.glob("*.done")) == ["0.done", "1.done"]


def test_local_sh_wrapper():
    done = subprocess.run([str(LAUNCH / "local.sh"), "2", "--", sys.executable, "-c", "print('hi')"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    assert sorted(l for l in done.stdout.splitlines() if l.endswith("hi")) == ["[p0] hi", "[p1] hi"]


@pytest.mark.parametrize("args", [["2"], ["2", "4"]])
def test_local_sh_without_the_separator_says_where_it_goes(args):
    """The command's name was read as M, the devices per process: `invalid int value: 'python3'`."""
    done = subprocess.run([str(LAUNCH / "local.sh"), *args, sys.executable, "-c", "print('hi')"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"{LAUNCH / 'local.sh'}: put -- before the command: {LAUNCH / 'local.sh'} N [M] "
                                        "-- COMMAND ..."]


def test_local_launcher_failure_stops_the_others():
    child = "import os, sys, time; i = int(os.environ['GPT1_PROCESS_ID']); time.sleep(0.5); sys.exit(3) if i == 1 else time.sleep(60)"
    t0 = time.monotonic()
    done = local("-n", "2", "--grace", "1", "--", sys.executable, "-c", child)
    assert done.returncode == 3
    assert time.monotonic() - t0 < 20
    assert "[launcher] process 1 failed with status 3" in done.stdout
    assert "[launcher] exit statuses [137, 3]" in done.stdout  # p0 SIGKILLed after the grace period


def test_local_launcher_forwards_sigterm():
    child = ("import signal, sys, time, os\n"
             "signal.signal(signal.SIGTERM, lambda *a: (print('p', os.environ['GPT1_PROCESS_ID'], 'got SIGTERM', flush=True), sys.exit(0)))\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(LAUNCH / "local.py"), "-n", "2", "--", sys.executable, "-c", child],
                            stdout=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if sum(l.startswith("[p") and l.endswith("] ready\n") for l in seen) == 2:
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "[p0] p 0 got SIGTERM" in out and "[p1] p 1 got SIGTERM" in out


@pytest.mark.parametrize("script", ["local.sh", "tpu.sh", "slurm.sbatch"])
def test_shell_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(LAUNCH / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def documented(prefix: str) -> list[tuple[str, str]]:
    """(`$ command` line, the line after it) pairs of launch/README.md whose command starts with prefix."""
    lines = README.splitlines()
    return [(l[2:], lines[i + 1]) for i, l in enumerate(lines) if l.startswith("$ " + prefix)]


def test_tpu_commands_are_the_documented_ones():
    pairs = documented("launch/tpu.sh")
    assert {shlex.split(c)[1] for c, _ in pairs} == {"create", "install", "run", "logs", "stop", "delete"}
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_NAME", "ZONE", "PROJECT", "ACCELERATOR_TYPE",
                                                               "RUNTIME_VERSION", "REMOTE_DIR", "WORKDIR")}
    for command, expected in pairs:
        argv = shlex.split(command)
        done = subprocess.run(["bash", str(LAUNCH / "tpu.sh"), *argv[1:]], capture_output=True, text=True,
                              env={**env, "DRY_RUN": "1"}, timeout=30)
        assert done.returncode == 0, done.stderr
        assert shlex.split(done.stdout.strip()) == shlex.split(expected), command
    # The 2-host run reaches every worker and starts the pre-training there.
    run = shlex.split(next(e for c, e in pairs if " run " in c + " "))
    assert "--worker=all" in run and "gpt1-jax pretrain --workdir" in run[-1]


def test_the_tpu_run_outlives_its_ssh_session_and_stop_reaches_it(tmp_path):
    """`run` held the job in the foreground of `ssh --worker=all`: a dropped connection ended it on every worker
    without a checkpoint. Its remote command, run here with a stand-in for gpt1-jax: the shell that started it
    (the ssh session) is gone at once, the job runs on with its output in the log, and `stop`'s pid is its own."""
    import time

    run = shlex.split(subprocess.run(["bash", str(LAUNCH / "tpu.sh"), "run", "--config", "gpt1"], capture_output=True,
                                     text=True, env={**os.environ, "DRY_RUN": "1", "HOME": str(tmp_path)}).stdout)[-1]
    remote = tmp_path / "gpt1-jax" / ".venv" / "bin" / "gpt1-jax"
    remote.parent.mkdir(parents=True)
    remote.write_text("#!/usr/bin/env bash\ntrap 'echo got SIGTERM; exit 0' TERM\necho started \"$@\"\n"
                      "for i in $(seq 300); do sleep 0.1; done\n")
    remote.chmod(0o755)
    session = subprocess.run(["bash", "-c", run], capture_output=True, text=True, timeout=10,
                             env={**os.environ, "HOME": str(tmp_path)})
    assert session.returncode == 0 and "started" in session.stdout
    pid = int((tmp_path / "gpt1-jax.pid").read_text())
    time.sleep(0.5)
    os.kill(pid, 0)  # still running, its session gone
    assert "started pretrain --workdir" in (tmp_path / "gpt1-jax.log").read_text()
    stop = shlex.split(subprocess.run(["bash", str(LAUNCH / "tpu.sh"), "stop"], capture_output=True, text=True,
                                      env={**os.environ, "DRY_RUN": "1"}).stdout)[-1]
    subprocess.run(["bash", "-c", stop], env={**os.environ, "HOME": str(tmp_path)}, check=True, timeout=10)
    for _ in range(50):
        if "got SIGTERM" in (tmp_path / "gpt1-jax.log").read_text():
            break
        time.sleep(0.1)
    assert "got SIGTERM" in (tmp_path / "gpt1-jax.log").read_text()


def test_tpu_copy_and_project(tmp_path):
    done = subprocess.run(["bash", str(LAUNCH / "tpu.sh"), "copy"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "DRY_RUN": "1", "PROJECT": "my-proj", "TPU_NAME": "pod"})
    assert done.returncode == 0, done.stderr
    tar, scp, ssh = (shlex.split(l) for l in done.stdout.strip().splitlines())
    assert tar[:2] == ["tar", "-czf"] and "--exclude=.git" in tar
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp and "--project=my-proj" in scp
    assert ssh[4:6] == ["ssh", "pod"] and "--worker=all" in ssh


def test_slurm_command_is_the_documented_one(tmp_path):
    (command, expected), = documented("WORKDIR=")
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text(f"#!{sys.executable}\nimport shlex, sys\nprint(shlex.join(['srun', *sys.argv[1:]]))\n")
    srun.chmod(0o755)
    argv = shlex.split(command)
    env_assign, script_args = argv[0], argv[3:]
    assert argv[1:3] == ["sbatch", "launch/slurm.sbatch"]
    env = {k: v for k, v in os.environ.items() if k not in ("WORKDIR", "GPT1_JAX")}
    env.update(PATH=f"{srun.parent}:{env['PATH']}", WORKDIR=env_assign.split("=", 1)[1])
    done = subprocess.run(["bash", str(LAUNCH / "slurm.sbatch"), *script_args], capture_output=True, text=True,
                          env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert shlex.split(done.stdout.strip()) == shlex.split(expected)
    text = (LAUNCH / "slurm.sbatch").read_text()
    # one task per GPU: JAX gives a SLURM task the GPU of its SLURM_LOCALID alone (local_device_ids)
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --gpus-per-node=8" in text


def test_cli_reports_bad_distributed_flags_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gpt1_jax.cli", "pretrain", "--workdir", str(tmp_path / "w"),
                           "--coordinator", "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("gpt1-jax pretrain: error: multi-process start needs")
