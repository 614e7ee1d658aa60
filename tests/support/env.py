"""The XLA flags every test process and every subprocess the tests start compile with.

The suite's programs are tiny: compiling them costs far more than running them (a tiny pre-training step
compiles in ~10 s at XLA's default backend optimisation on 2 cores, ~3 s at level 0, and runs ~20% slower).
Level 0 changes no semantics (same programs, same fp32 math up to op order), so what a test checks holds
the same; runs a test compares with each other all compile with the same flags. Eigen's matmuls run on one
thread: the suite's two workers already keep both cores busy, and two threads each only contend (measured:
4% less wall-clock for test_pretrain.py + test_checkpoint.py at -n 2)."""

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"


def xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS for a subprocess: fast compilation, plus `devices` fake CPU devices when given."""
    return FAST_COMPILE + (f" --xla_force_host_platform_device_count={devices}" if devices else "")
