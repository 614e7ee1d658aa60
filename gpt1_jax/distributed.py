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

Failing fast. With N processes, one process dying must not leave the others blocked in a collective
for minutes (STACK.md: ~100 s heartbeat, ~300 s shutdown by default). So:
  * the heartbeat timeout defaults to 30 s and the shutdown timeout to 30 s (flags / env below);
  * once initialised with N > 1, an uncaught exception prints its traceback and ends the process at
    once with `os._exit(1)` (no atexit shutdown barrier waiting for peers that will never come), and a
    non-zero exit status from a verb does the same (`exit_status`). The peers then see the closed
    connections or the missing heartbeats and abort too: nothing hangs, every process exits non-zero.
  * a clean exit (status 0) still goes through JAX's shutdown barrier, so process 0 (which hosts the
    coordinator) never pulls the service from under processes still finishing.

Nothing here imports jax at module level: the CLI must set XLA_FLAGS (`--simulate-devices`) first.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback
from typing import Sequence

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

_state: dict = {"initialized": False, "multi": False, "startup_s": None}


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    mode: str = "auto"  # auto | on | off
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    heartbeat_timeout_s: int = DEFAULT_HEARTBEAT_S
    shutdown_timeout_s: int = DEFAULT_SHUTDOWN_S
    init_timeout_s: int = DEFAULT_INIT_TIMEOUT_S

    @property
    def explicit(self) -> bool:
        return any(v is not None for v in (self.coordinator, self.num_processes, self.process_id))


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("multi-process (see launch/README.md)")
    g.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help=f"address of process 0's coordinator (env {ENV_COORDINATOR})")
    g.add_argument("--num-processes", type=int, default=None, metavar="N", help=f"env {ENV_NUM_PROCESSES}")
    g.add_argument("--process-id", type=int, default=None, metavar="I", help=f"0..N-1 (env {ENV_PROCESS_ID})")
    g.add_argument("--distributed", choices=("auto", "on", "off"), default=None,
                   help=f"auto: initialise only on a cluster JAX detects or with the flags above; on: always "
                        f"(JAX fills in what is missing); off: never (env {ENV_MODE}; default auto)")
    g.add_argument("--heartbeat-timeout", type=int, default=None, metavar="S",
                   help=f"seconds before a silent process counts as dead (env {ENV_HEARTBEAT}; default {DEFAULT_HEARTBEAT_S})")
    g.add_argument("--shutdown-timeout", type=int, default=None, metavar="S",
                   help=f"seconds a finishing process waits for the others (env {ENV_SHUTDOWN}; default {DEFAULT_SHUTDOWN_S})")
    g.add_argument("--init-timeout", type=int, default=None, metavar="S",
                   help=f"seconds to wait for all processes to connect (env {ENV_INIT_TIMEOUT}; default {DEFAULT_INIT_TIMEOUT_S})")


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
        heartbeat_timeout_s=pick("heartbeat_timeout", ENV_HEARTBEAT) or DEFAULT_HEARTBEAT_S,
        shutdown_timeout_s=pick("shutdown_timeout", ENV_SHUTDOWN) or DEFAULT_SHUTDOWN_S,
        init_timeout_s=pick("init_timeout", ENV_INIT_TIMEOUT) or DEFAULT_INIT_TIMEOUT_S,
    )
    if cfg.mode != "off" and cfg.explicit:
        missing = [n for n, v in (("--coordinator", cfg.coordinator), ("--num-processes", cfg.num_processes),
                                  ("--process-id", cfg.process_id)) if v is None]
        if missing and cfg.mode != "on":
            raise DistributedConfigError(
                f"multi-process start needs --coordinator, --num-processes and --process-id together "
                f"(or {ENV_COORDINATOR}/{ENV_NUM_PROCESSES}/{ENV_PROCESS_ID}); missing {', '.join(missing)} "
                f"(or --distributed on to let JAX detect them)")
        if cfg.coordinator is not None and not _split_address(cfg.coordinator):
            raise DistributedConfigError(f"--coordinator must be HOST:PORT, got {cfg.coordinator!r}")
        if cfg.num_processes is not None and cfg.num_processes < 1:
            raise DistributedConfigError(f"--num-processes must be >= 1, got {cfg.num_processes}")
        if cfg.process_id is not None and cfg.num_processes is not None and not 0 <= cfg.process_id < cfg.num_processes:
            raise DistributedConfigError(f"--process-id {cfg.process_id} not in [0, {cfg.num_processes})")
    for name, v in (("heartbeat", cfg.heartbeat_timeout_s), ("shutdown", cfg.shutdown_timeout_s), ("init", cfg.init_timeout_s)):
        if v < 1:
            raise DistributedConfigError(f"--{name}-timeout must be >= 1 second, got {v}")
    return cfg


def _split_address(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def detected_cluster() -> str | None:
    """Name of the cluster environment JAX would auto-detect here, or None on a plain machine.

    Uses JAX's own detectors (jax._src.clusters: Cloud TPU, GKE TPU, SLURM, Open MPI, Kubernetes); the
    opt-in ones (mpi4py) are skipped as JAX skips them. SLURM / Open MPI with a single task mean an
    interactive allocation running one process: no coordinator needed, so that is "no cluster".
    """
    try:
        from jax._src.clusters import ClusterEnv  # private, but it *is* JAX's detection
    except ImportError:  # a JAX that moved it: fall back to the schedulers' own variables
        if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
            return "SlurmCluster"
        if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
            return "OmpiCluster"
        return None
    for env in ClusterEnv._cluster_types:
        if getattr(env, "opt_in_only_method", False):
            continue
        try:
            if not env.is_env_present():
                continue
            if env.__name__ in ("SlurmCluster", "OmpiCluster") and env.get_process_count() <= 1:
                return None
        except Exception:  # a detector that cannot run here (missing package, no metadata server)
            continue
        return env.__name__
    return None


def initialize(args: argparse.Namespace | None = None) -> bool:
    """Call jax.distributed.initialize if the flags, the environment or the cluster ask for it.
    Returns True when this is a multi-process run. Idempotent; call before any jax computation."""
    if _state["initialized"]:
        return _state["multi"]
    cfg = resolve(args)
    if cfg.mode == "off":
        return False
    if cfg.mode == "auto" and not cfg.explicit:
        cluster = detected_cluster()
        if cluster is None:
            return False
    if cfg.explicit and cfg.num_processes == 1 and cfg.mode == "auto":
        return False  # one process: nothing to coordinate

    import jax

    kwargs = dict(
        coordinator_address=cfg.coordinator,
        num_processes=cfg.num_processes,
        process_id=cfg.process_id,
        initialization_timeout=cfg.init_timeout_s,
        heartbeat_timeout_seconds=cfg.heartbeat_timeout_s,
        shutdown_timeout_seconds=cfg.shutdown_timeout_s,
    )
    host_port = _split_address(cfg.coordinator) if cfg.coordinator else None
    if host_port and host_port[0] in ("127.0.0.1", "localhost", "::1"):
        # A local run: bind the coordinator to loopback only, not every interface (JAX's default).
        kwargs["coordinator_bind_address"] = f"{host_port[0]}:{host_port[1]}"
    t0 = time.perf_counter()
    jax.distributed.initialize(**kwargs)
    _state.update(initialized=True, multi=jax.process_count() > 1, startup_s=time.perf_counter() - t0)
    if _state["multi"]:
        sys.excepthook = _exit_on_uncaught
    print(f"gpt1-jax: process {jax.process_index()} of {jax.process_count()} up in {_state['startup_s']:.2f} s "
          f"(coordinator {cfg.coordinator or 'auto-detected'}, {jax.local_device_count()} local / "
          f"{jax.device_count()} global devices)", file=sys.stderr, flush=True)
    return _state["multi"]


def is_multiprocess() -> bool:
    return _state["multi"]


def startup_seconds() -> float | None:
    """Seconds jax.distributed.initialize took (None if it was not called)."""
    return _state["startup_s"]


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def abort(status: int = 1, exc: BaseException | None = None) -> None:
    """Multi-process only: print `exc`'s traceback and leave now, skipping the shutdown barrier (the
    peers may be gone or stuck in a collective that this process will never join). A no-op otherwise."""
    if not _state["multi"]:
        return
    if exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            print("interrupted", file=sys.stderr)
        else:
            traceback.print_exception(exc, file=sys.stderr)
    try:
        import jax

        pid = jax.process_index()
    except Exception:
        pid = "?"
    print(f"gpt1-jax: process {pid} failed (status {status}); exiting without waiting for the other processes",
          file=sys.stderr)
    _flush()
    os._exit(status)


def _exit_on_uncaught(exc_type, exc, tb) -> None:
    abort(1, exc.with_traceback(tb) if exc is not None else None)


def exit_status(status: int) -> int:
    """The CLI's final status: in a multi-process run a failing process leaves at once (see `abort`)."""
    if status:
        abort(status)
    return status


def dry_run(config) -> dict:
    """Ahead-of-time sizing of a pre-training job: compile the train step of `config` (a PretrainConfig)
    for its mesh over the visible devices (real or `--simulate-devices N` fake ones) and report per-device
    memory and FLOPs, without data, tokenizer or training. The model's vocab_size is taken as configured
    (the presets' tokenizer size); the batch is the global batch without the "weights" input."""
    import math

    import jax

    from gpt1_jax import flops
    from gpt1_jax.config import ConfigError
    from gpt1_jax.sharding import batch_divisor, logical_rules, make_mesh
    from gpt1_jax.step import Trainer

    t0 = time.perf_counter()
    mesh = make_mesh(config.mesh)
    B, T = config.data.global_batch_size, config.data.seq_len
    divisor = batch_divisor(mesh) * config.accum_steps
    if B % divisor:
        raise ConfigError(f"global batch {B} is not divisible by data x fsdp x accum_steps = {divisor} "
                          f"(mesh {dict(mesh.shape)})")
    if T > config.model.n_positions:
        raise ConfigError(f"seq_len {T} exceeds the model's n_positions={config.model.n_positions}")
    trainer = Trainer(config.model, config.optim, mesh, logical_rules(config.mesh.rules),
                      accum_steps=config.accum_steps, seed=config.seed)
    lowered = trainer.lower((B, T))
    t_lower = time.perf_counter()
    compiled = lowered.compile()
    t_compile = time.perf_counter()

    # Train state per device, from the shardings alone (nothing is allocated).
    state_per_device = 0
    for leaf in jax.tree.leaves(trainer.abstract_state_sharded()):
        shard = leaf.sharding.shard_shape(leaf.shape)
        state_per_device += math.prod(shard) * leaf.dtype.itemsize
    state_total = sum(math.prod(l.shape) * l.dtype.itemsize for l in jax.tree.leaves(trainer.abstract_state))

    result = {
        "dry_run": True,
        "num_params": config.model.num_params(),
        "dtype": config.model.dtype,
        "param_dtype": config.model.param_dtype,
        "global_batch": B,
        "seq_len": T,
        "accum_steps": config.accum_steps,
        "mesh": dict(mesh.shape),
        "devices": mesh.size,
        "platform": jax.devices()[0].platform,
        "process_count": jax.process_count(),
        "lower_s": round(t_lower - t0, 2),
        "compile_s": round(t_compile - t_lower, 2),
        "state_bytes_total": state_total,
        "state_bytes_per_device": state_per_device,
    }
    mem = compiled.memory_analysis()
    if mem is not None:
        get = lambda name: int(getattr(mem, name, 0) or 0)
        arg, out, alias, temp = (get(f"{n}_size_in_bytes") for n in ("argument", "output", "alias", "temp"))
        result.update(
            argument_bytes_per_device=arg,
            output_bytes_per_device=out,
            alias_bytes_per_device=alias,
            temp_bytes_per_device=temp,
            generated_code_bytes=get("generated_code_size_in_bytes"),
            # live at once: inputs + outputs not donated into inputs + scratch
            peak_bytes_per_device=arg + out - alias + temp,
        )
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if cost:
        result["flops_per_device"] = float(cost.get("flops", 0.0))  # XLA's count for one device's program
        if "bytes accessed" in cost:
            result["bytes_accessed_per_device"] = float(cost["bytes accessed"])
    model_flops = flops.flops_per_token(config.model, T) * B * T
    result["model_flops_per_step"] = model_flops  # 6N + 12·L·d·T per token, all devices
    result["model_flops_per_device"] = model_flops / mesh.size
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpt1_jax.distributed [flags]`: print what would be done here (a diagnostic)."""
    import json

    p = argparse.ArgumentParser(prog="python -m gpt1_jax.distributed", description="show the distributed set-up")
    add_arguments(p)
    args = p.parse_args(argv)
    cfg = resolve(args)
    print(json.dumps({**dataclasses.asdict(cfg), "detected_cluster": detected_cluster()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
