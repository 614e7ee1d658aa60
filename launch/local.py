#!/usr/bin/env python3
"""Local multi-process launcher: N processes on 127.0.0.1, M CPU devices each, one coordinator.

    python launch/local.py -n 2 -d 2 -- gpt1-jax pretrain --config tiny --workdir runs/mh
    launch/local.sh 2 -- gpt1-jax pretrain ...            (the same, 1 CPU device per process)

Each process gets GPT1_COORDINATOR=127.0.0.1:PORT (a free port unless --port), GPT1_NUM_PROCESSES=N,
GPT1_PROCESS_ID=i and, with -d M, XLA_FLAGS=--xla_force_host_platform_device_count=M and
JAX_PLATFORMS=cpu; `gpt1-jax` turns those into jax.distributed.initialize(). Output (stdout and stderr
merged) is streamed line by line with a `[p<i>] ` prefix.

Signals: SIGINT / SIGTERM / SIGHUP to the launcher -> SIGTERM to every process (a pre-emption: each
saves a checkpoint at the same step and exits 0); a second signal -> SIGKILL. The processes run in
their own sessions, so a terminal's Ctrl-C reaches them only through this forwarding.

Failure: when a process exits non-zero, the others get --grace seconds (default 15) to fail on their
own (they do: see gpt1_jax/distributed.py), then SIGKILL. The launcher's status is the first failing
process's (128 + signal for a signal), 0 only if every process exited 0. Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

LOOPBACK = "127.0.0.1"


class _Parser(argparse.ArgumentParser):
    """A wrong flag or value is one line, as gpt1-jax says its own (gpt1_jax/cli.py `Parser`), not under the usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def child_env(base: dict, i: int, n: int, port: int, devices: int | None) -> dict:
    env = dict(base)
    env.update(GPT1_COORDINATOR=f"{LOOPBACK}:{port}", GPT1_NUM_PROCESSES=str(n), GPT1_PROCESS_ID=str(i),
               PYTHONUNBUFFERED="1")
    if devices:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
        env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
        env["JAX_PLATFORMS"] = "cpu"
    return env


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it if the launcher dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


class _Output:
    """The launcher's output. Once its reader has gone (`... | head -3`) the children's lines are still read, and
    dropped: they run on as they would have (the launcher crashed, its lines lost), and it ends with their
    statuses."""

    def __init__(self, raw) -> None:
        self.raw, self.gone = raw, False

    def write(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            self.raw.write(data)
            self.raw.flush()
        except BrokenPipeError:
            self.gone = True
            try:  # and no second BrokenPipeError as the interpreter flushes it at exit
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.raw.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass


def _pump(stream, prefix: bytes, out: _Output, lock: threading.Lock) -> None:
    """Copy a child's output to `out`, prefixing every line (and every \\r-separated progress update)."""
    pending = b""
    for chunk in iter(lambda: stream.read1(65536), b""):
        pending += chunk
        *lines, pending = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        with lock:
            out.write(b"".join(prefix + line + b"\n" for line in lines if line.strip()))
    if pending.strip():
        with lock:
            out.write(prefix + pending + b"\n")


def status_of(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _say(out: _Output, lock: threading.Lock, line: str) -> None:
    with lock:
        out.write(f"[launcher] {line}\n".encode())


def launch(cmd: list[str], n: int, devices: int | None = None, port: int | None = None, grace: float = 15.0,
           out=None) -> int:
    out = _Output(out or sys.stdout.buffer)
    port = port or free_port()
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    signals_seen = []

    def forward(signum, frame):
        signals_seen.append(signum)
        sig = signal.SIGTERM if len(signals_seen) == 1 else signal.SIGKILL
        _say(out, lock, f"got signal {signum}: sending {signal.Signals(sig).name} to all processes")
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)

    try:
        for i in range(n):
            procs.append(subprocess.Popen(cmd, env=child_env(os.environ, i, n, port, devices), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                          preexec_fn=_die_with_parent))
    except OSError as e:  # found on the PATH, yet not startable: a script without #!, or whose interpreter is gone
        for p in procs:  # they would wait for peers that never come
            p.kill()
            p.wait()
        print(f"launch/local.py: error: {cmd[0]}: cannot be started ({_why_not_started(e)})", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126  # as a shell says
    _say(out, lock, f"{n} processes, coordinator {LOOPBACK}:{port}{f', {devices} CPU devices each' if devices else ''}: "
                    f"{shlex.join(cmd)}")
    pumps = [threading.Thread(target=_pump, args=(p.stdout, f"[p{i}] ".encode(), out, lock), daemon=True)
             for i, p in enumerate(procs)]
    for t in pumps:
        t.start()
    first_failure, failed_at, ended = _watch(procs, grace, out, lock)
    for t in pumps:
        t.join(timeout=5)
    after = f" (last exit {ended - failed_at:.1f}s after the first failure)" if failed_at else ""
    _say(out, lock, f"exit statuses {[status_of(p.returncode) for p in procs]}{after}")
    return first_failure[1] if first_failure else 0


def _why_not_started(e: OSError) -> str:
    if e.errno == errno.ENOEXEC:
        return f"{e.strerror}: a script without a #! line?"
    if isinstance(e, FileNotFoundError):  # the file is there (shutil.which found it): its #! names what is not
        return "its #! interpreter was not found"
    return e.strerror or str(e)


def _watch(procs: list[subprocess.Popen], grace: float, out, lock: threading.Lock):
    """Waits for every process -> ((process, status) of the first to fail or None, when it failed, when the last
    ended); once one has failed, the others get `grace` seconds to end before they are killed."""
    first_failure: tuple[int, int] | None = None
    failed_at = None
    killed = False
    while True:
        ended = [p.poll() is not None for p in procs]  # one look per round: a failure is seen before "all ended"
        for i, p in enumerate(procs):
            if ended[i] and p.returncode != 0 and first_failure is None:
                first_failure, failed_at = (i, status_of(p.returncode)), time.monotonic()
                _say(out, lock, f"process {i} failed with status {first_failure[1]}; stopping the others in {grace:g}s "
                                "unless they end first")
        if all(ended):
            return first_failure, failed_at, time.monotonic()
        if failed_at is not None and not killed and time.monotonic() - failed_at > grace:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            killed = True
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" in argv:
        split = argv.index("--")
        ours, cmd = argv[:split], argv[split + 1:]
    else:
        ours, cmd = argv, []
    p = _Parser(prog="launch/local.py", usage="%(prog)s -n N [-d M] [--port P] [--grace S] -- CMD ...",
                description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("-n", "--num-processes", type=int, required=True)
    p.add_argument("-d", "--devices-per-process", type=int, default=None, help="fake CPU devices per process")
    p.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)")
    p.add_argument("--grace", type=float, default=15.0, help="seconds the others get after a failure (default 15)")
    args = p.parse_args(ours)
    if not cmd:
        p.error("no command: put it after --")
    if args.num_processes < 1:
        p.error("-n must be >= 1")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        p.error("-d must be >= 1")
    if args.port is not None and not 1 <= args.port <= 65535:
        p.error(f"--port must be a TCP port, 1 to 65535, got {args.port}")
    if not args.grace >= 0:
        p.error(f"--grace must be >= 0 seconds, got {args.grace}")
    if shutil.which(cmd[0]) is None:  # found now, not as n tracebacks of a failed fork
        p.exit(127, f"{p.prog}: error: {cmd[0]}: command not found (or not executable)\n")
    return launch(cmd, args.num_processes, args.devices_per_process, args.port, args.grace)


if __name__ == "__main__":
    sys.exit(main())
