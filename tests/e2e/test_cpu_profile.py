"""experiments/bench/cpu_profile.py on a real running step: perf samples a worker process training the tiny model,
gdb names XLA's kernels. Skipped where perf cannot sample (no perf, or a kernel that forbids it)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _perf_works() -> bool:
    if shutil.which("perf") is None:
        return False
    done = subprocess.run(["perf", "record", "-q", "-o", "/dev/null", "--", "true"], capture_output=True)
    return done.returncode == 0


def _gdb_attaches() -> bool:
    """gdb is here and may attach to a child process (ptrace allowed)."""
    if shutil.which("gdb") is None:
        return False
    child = subprocess.Popen(["sleep", "30"])
    try:
        done = subprocess.run(["gdb", "-q", "-batch", "-p", str(child.pid), "-ex", "detach"], capture_output=True,
                              text=True, timeout=60)
        return done.returncode == 0 and "Operation not permitted" not in done.stderr + done.stdout
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not _perf_works(), reason="perf is missing or may not sample here")
def test_a_running_step_is_sampled_and_xla_kernels_are_named():
    done = subprocess.run([sys.executable, "-m", "experiments.bench.cpu_profile", "--config", "tiny", "--batch", "8",
                           "--seq", "32", "--seconds", "1", "--kernels", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    summary, parts = lines[-1], {row["part"]: row["share"] for row in lines if "part" in row}
    assert summary["summary"] and summary["samples"] > 100 and summary["step_s_median"] > 0
    assert sum(parts.values()) == pytest.approx(1.0, abs=0.01) and parts["xla_generated"] > 0
    assert parts.get("ynnpack_products", 0) + parts.get("eigen_products", 0) > 0
    if _gdb_attaches():  # XLA's JIT code, named through gdb: its fusions
        kernels = [row["xla_kernel"] for row in lines if "xla_kernel" in row]
        assert summary["xla_samples_named"] > 0.3 and kernels and any("fusion" in k for k in kernels), lines
