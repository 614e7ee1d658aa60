"""The XLA flags every test process and every subprocess the tests start compile with.

The suite's programs are tiny: compiling them costs far more than running them (a tiny pre-training step
compiles in ~10 s at XLA's default backend optimisation on 2 cores, ~3 s at level 0, and runs ~20% slower).
Level 0 changes no semantics (same programs, same fp32 math up to op order), so what a test checks holds
the same; runs a test compares with each other all compile with the same flags. Eigen's matmuls run on one
thread: the suite's two workers already keep both cores busy, and two threads each only contend (measured:
4% less wall-clock for test_pretrain.py + test_checkpoint.py at -n 2).

Every test process and subprocess also uses XLA:CPU's older loop emitters: they compile the tiny train step
in 2.1 s against the fusion emitters' 3.7 s, with the same losses to 6 decimals at the same step speed
(measured 2026-11-26, AVX2 kind; the unit tier's CPU time fell from 248 s to 183 s, 2026-11-27). Three
tests check a bit-identity that holds under the fusion emitters users run and not under the loop emitters
(1-ulp differences in most parameters): the update of a step with per-layer statistics, of a step inside a
profiler window, and of a step taking the lr and the dropout seed as inputs, each equal to the plain step's.
They are marked `fusion_emitters` and rerun alone in a process that keeps those emitters (tests/conftest.py).

What these flags hide is a kernel XLA:CPU lacks at its own settings (a bf16 product that runs here and fails
there): tests/e2e/test_step.py runs the bf16 attention core without them. The whole suite with XLA's default
backend level and the fusion emitters (this file's two strings set to `--xla_cpu_multi_thread_eigen=false` and
`--xla_cpu_use_fusion_emitters=true`): 524 unit and 194 e2e tests passed, none failed, in 1 min 28 s and 9 min 42 s
on 2 cores (2026-11-29, AVX-512 kind), against 54 s and 6 min 32 s with them, the same day."""

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"
LOOP_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS for a subprocess: fast compilation, plus `devices` fake CPU devices when given."""
    return f"{FAST_COMPILE} {LOOP_EMITTERS}" + (f" --xla_force_host_platform_device_count={devices}" if devices else "")
