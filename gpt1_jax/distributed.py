"""Multi-process (multi-host) start-up: `jax.distributed.initialize`, once, before jax does anything else.

When is it called? In this order, the first that applies:
  1. explicit: `--coordinator HOST:PORT --num-processes N --process-id I` (or the environment variables
     GPT1_COORDINATOR / GPT1_NUM_PROCESSES / GPT1_PROCESS_ID, which the flags override);
  2. `--distributed on` / GPT1_DISTRIBUTED=on: initialize() with whatever JAX detects itself;
  3. auto (the default): a cluster environment that JAX itself recognises (Cloud TPU VM pods, GKE TPU
     JobSets, SLURM with more than one task, Open MPI with more than one rank, Kubernetes with the
     `kubernetes` package) -> initialize() and let JAX fill in the rest. On a plain machine nothing
     happens: one process, no coordinator.
`--distributed off` / GPT1_DISTRIBUTED=off never initializes.
A process count given (1 or 2) that differs from the count of the SLURM step or MPI launch the process runs in
(SLURM_NTASKS, OMPI_COMM_WORLD_SIZE), or of any cluster JAX is to fill the rest in from, is one error line
before JAX starts (`check_process_count`).

Failing fast. With N processes, one process dying must not leave the others blocked in a collective
for minutes (JAX's defaults: ~100 s heartbeat, ~300 s shutdown; docs/stack.md). So:
  * the heartbeat timeout defaults to 30 s and the shutdown timeout to 30 s (flags / env below);
  * once initialised with N > 1, an uncaught exception prints its traceback and ends the process at
    once with `os._exit(1)` (no atexit shutdown barrier waiting for peers that will never come), and a
    non-zero exit status from a verb does the same (`exit_status`). The peers then see the closed
    connections or the missing heartbeats and abort too: nothing hangs, every process exits non-zero.
  * a clean exit (status 0) still goes through JAX's shutdown barrier, so process 0 (which hosts the
    coordinator) never pulls the service from under processes still finishing;
  * a process other than 0 given --coordinator first waits (up to --init-timeout) for it to accept a TCP
    connection: never reached, that is one error line, where XLA's client would end the process with a C++
    check failure blaming another task;
  * a process still inside jax.distributed.initialize when --init-timeout has passed (processes that never
    joined, another --num-processes, a coordinator port a stranger answers) leaves in one line, status 2
    (`_Watchdog`), before XLA's client aborts it in C++;
  * at the start of a job every process checks that the others run the same one (`check_same_job`): another
    --workdir or --set in one of them is refused by each in the same line, before anything is read or written.

The flags themselves are declared in gpt1_jax/cli.py; `resolve` reads them by their argparse names.
Importing jax starts no backend (and `import gpt1_jax` has imported it): only `initialize` must come first.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

import jax

from gpt1_jax.arguments import Parser
from gpt1_jax.errors import DistributedConfigError

ENV_COORDINATOR = "GPT1_COORDINATOR"
ENV_NUM_PROCESSES = "GPT1_NUM_PROCESSES"
ENV_PROCESS_ID = "GPT1_PROCESS_ID"
ENV_MODE = "GPT1_DISTRIBUTED"
ENV_HEARTBEAT = "GPT1_HEARTBEAT_TIMEOUT"
ENV_SHUTDOWN = "GPT1_SHUTDOWN_TIMEOUT"
ENV_INIT_TIMEOUT = "GPT1_INIT_TIMEOUT"

DEFAULT_HEARTBEAT_S = 30
DEFAULT_SHUTDOWN_S = 30
DEFAULT_INIT_TIMEOUT_S = 300  # waiting for every host of a pod to come up can take minutes

_state: dict = {"initialized": False, "multi": False, "init_timeout_s": DEFAULT_INIT_TIMEOUT_S, "jobs": 0}


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    mode: str = "auto"  # auto | on | off
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    heartbeat_timeout_s: int = DEFAULT_HEARTBEAT_S
    shutdown_timeout_s: int = DEFAULT_SHUTDOWN_S
    init_timeout_s: int = DEFAULT_INIT_TIMEOUT_S
    # The fields read from the GPT1_* environment rather than flags: an error names what the user set.
    from_env: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    @property
    def explicit(self) -> bool:
        return any(v is not None for v in (self.coordinator, self.num_processes, self.process_id))

    @property
    def missing(self) -> list[str]:
        """The flags of an explicit start left unset."""
        return [n for n, v in (("--coordinator", self.coordinator), ("--num-processes", self.num_processes),
                               ("--process-id", self.process_id)) if v is None]

    def named(self, field: str) -> str:
        """The flag or the environment variable `field` came from."""
        flag, var = _NAMES[field]
        return var if field in self.from_env else flag

    def said(self, field: str) -> str:
        """`--process-id 5` or `GPT1_PROCESS_ID=5`: a value as the user gave it."""
        return f"{self.named(field)}{'=' if field in self.from_env else ' '}{getattr(self, field)}"


_NAMES = {"coordinator": ("--coordinator", ENV_COORDINATOR), "num_processes": ("--num-processes", ENV_NUM_PROCESSES),
          "process_id": ("--process-id", ENV_PROCESS_ID)}


def _int(name: str, value) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedConfigError(f"{name} must be an integer, got {value!r}") from None


def resolve(args: argparse.Namespace | None = None, environ: dict | None = None) -> DistributedConfig:
    """Flags over environment variables over defaults; checked for consistency."""
    env = os.environ if environ is None else environ
    get = lambda attr: getattr(args, attr, None) if args is not None else None
    mode = get("distributed") or env.get(ENV_MODE) or "auto"
    mode = {"1": "on", "true": "on", "0": "off", "false": "off"}.get(mode.lower(), mode.lower())
    if mode not in ("auto", "on", "off"):
        raise DistributedConfigError(f"{ENV_MODE} must be auto, on or off, got {mode!r}")
    pick = lambda attr, var: get(attr) if get(attr) is not None else _int(var, env.get(var))
    cfg = DistributedConfig(
        mode=mode,
        coordinator=get("coordinator") or env.get(ENV_COORDINATOR) or None,
        num_processes=pick("num_processes", ENV_NUM_PROCESSES),
        process_id=pick("process_id", ENV_PROCESS_ID),
        heartbeat_timeout_s=_or(pick("heartbeat_timeout", ENV_HEARTBEAT), DEFAULT_HEARTBEAT_S),
        shutdown_timeout_s=_or(pick("shutdown_timeout", ENV_SHUTDOWN), DEFAULT_SHUTDOWN_S),
        init_timeout_s=_or(pick("init_timeout", ENV_INIT_TIMEOUT), DEFAULT_INIT_TIMEOUT_S),
        from_env=tuple(f for f, (_, var) in _NAMES.items() if not get(f) and env.get(var)),
    )
    if cfg.mode != "off" and cfg.explicit:
        _check_explicit(cfg, cluster_here=environ is None)
    for name, v, var in (("heartbeat", cfg.heartbeat_timeout_s, ENV_HEARTBEAT), ("shutdown", cfg.shutdown_timeout_s,
                         ENV_SHUTDOWN), ("init", cfg.init_timeout_s, ENV_INIT_TIMEOUT)):
        if v < 1:  # 0 too: it was read as "not set" and replaced by the default without a word
            raise DistributedConfigError(f"--{name}-timeout ({var}) must be >= 1 second, got {v}")
    return cfg


def _check_explicit(cfg: DistributedConfig, cluster_here: bool) -> None:
    """The coordinator flags of an explicit start, together and in range. `cluster_here`: the environment resolved
    is this process's own, so a scheduler's cluster detected here can be asked about the flags left out."""
    if cfg.missing and cfg.mode != "on":
        # Under a scheduler the missing values are the cluster's to give: "add the other flags" led straight to the
        # count refusal when the count given was not the cluster's.
        cluster = detected_cluster(single_task=True) if cluster_here else None
        if cluster is not None:
            check_process_count(dataclasses.replace(cfg, mode="on"))
        given = ", ".join(cfg.said(f) for f in _NAMES if getattr(cfg, f) is not None)
        instead = ("or --distributed on to let JAX detect them" if cluster is None else
                   f"{cluster} gives them here: drop {given} to let JAX take them all from it, or add --distributed on")
        raise DistributedConfigError(
            f"multi-process start needs --coordinator, --num-processes and --process-id together "
            f"(or {ENV_COORDINATOR}/{ENV_NUM_PROCESSES}/{ENV_PROCESS_ID}); missing {', '.join(cfg.missing)} "
            f"({instead})")
    if cfg.coordinator is not None and not ((hp := _split_address(cfg.coordinator)) and 0 < hp[1] < 65536):
        raise DistributedConfigError(f"{cfg.named('coordinator')} must be HOST:PORT (a port 1-65535), "
                                     f"got {cfg.coordinator!r}")
    if cfg.num_processes is not None and cfg.num_processes < 1:
        raise DistributedConfigError(f"{cfg.named('num_processes')} must be >= 1, got {cfg.num_processes}")
    if cfg.process_id is not None and cfg.num_processes is not None and not 0 <= cfg.process_id < cfg.num_processes:
        raise DistributedConfigError(f"{cfg.said('process_id')} not in [0, {cfg.num_processes}) "
                                     f"({cfg.said('num_processes')})")


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _split_address(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def detected_cluster(single_task: bool = False) -> str | None:
    """Name of the cluster environment JAX would auto-detect here, or None on a plain machine.

    Uses JAX's own detectors (jax._src.clusters: Cloud TPU, GKE TPU, SLURM, Open MPI, Kubernetes); the
    opt-in ones (mpi4py) are skipped as JAX skips them. SLURM / Open MPI with a single task mean an
    interactive allocation running one process: no coordinator needed, so that is "no cluster", unless
    `single_task` (`--distributed on` asks for JAX's start-up there all the same).
    """
    try:
        from jax._src.clusters import ClusterEnv  # private, but it *is* JAX's detection
    except ImportError:  # a JAX that moved it: fall back to the schedulers' own variables
        least = 1 if single_task else 2
        if int(os.environ.get("SLURM_NTASKS", "0")) >= least:
            return "SlurmCluster"
        if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "0")) >= least:
            return "OmpiCluster"
        return None
    for env in ClusterEnv._cluster_types:
        if getattr(env, "opt_in_only_method", False):
            continue
        try:
            if not env.is_env_present():
                continue
            if env.__name__ in ("SlurmCluster", "OmpiCluster") and env.get_process_count() <= 1 and not single_task:
                return None
        except Exception:  # a detector that cannot run here (missing package, no metadata server)
            continue
        return env.__name__
    return None


# The schedulers whose environment states the job's process count outright (JAX's detectors read these variables).
_COUNT_VARIABLES = {"SlurmCluster": ("this SLURM job step", "SLURM_NTASKS"),
                    "OmpiCluster": ("this Open MPI launch", "OMPI_COMM_WORLD_SIZE")}


def check_process_count(cfg: DistributedConfig, flag: bool | None = None) -> None:
    """A process count given (`flag`: as --num-processes, else as GPT1_NUM_PROCESSES; None: as `cfg` says) that
    differs from the count of the cluster this process was started in: JAX kept the given one, mixed it with the
    coordinator and process id it derived from the cluster, and waited for processes that were never started, then
    aborted in C++ (status 134) after --init-timeout. Compared where the cluster decides this job: a SLURM step or an
    MPI launch of several tasks (one task may run a job of its own, launch/local.py under `srun -n 1`), or any
    cluster JAX is to derive the missing coordinator or process id from (its count asked as JAX would ask it)."""
    if cfg.num_processes is None:
        return
    cluster = detected_cluster(single_task=bool(cfg.missing))
    if cluster is None:
        return
    where, variable = _COUNT_VARIABLES.get(cluster, (f"the cluster JAX detects here ({cluster})", None))
    if variable is not None:
        count, said = _int(variable, os.environ.get(variable)), f"{variable}={os.environ.get(variable)}"
    elif cfg.missing:
        try:  # Kubernetes' API, a TPU VM's metadata: JAX asks them the same in initialize
            count = _cluster_class(cluster).get_process_count()
        except Exception:  # not answered: JAX's own start-up says why
            return
        said = f"count of {count} processes"
    else:  # every value given: JAX asks that cluster nothing
        return
    if count != cfg.num_processes:
        flag = "num_processes" not in cfg.from_env if flag is None else flag
        name = "--num-processes" if flag else ENV_NUM_PROCESSES
        raise DistributedConfigError(
            f"{name}{' ' if flag else '='}{cfg.num_processes} contradicts {where}'s {said}: its processes would not "
            f"agree on the job (JAX waits for processes that never start, then aborts); drop {name} to use the "
            f"cluster's count, or start the job with {cfg.num_processes}")


def _cluster_class(name: str):
    from jax._src.clusters import ClusterEnv  # private, but it *is* JAX's detection (see detected_cluster)

    return next(env for env in ClusterEnv._cluster_types if env.__name__ == name)


def initialize(args: argparse.Namespace | None = None) -> bool:
    """Call jax.distributed.initialize if the flags, the environment or the cluster ask for it.
    Returns True when this is a multi-process run. Idempotent; call before any jax computation."""
    if _state["initialized"]:
        return _state["multi"]
    cfg = resolve(args)
    if cfg.mode == "off":
        return False
    check_process_count(cfg, flag=getattr(args, "num_processes", None) is not None)
    cluster, one_task = (None if cfg.explicit else detected_cluster()), None
    if cluster is None and not cfg.explicit:
        if cfg.mode == "auto":
            return False
        cluster = one_task = detected_cluster(single_task=True)  # asked for: JAX starts a one-task allocation too
        if cluster is None:
            raise DistributedConfigError(f"--distributed on ({ENV_MODE}=on): no cluster JAX can detect here (Cloud "
                                         "TPU, SLURM, Open MPI, Kubernetes) and no --coordinator: pass --coordinator, "
                                         "--num-processes and --process-id")
    if cfg.explicit and cfg.num_processes == 1 and cfg.mode == "auto":
        return False  # one process: nothing to coordinate
    if cfg.explicit and cfg.missing:  # --distributed on, flags in part: the cluster JAX detects gives the rest
        cluster = detected_cluster(single_task=True)
        if cluster is None:
            raise DistributedConfigError(f"multi-process start is missing {', '.join(cfg.missing)}, and no cluster "
                                         "JAX can detect here gives them: pass all three")

    # Until every process has joined there is nothing else to see (a job step that started fewer processes than
    # its scheduler announced waits the whole timeout): say what it waits for.
    if (cluster is not None and not one_task) or (cluster is None and cfg.num_processes != 1):
        print(f"gpt1-jax: starting a multi-process run ({cluster or 'coordinator ' + str(cfg.coordinator)}): every "
              f"process must join within {cfg.init_timeout_s} s", file=sys.stderr, flush=True)
    # What the cluster's environment leaves unset, JAX's own detection fills in now rather than inside initialize,
    # so the coordinator checks below cover an auto-detected start too (a SLURM job's busy port segfaulted).
    coordinator, n, pid, local_ids = detected_params(cfg) if cluster is not None else (
        cfg.coordinator, cfg.num_processes, cfg.process_id, None)
    kwargs = dict(
        coordinator_address=coordinator,
        num_processes=n,
        process_id=pid,
        initialization_timeout=cfg.init_timeout_s,
        heartbeat_timeout_seconds=cfg.heartbeat_timeout_s,
        shutdown_timeout_seconds=cfg.shutdown_timeout_s,
    )
    if local_ids is not None:
        kwargs["local_device_ids"] = local_ids
    t0 = time.perf_counter()
    named = "--coordinator" if cluster is None else f"the coordinator ({cluster})"
    _probe_coordinator(kwargs, named)
    with _Watchdog(kwargs["initialization_timeout"], _not_joined_line(kwargs, named, cfg.init_timeout_s)):
        jax.distributed.initialize(**kwargs)
    _state.update(initialized=True, multi=jax.process_count() > 1, init_timeout_s=cfg.init_timeout_s)
    if _state["multi"]:
        sys.excepthook = _exit_on_uncaught
        _quiet_preemption_notes()
        _native_stdout_to_stderr()
    print(f"gpt1-jax: process {jax.process_index()} of {jax.process_count()} up in {time.perf_counter() - t0:.2f} s "
          f"(coordinator {coordinator or 'auto-detected'}, {jax.local_device_count()} local / "
          f"{jax.device_count()} global devices)", file=sys.stderr, flush=True)
    return _state["multi"]


def _not_joined_line(kwargs: dict, named: str, timeout_s: int) -> str:
    n, pid, where = kwargs["num_processes"], kwargs["process_id"], kwargs["coordinator_address"]
    count = f"{n} expected; start all {n}" if n else "start all of them"  # n None: JAX asks the cluster itself
    said = (f"gpt1-jax: not every process joined within {timeout_s} s (--init-timeout): "
            f"{count} with the same {named}")
    if pid == 0 or where is None:
        return said
    # What answered this process's probe may be no JAX service at all: another program holding the port. Or a job
    # that has its process `pid` already: JAX's service takes this one for that process restarted, fails the job
    # (its processes end in a C++ check failure) and never lets this one in.
    return (f"{said}, and check that {where} is process 0's, not another program's, and that no running job there "
            f"has its process {pid} already (starting a second one ends that job)")


class _Watchdog:
    """Ends the process in one line (status 2) once `seconds` have passed inside jax.distributed.initialize: a
    process that waited out --init-timeout for processes that never joined (too few started, another count, a
    coordinator port another program answers) was ended by XLA's client some seconds later with a C++ check failure
    and a page of stack (status 134), which no Python code can catch. JAX's client waits in C++ without the GIL,
    so the timer's thread runs meanwhile. Once initialize has returned, the timer is cancelled under the same lock
    its action takes: it can never end a process that has started."""

    def __init__(self, seconds: float, line: str):
        self._line, self._done, self._lock = line, False, threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            print(self._line, file=sys.stderr)
            _flush()
            os._exit(2)  # the C++ abort would come next; no Python exception can reach the waiting main thread


def _not_a_preemption_note(record: logging.LogRecord) -> bool:
    return "Reached preemption sync point" not in str(record.msg)


def _quiet_preemption_notes() -> None:
    """orbax logs a warning at the preemption sync point, from each of its checks there (2-3 per process), while
    the loop says "preempted: checkpoint saved at step N" once: that one warning is dropped, absl's others kept."""
    absl = logging.getLogger("absl")
    if _not_a_preemption_note not in absl.filters:
        absl.addFilter(_not_a_preemption_note)


def _native_stdout_to_stderr() -> None:
    """Gloo, XLA:CPU's collectives between processes, writes "[Gloo] Rank 0 is connected to 1 peer ranks. ..." to
    file descriptor 1 when the job's first collective connects: into the results a verb prints on stdout, where
    `gpt1-jax evaluate > result.json` on process 0 got a line that is not JSON before its own. From here on the
    process's descriptor 1 is its stderr, and Python's sys.stdout writes to the stdout the command was given. A
    stdout that is not descriptor 1 (a test capturing it, a program embedding the CLI) is left as it is."""
    out = sys.stdout
    try:
        if out is not sys.__stdout__ or out.fileno() != 1:
            return
    except (AttributeError, OSError, ValueError):  # no stdout, or one without a descriptor
        return
    out.flush()
    results = os.dup(1)
    os.dup2(2, 1)
    raw = isinstance(out.buffer, io.RawIOBase)  # python -u / PYTHONUNBUFFERED: no buffer under the text layer
    sys.stdout = io.TextIOWrapper(os.fdopen(results, "wb", buffering=0 if raw else -1), encoding=out.encoding,
                                  errors=out.errors, line_buffering=out.line_buffering, write_through=out.write_through)


def is_multi_process() -> bool:
    """Whether `initialize` started a run of several processes (without starting a backend, as jax.process_count
    would)."""
    return _state["multi"]


def _probe_coordinator(kwargs: dict, named: str) -> None:
    """Before jax.distributed.initialize(**kwargs), which it adjusts: process 0 checks it can serve the coordinator's
    port, the others wait for it to answer (the init timeout then counts what they waited); a local run binds it to
    loopback only, not every interface (JAX's default). `named`: where the address came from, for the messages."""
    coordinator, pid, timeout_s = kwargs["coordinator_address"], kwargs["process_id"], kwargs["initialization_timeout"]
    host_port = _split_address(coordinator) if coordinator else None
    if host_port is None:
        return
    bind = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS")
    if bind is None and host_port[0] in ("127.0.0.1", "localhost", "::1"):
        kwargs["coordinator_bind_address"] = bind = f"{host_port[0]}:{host_port[1]}"
    if pid == 0:
        _check_port_free(bind or f"0.0.0.0:{host_port[1]}", named)
    elif pid is not None:
        waited = _wait_for_coordinator(*host_port, timeout_s, named)
        kwargs["initialization_timeout"] = max(1, int(timeout_s - waited))


def detected_params(cfg: DistributedConfig) -> tuple[str | None, int | None, int | None, list[int] | None]:
    """(coordinator address, process count, process id, local device ids): `cfg`'s where given, else what JAX's own
    cluster detection (jax._src.clusters, as jax.distributed.initialize calls it) derives from the environment."""
    coordinator = cfg.coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")  # initialize reads these first
    ids = os.environ.get("JAX_LOCAL_DEVICE_IDS")
    try:
        local_ids = [int(i) for i in ids.split(",")] if ids else None
    except ValueError:
        raise DistributedConfigError(f"JAX_LOCAL_DEVICE_IDS={ids!r}: expected device ids separated by commas") from None
    try:
        from jax._src.clusters import ClusterEnv  # private, but it *is* JAX's detection (see detected_cluster)
    except ImportError:  # a JAX that moved it: initialize detects them itself, unchecked
        return coordinator, cfg.num_processes, cfg.process_id, local_ids
    coordinator, n, pid, local_ids = ClusterEnv.auto_detect_unset_distributed_params(
        coordinator, cfg.num_processes, cfg.process_id, local_ids, None, cfg.init_timeout_s)
    return coordinator, n, pid, None if local_ids is None else list(local_ids)


def _check_port_free(bind: str, named: str = "--coordinator") -> None:
    """Process 0 serves the coordinator: a port another program holds ended in JAX's "Failed to start RPC server"
    traceback (or a segmentation fault), and the other processes in C++ check failures half a minute later."""
    host, port = _split_address(bind)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise DistributedConfigError(f"{named} port {port} cannot be served here ({e.strerror}: another "
                                         "job's coordinator, or a second process 0?): choose another port") from None


def _wait_for_coordinator(host: str, port: int, timeout_s: int, named: str = "--coordinator") -> float:
    """Seconds until the coordinator (process 0's) accepts a connection; never: one error line. XLA's client,
    which would otherwise find out, ends the process with a C++ check failure that blames another task."""
    t0 = time.monotonic()
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return time.monotonic() - t0
        except OSError:
            if time.monotonic() - t0 >= timeout_s:
                raise DistributedConfigError(
                    f"no coordinator answered at {host}:{port} within {timeout_s} s (--init-timeout): start process 0 "
                    f"(it serves the coordinator), or check {named}") from None
            time.sleep(0.2)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


# A refusal (status 2: a flag, a config or an input every process checks alike) meets every process of a job at the
# same line, but not at the same instant. Process 0 hosts the coordination service: leaving at once took it from under
# a process still on its way to the same line, which then died in C++ (status 134) without saying why. So each
# refusing process says so in the service's key-value store, and process 0 leaves once every process has, or after
# this long (a process still in a collective waits that much longer for the end it would meet anyway). A peer's word
# comes just before its exit, and the service leaving inside that gap killed it all the same (status 134, once in a
# loaded suite, 11 ms after its word): so process 0 gives the last word REFUSAL_SETTLE_S to become an exit.
REFUSAL_GRACE_S = 5.0
REFUSAL_SETTLE_S = 0.5
_REFUSED_KEY = "gpt1_jax/refused/"


def _refuse_together(pid: int, count: int) -> None:
    """Say this process refused; process 0 then waits for the others' word, at most REFUSAL_GRACE_S in all, and
    REFUSAL_SETTLE_S more once it has every word."""
    from jax._src import distributed as jax_distributed  # private: the client jax.distributed.initialize made

    client = jax_distributed.global_state.client
    try:
        client.key_value_set(f"{_REFUSED_KEY}{pid}", "2")
    except Exception:  # the service is gone (process 0 left first): nothing to tell
        pass
    if pid != 0:
        return
    deadline = time.monotonic() + REFUSAL_GRACE_S
    for peer in range(1, count):
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            return
        try:
            client.blocking_key_value_get(f"{_REFUSED_KEY}{peer}", left_ms)
        except Exception:  # that process failed otherwise, or is still on its way: its grace ran out
            time.sleep(max(0.0, deadline - time.monotonic()))
            return
    time.sleep(REFUSAL_SETTLE_S if count > 1 else 0.0)


# A job's settings that may differ between its processes, as nothing trained depends on them: where each host keeps
# its token cache (a disk of its own, filled ahead by `gpt1-jax tokenize`; the default, under $XDG_CACHE_HOME,
# differs by user and host anyway), how long it waits for another process to build it, and whether it draws progress
# bars (only process 0's are shown).
PER_HOST_FIELDS = ("data.cache_dir", "data.cache_wait_s", "data.progress")
_JOB_KEY = "gpt1_jax/job/"
_SHOWN_FIELDS = 3  # the first differing fields a refusal names


def check_same_job(verb: str, workdir: str | Path, config, **more) -> None:
    """Multi-process only: each process publishes its job (`verb`, the workdir as an absolute path, `config`'s fields
    but PER_HOST_FIELDS, and `more`) in the coordination service's key-value store and reads every other's; a job
    they disagree on is refused by each process in the same line. Processes given other --workdir or --set values
    went on apart: one waited an hour for a tokenizer the other never built, or both trained, each process's own
    settings taking part in every step while config.yaml recorded process 0's; another --steps ended in C++."""
    from gpt1_jax.config import flat_fields, to_dict
    from gpt1_jax.data.once import Peers  # its view of jax.distributed, which starts no backend

    peers = Peers.current()
    if peers.count < 2 or peers.client is None:
        return
    fields = {k: v for k, v in flat_fields(to_dict(config)).items() if k not in PER_HOST_FIELDS}
    job = {"verb": verb, "workdir": str(Path(workdir).resolve()), **more, **fields}
    _state["jobs"] += 1  # every process runs its jobs in the same order: the n-th of each is the same job
    prefix = f"{_JOB_KEY}{_state['jobs']}/"
    peers.client.key_value_set(f"{prefix}{peers.index}", json.dumps(job, default=str))
    deadline = time.monotonic() + _state["init_timeout_s"]
    jobs = [_published_job(peers.client, prefix, i, deadline) for i in range(peers.count)]
    if said := disagreement(jobs):
        raise DistributedConfigError(said)


def _published_job(client, prefix: str, index: int, deadline: float) -> dict:
    """Process `index`'s job, once it has published it; a process that refused something before (its own line says
    what) or never got this far is one line here too, not a wait for the heartbeats to time out."""
    while True:
        try:
            return json.loads(client.blocking_key_value_get(f"{prefix}{index}", 1000))
        except Exception:  # not there yet (DEADLINE_EXCEEDED of this one-second wait)
            pass
        try:
            client.key_value_try_get(f"{_REFUSED_KEY}{index}")
        except Exception:  # not refused (NOT_FOUND): still on its way
            if time.monotonic() < deadline:
                continue
            raise DistributedConfigError(f"process {index} did not begin its job within {_state['init_timeout_s']} s "
                                         "(--init-timeout): every process runs the same command") from None
        raise DistributedConfigError(f"process {index} stopped before its job began (its own output says why)")


def disagreement(jobs: list[dict]) -> str | None:
    """The line refusing `jobs` (one per process, in process order) that differ, naming the first differing fields
    and each one's values per process; None if they agree."""
    keys = list(dict.fromkeys(k for job in jobs for k in job))
    differ = [k for k in keys if len({json.dumps(job.get(k), sort_keys=True) for job in jobs}) > 1]
    if not differ:
        return None
    said = "; ".join(_values_per_process(k, jobs) for k in differ[:_SHOWN_FIELDS])
    more = f"; and {len(differ) - _SHOWN_FIELDS} more" if len(differ) > _SHOWN_FIELDS else ""
    return f"processes disagree on their job: {said}{more}; every process runs the same command"


def _values_per_process(key: str, jobs: list[dict]) -> str:
    groups: dict[str, list[int]] = {}  # a value (as JSON) -> the processes holding it, in the order first seen
    for i, job in enumerate(jobs):
        groups.setdefault(json.dumps(job.get(key), sort_keys=True), []).append(i)
    values = []
    for value, ids in groups.items():
        value = json.loads(value)
        who = f"process {ids[0]}" if len(ids) == 1 else f"processes {', '.join(map(str, ids[:-1]))} and {ids[-1]}"
        values.append(f"{value if isinstance(value, str) else repr(value)} in {who}")
    return f"{key}={', '.join(values)}"


def abort(status: int = 1, exc: BaseException | None = None) -> None:
    """Multi-process only: print `exc`'s traceback and leave now, skipping the shutdown barrier (the
    peers may be gone or stuck in a collective that this process will never join). A no-op otherwise."""
    if not _state["multi"]:
        return
    if exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            print("interrupted", file=sys.stderr)
        elif lost := lost_peer(exc):  # the cause is in another process's output; a 40-line traceback here hid it
            first = str(lost).strip().splitlines()[0][:300]
            print(f"gpt1-jax: lost the other processes in a collective ({first}): one of them failed or was stopped, "
                  "and its own output says why", file=sys.stderr)
        else:
            traceback.print_exception(exc, file=sys.stderr)
    try:
        pid = jax.process_index()
    except Exception:
        pid = "?"
    print(f"gpt1-jax: process {pid} failed (status {status}); exiting without waiting for the other processes",
          file=sys.stderr)
    _flush()
    if status == 2 and pid != "?":
        _refuse_together(pid, jax.process_count())
    os._exit(status)


# What XLA's collectives and the coordination service say when a peer process is gone (JAX 0.10, CPU and GPU).
_PEER_LOST = ("Gloo", "DEADLINE_EXCEEDED", "Connection reset by peer", "Connection closed", "another task",
              "heartbeat", "UNAVAILABLE")
# Said of a lost peer whatever the error's type: orbax and multihost_utils re-raise Gloo's as a ValueError. (The
# broader words above, "Gloo" or "UNAVAILABLE" alone, are a lost peer's only in XLA's own error.)
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer")


def lost_peer(exc: BaseException | None) -> BaseException | None:
    """The error saying a collective failed because another process of the job is gone: `exc`, or one it was raised
    from or while handling (None: not such a failure)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        markers = _PEER_LOST if isinstance(exc, jax.errors.JaxRuntimeError) else _PEER_GONE
        if any(m in str(exc) for m in markers):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _exit_on_uncaught(exc_type, exc, tb) -> None:
    abort(1, exc.with_traceback(tb) if exc is not None else None)


def exit_status(status: int) -> int:
    """The CLI's final status: in a multi-process run a failing process leaves at once (see `abort`)."""
    if status:
        abort(status)
    return status


if __name__ == "__main__":  # `python -m gpt1_jax.distributed`: what a gpt1-jax command would use here, one JSON line
    # It reads the GPT1_* environment and the cluster, not flags: `--num-processes 2` printed the defaults, exit 0.
    Parser(prog="python -m gpt1_jax.distributed", description="What a gpt1-jax command would use "
                            "here to start its processes, as one JSON line: from the GPT1_* environment (the flags' "
                            "twins, launch/README.md) and the cluster JAX detects. Takes no flags.").parse_args()

    try:
        cfg = resolve()
        if cfg.mode != "off":  # a count gpt1-jax refuses was reported here as the one it would use (exit 0)
            check_process_count(cfg)
    except DistributedConfigError as e:  # as gpt1-jax's own refusals: one line, status 2
        print(f"python -m gpt1_jax.distributed: error: {e}", file=sys.stderr)
        sys.exit(2)
    cluster = detected_cluster()
    derived = {}
    if cluster:  # what the job would derive: on a TPU VM or in Kubernetes that asks the network (a DNS wait, an API)
        try:
            derived = dict(zip(("coordinator", "num_processes", "process_id", "local_device_ids"),
                               detected_params(dataclasses.replace(cfg, init_timeout_s=min(cfg.init_timeout_s, 10)))))
        except Exception as e:  # a diagnostic: say what failed, in one line
            derived = {"derive_error": str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}
    shown = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "from_env"}
    print(json.dumps({**shown, **derived, "detected_cluster": cluster}))
