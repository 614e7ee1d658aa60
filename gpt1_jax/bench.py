"""Timing of the sharded pre-training step (forward + backward + optimizer update), for `gpt1-jax bench`.

The step is the one `pretrain` runs for the same config. It is compiled ahead of time by
gpt1_jax/sizing.py, whose report (compile time, memory, FLOPs) is part of the result; the timed steps
run that executable on fixed seeded tokens, so `losses` are comparable between runs and implementations.
"""

from __future__ import annotations

import dataclasses
import functools
import resource
import statistics
import sys
import time
from typing import Any

import jax
import numpy as np

from gpt1_jax import flops, hugepages, sizing
from gpt1_jax.attention import check_runnable as check_attention
from gpt1_jax.config import OptimConfig, PretrainConfig
from gpt1_jax.errors import ConfigError
from gpt1_jax.metrics import Bar, say
from gpt1_jax.step import lm_batch, lm_batch_spec


def seeded_batches(trainer, config: PretrainConfig, n: int) -> list:
    """`n` global batches of random tokens drawn from `config.seed`, placed on the trainer's mesh (each process
    its own rows), before any timing: the same tokens in every run, so losses compare between runs."""
    B, T = config.data.global_batch_size, config.data.seq_len
    windows = np.random.default_rng(config.seed).integers(0, config.model.vocab_size, (n, B, T + 1), dtype=np.int32)
    local = B // jax.process_count()
    rows = slice(jax.process_index() * local, (jax.process_index() + 1) * local)
    return [trainer.put_batch(lm_batch(tokens[rows])) for tokens in windows]


def timed_steps(compiled, trainer, state, batches: list, warmup: int, bar: Bar) -> tuple[list, list, dict]:
    """(seconds, loss) of each step after the first `warmup` of `batches`, and the process's page faults and kernel
    CPU per timed step: a step that maps fresh memory (as while GPT1_JAX_HUGE_PAGES=keep grows its heap) can take
    twice as long, and says so there (experiments/bench/README.md, 2026-12-02 (later)). `bar` moves between steps,
    outside the timed intervals."""
    times, losses = [], []
    for i, batch in enumerate(batches):
        if i == warmup:
            before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        state, metrics = compiled(state, batch, trainer.hyper)
        # Waits for the loss; the update may end after it, inside the next step's interval: in steady state
        # each interval holds one step's work, which the median reads.
        loss = float(metrics["loss"])
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            losses.append(round(loss, 6))
        bar.update(1)
    return times, losses, kernel_per_step(before, resource.getrusage(resource.RUSAGE_SELF), len(times))


def kernel_per_step(before, after, steps: int) -> dict[str, Any]:
    """The page faults and kernel CPU per step between two `resource.getrusage` readings `steps` steps apart."""
    return {"minor_faults_per_step": round((after.ru_minflt - before.ru_minflt) / steps),
            "sys_cpu_s_per_step": round((after.ru_stime - before.ru_stime) / steps, 4)}


def optimizer_fields(optim: OptimConfig) -> dict[str, Any]:
    """The optimizer a report's step updates with: its state is in the state bytes, its update in the step time, and
    the lr the timed steps ran at is the schedule's at steps 0.., so a record read beside others says which it was."""
    return {"optim": optim.name, "lr": optim.lr, "schedule": optim.schedule, "warmup_steps": optim.warmup_steps}


def run(config: PretrainConfig, *, steps: int = 5, warmup: int = 1, compile_only: bool = False,
        peak_flops: float | None = None, progress: bool = True) -> dict[str, Any]:
    """The sizing report of `config`'s train step and its optimizer (`optimizer_fields`) plus, unless
    `compile_only`, the median step time, tokens/s, MFU against `peak_flops` (default: gpt1_jax/flops.py's table
    or a measured matmul) and the losses of the `steps` timed steps that follow `warmup` untimed ones. `progress`:
    status lines and a bar of the steps on stderr (process 0's)."""
    if steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    if warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {warmup}")
    check_attention(config.model.attention, config.model.attn_dropout, True, config.model.head_dim)
    config = dataclasses.replace(config, model=flops.fit_compute_dtype(config.model))
    trainer = sizing.pretrain_trainer(config)
    B, T = config.data.global_batch_size, config.data.seq_len
    speaks = progress and jax.process_index() == 0
    status = functools.partial(say, who="bench")  # stdout holds its one JSON line
    result, compiled = sizing.size_step(trainer, lm_batch_spec(B, T), config.model, status if speaks else None)
    result = {**result, **optimizer_fields(config.optim)}
    if compile_only:
        return result

    if speaks:
        status(f"compiled in {result['lower_s'] + result['compile_s']:.1f} s; running {warmup} warm-up + {steps} "
               "timed steps")
    state = trainer.init()
    batches = seeded_batches(trainer, config, warmup + steps)
    with Bar(total=len(batches), desc="bench", unit="step", disable=not speaks, dynamic_ncols=True, file=sys.stderr,
             mininterval=0.5) as bar:
        times, losses, kernel = timed_steps(compiled, trainer, state, batches, warmup, bar)
    step_s = statistics.median(times)
    device = jax.devices()[0]
    # An accelerator's allocator knows the bytes the step really held at once, beside the compiler's
    # estimate (`peak_bytes_per_device`); a CPU reports nothing.
    used = (device.memory_stats() or {}).get("peak_bytes_in_use") if device.platform != "cpu" else None
    peak, peak_source = flops.peak_flops(config.model.dtype, peak_flops)
    tokens_per_s = B * T / step_s
    # A fresh peak varies by ~15% between runs on a shared 2-core machine (420-483 GFLOP/s fp32 in one session):
    # the highest one this CPU has measured is the stable denominator (experiments/bench/README.md).
    best = flops.remembered_matmul_peak(config.model.dtype) if device.platform == "cpu" and not peak_flops else None
    return {
        **result,
        "step_s_median": round(step_s, 4),
        "step_s": [round(t, 4) for t in times],
        "tokens_per_s": round(tokens_per_s, 2),
        "model_flops_per_s": round(tokens_per_s * result["flops_per_token"], 1),
        "peak_flops": peak,
        "peak_source": peak_source,
        "mfu": round(flops.mfu(tokens_per_s, result["flops_per_token"], peak), 4),
        **({"best_peak_flops": best,
            "mfu_of_best_peak": round(flops.mfu(tokens_per_s, result["flops_per_token"], best), 4)} if best else {}),
        "losses": losses,
        **kernel,
        "device_kind": device.device_kind,
        **({"device_peak_bytes_in_use": int(used)} if used is not None else {}),
        "cpu_flags": flops.cpu_flags(),
        "malloc_huge_pages": hugepages.active(),
        "malloc_kept_heap": hugepages.kept_heap(),
    }
