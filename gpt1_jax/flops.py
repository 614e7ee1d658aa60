"""Model FLOPs per token and MFU against a stated peak.

Training FLOPs per token (PaLM appendix B / Chinchilla convention):
    6 * N  +  12 * L * d * T
  6N: every parameter takes part in one multiply-add (2 FLOPs) forward and two backward (grad wrt input
      and wrt weight), N counting *all* params, embeddings included (the tied LM head is a [d, V] matmul
      per token, so the token table's 6*V*d is real work; the position table's 6*P*d is not, a <0.3%
      overcount for GPT-1 we accept to keep the count standard).
  12*L*d*T: attention scores q.k and probs.v, 2*T*d multiply-adds each per token per layer, x3 for
      forward+backward; counted for the full T x T square although the causal half is masked
      (again the standard convention).
Rematerialisation's extra forward is *not* counted: this is model FLOPs (MFU), not hardware FLOPs.

Peaks: dense bf16 tensor-core/MXU numbers per chip from the vendors' spec sheets (no sparsity). On
CPU there is no spec-sheet number worth using, so the peak is a measured large matmul in the compute
dtype, fp32 accumulation. CPUs differ a lot (one 2-core machine ~160 / ~250 GFLOP/s fp32 / bf16, the
AVX-512 EPYC this was benchmarked on ~400 / ~850), so the measured number is always printed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gpt1_jax.compile_cache import cpu_identity
from gpt1_jax.config import ModelConfig
from gpt1_jax.files import atomic_write_text

# bf16 dense, FLOP/s per chip.
ACCELERATOR_PEAK_FLOPS: dict[str, float] = {
    "H100": 989e12,  # SXM; PCIe is 756e12
    "H200": 989e12,
    "A100": 312e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,  # = v5e (its device_kind string)
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,  # v5p reports device_kind "TPU v5"
    "TPU v6 lite": 918e12,  # = v6e (Trillium)
}


def cpu_flags() -> list[str]:
    """This CPU's vector-extension flags (avx*, amx*, fma*, sha_ni), printed beside every speed number:
    machines of one name differ (AVX-512 with native bf16, or AVX2 only), and so do their speeds."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next(l for l in f if l.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma", "sha_ni")))


def native_bf16() -> bool:
    """Whether bf16 matmuls can be fast here: any accelerator, or a CPU with AVX512-BF16 or AMX-BF16."""
    if jax.devices()[0].platform != "cpu":
        return True
    flags = cpu_flags()
    return not flags or any(f in flags for f in ("avx512_bf16", "amx_bf16"))  # unknown CPU: trust the config


def fit_compute_dtype(model: ModelConfig) -> ModelConfig:
    """`model`, computing in float32 where bf16 compute would be slower than float32: a CPU without native
    bf16 (AVX2-only machines) converts every bf16 operand in software. Parameters and optimizer state are
    float32 either way (param_dtype), so only speed changes; the switch is said once on stderr."""
    if model.dtype != "bfloat16" or native_bf16():
        return model
    print("gpt1-jax: this CPU has no native bf16 (no avx512_bf16 or amx_bf16 flag): computing in float32, "
          "which is faster here", file=sys.stderr)
    return dataclasses.replace(model, dtype="float32")


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training (fwd + bwd) model FLOPs per token at sequence length `seq_len`."""
    return 6.0 * config.num_params() + 12.0 * config.n_layers * config.d_model * seq_len


def accelerator_peak(device_kind: str) -> float | None:
    """The table's per-chip peak for a jax `device_kind` ("NVIDIA H100 80GB HBM3", "TPU v5 lite", ...)."""
    kind = device_kind.upper()
    # Longest names first so "TPU v5 lite" wins over "TPU v5".
    for name in sorted(ACCELERATOR_PEAK_FLOPS, key=len, reverse=True):
        if name.upper() in kind:
            return ACCELERATOR_PEAK_FLOPS[name]
    return None


PEAK_MATMUL_N = 2048  # the CPU peak's n^3 product: the size a remembered peak is kept under and labelled with


@functools.lru_cache(maxsize=None)
def measured_matmul_peak(dtype: str = "float32", n: int = PEAK_MATMUL_N, repeats: int = 3) -> float:
    """FLOP/s of an n^3 matmul on this process's first device (best of `repeats`: a peak, and the shared 2-core
    machines are noisy), cached per process. 2048^3 reaches the rate 4096^3 does on these CPUs (measured
    alone on the AVX2 kind: 70.8 and 77.0 against 70.0 and 68.7 GFLOP/s) at an eighth of the cost.

    bf16 inputs accumulate in fp32 (`preferred_element_type`), which is what the model's matmuls ask
    for in spirit and the faster path on this CPU.
    """
    device = jax.local_devices()[0]  # jax.devices()[0] is process 0's: another process timed nothing (8.5 PFLOP/s)
    a = jax.device_put(jnp.ones((n, n), dtype), device)
    b = jax.device_put(jnp.ones((n, n), dtype), device)
    mm = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    mm(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mm(a, b).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 2.0 * n**3 / float(np.min(times))


def remembered_matmul_peak(dtype: str, measured: float | None = None) -> float:
    """`measured_matmul_peak`, measured once per CPU, dtype and jax version and kept beside the compilation
    cache (gpt1_jax/compile_cache.py), for what only labels a number: a run's MFU in its log. The
    measurement costs a second or more of both cores (four 2048^3 products), at the start of every run otherwise.
    `measured`: a fresh measurement (`gpt1-jax bench` measures afresh); the kept value is the highest seen, as a
    peak is, so one taken while another job shared the cores is corrected by the next quiet one."""
    folder = os.environ.get("JAX_COMPILATION_CACHE_DIR")  # set by compile_cache.enable: None where it is off
    if not folder:
        return measured if measured is not None else measured_matmul_peak(dtype)
    path = Path(folder) / "matmul-peak.json"
    key = f"{cpu_identity()} | {dtype} {PEAK_MATMUL_N}^3 | jax {jax.__version__}"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known or (measured is not None and measured > known[key]):
        known[key] = measured if measured is not None else measured_matmul_peak(dtype)
        try:  # whole or not at all: concurrent runs may read it
            atomic_write_text(path, json.dumps(known, indent=1) + "\n")
        except OSError:  # a read-only cache folder: measure again next time
            pass
    return float(known[key])


def peak_flops(dtype: str = "float32", override: float | None = None, remembered: bool = False) -> tuple[float, str]:
    """(peak FLOP/s of the whole machine the step runs on, where the number comes from). `remembered`: on CPU,
    the machine's measurement kept from an earlier run (`remembered_matmul_peak`)."""
    if override:
        return float(override), "given"
    devices = jax.devices()
    if devices[0].platform == "cpu":
        # Fake CPU devices share the same cores: the machine's peak is one measurement, not n of them.
        if remembered:
            peak = remembered_matmul_peak(dtype)
        else:  # measured now, and kept if it is the highest yet
            peak = measured_matmul_peak(dtype)
            remembered_matmul_peak(dtype, measured=peak)
        return peak, f"measured {dtype} {PEAK_MATMUL_N}^3 matmul on CPU (fp32 accumulation)"
    per_chip = accelerator_peak(devices[0].device_kind)
    if per_chip is None:
        return measured_matmul_peak("bfloat16") * len(devices), f"measured bf16 matmul x {len(devices)} ({devices[0].device_kind})"
    return per_chip * len(devices), f"table bf16 dense {devices[0].device_kind} x {len(devices)}"


def mfu(tokens_per_s: float, flops_per_tok: float, peak: float) -> float:
    return tokens_per_s * flops_per_tok / peak
