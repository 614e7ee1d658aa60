"""Every test sees 8 fake CPU devices, so sharding runs on a laptop (must happen before jax starts); the commands
the tests start see the machine's one CPU device, as a user's command does, unless a test gives them more
(`tests.support.env.xla_flags(devices)`, or the command's own --simulate-devices).

Two tiers: tests/unit runs in process, a few seconds a test at most (a developer's loop, ~3 minutes);
tests/e2e holds what needs real processes or whole runs: subprocess commands, pipelines, multi-host,
kill and resume, compiled pod plans, fine-tuning runs, parity on the full data. tests/support/ holds
what a file's two halves share.

Data: tests read the small files in tests/fixtures/ (a fresh clone has them). The full data sets
live in ../shared beside the repo root on this project's machines only; the few tests that need
them take `shared_dir` and skip without it. GPT1_JAX_SHARED=DIR points there instead, and
GPT1_JAX_SHARED=/nonexistent runs the suite as a fresh clone would.
"""

import atexit
import gc
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.env import FAST_COMPILE, LOOP_EMITTERS

# Tests marked `fusion_emitters` rerun themselves in one fresh process that keeps them (pytest_pyfunc_call below).
_EMITTERS_VAR = "PYTEST_GPT1_JAX_EMITTERS"
FUSION_PROCESS = os.environ.get(_EMITTERS_VAR) == "fusion"
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split()
     if "device_count" not in f and f not in FAST_COMPILE.split() and f not in LOOP_EMITTERS.split()]
    + [FAST_COMPILE] + ([] if FUSION_PROCESS else [LOOP_EMITTERS])
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402  (after XLA_FLAGS: the backend reads them when it starts)

# This process's 8 devices are set here, not in XLA_FLAGS, which every subprocess inherits: a tiny run on 8 fake
# devices costs ~0.7 CPU-s more than on one (`pretrain --config tiny --steps 12`: 4.6 against 3.9 s, 2026-11-30).
jax.config.update("jax_num_cpu_devices", 8)
# The suite's CLI subprocesses would each re-execute themselves for glibc's huge pages (gpt1_jax/hugepages.py),
# importing jax twice for steps too small to gain; tests/e2e/test_bench.py runs one with it on.
os.environ["GPT1_JAX_HUGE_PAGES"] = "off"
# A suite started in the background of a shell without job control (`nohup ... &`) inherits SIGINT ignored and
# hands that to every process it starts: the Ctrl-C tests need Python's own handler, as a terminal gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# The many short runs in subprocesses compile the same tiny programs: JAX's persistent cache (keyed by the
# program, jax's version and the devices) lets them share the compilations within one test session.
# Under pytest-xdist the controller makes the folder and each worker uses its own subfolder, unbounded:
# bounded (gpt1_jax/compile_cache.py's default), JAX locks the folder and scans all of it at every write, which
# cost the suite ~100 worker-seconds at the thousands of tiny entries it writes; unbounded, it writes without a
# lock, so two workers never share a folder (a worker's processes run one after another).
_ROOT_VAR = "PYTEST_GPT1_JAX_XLA_CACHE"  # the controller's folder, inherited by its workers
if not os.environ.get(_ROOT_VAR):
    os.environ[_ROOT_VAR] = tempfile.mkdtemp(prefix="gpt1-jax-tests-xla-")
    atexit.register(shutil.rmtree, os.environ[_ROOT_VAR], ignore_errors=True)
_XLA_CACHE = os.path.join(os.environ[_ROOT_VAR], os.environ.get("PYTEST_XDIST_WORKER", "main"))
os.makedirs(_XLA_CACHE, exist_ok=True)
if os.environ.get("JAX_COMPILATION_CACHE_DIR", "").startswith(os.environ[_ROOT_VAR]) \
        or not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = "-1"
# libtpu (the TPU compiler of the pod plans) leaves three log files a process in /tmp/tpu_logs, never removed: ~400
# files, 20 MB, after two days of suites on one machine. The suite's go beside its compilation cache, and with it.
os.environ.setdefault("TPU_LOG_DIR", os.path.join(os.environ[_ROOT_VAR], "tpu_logs"))

SHARED = Path(os.environ.get("GPT1_JAX_SHARED") or Path(__file__).resolve().parents[2] / "shared")
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The full data sets (GLUE, OpenAI's vocabulary, ...): absent on a user's fresh clone."""
    if not SHARED.is_dir():
        pytest.skip(f"shared data not found at {SHARED} (only this project's machines have it)")
    return SHARED


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    """A few rows per file in GLUE's official layout, with its quirks (tests/fixtures/README.md)."""
    return FIXTURES / "glue"


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    """A tiny vocabulary in OpenAI's format and file names, plus the release's params_shapes.json."""
    return FIXTURES / "gpt1_vocab"


@pytest.fixture
def mount_tmpfs():
    """mount_tmpfs(path, size_bytes) mounts a tmpfs there (unmounted at the end); skips where mount is
    not allowed."""
    mounted = []

    def mount(path: Path, size: int) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked `fusion_emitters` checks a bit-identity that holds under XLA:CPU's fusion emitters, which
    users run, and not under the loop emitters the suite compiles with (tests/support/env.py): it runs again,
    alone, in a fresh pytest process that keeps the fusion emitters."""
    if FUSION_PROCESS or pyfuncitem.get_closest_marker("fusion_emitters") is None:
        return None
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-n", "0",
                           pyfuncitem.nodeid], cwd=root, capture_output=True, text=True, timeout=600,
                          env={**os.environ, _EMITTERS_VAR: "fusion"})
    if done.returncode != 0:
        pytest.fail(f"under the fusion emitters:\n{done.stdout[-6000:]}{done.stderr[-2000:]}", pytrace=False)
    summary = done.stdout.strip().splitlines()[-1]
    if " passed" not in summary:  # skipped there: say so here, not "passed"
        reasons = re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", done.stdout, re.M)
        pytest.skip(f"under the fusion emitters: {reasons[0] if reasons else summary}")
    return True


# A worker's heap grows with what its tests leave in JAX's caches (traced and compiled programs) and with the
# libraries the test files import; each full collection walks all of it. Frozen (collected first, so only live
# objects), the walks cover one test file's objects at a time. The whole suite, 2026-11-30 (AVX-512 kind): the two
# workers' collections took 46.7 s before, 18.8 s after (with gpt1_jax/cli.py's freeze, the commands' 40.8 s became
# 32.1 s), the suite 8 min 29 s and 7 min 44 s; a worker's peak memory 6.2 and 7.1 GB (cyclic garbage among frozen
# objects stays till the worker ends: memory, not results).
def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)  # after pytest's own teardown: the module's fixtures are gone
def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or nextitem.module is not item.module:
        gc.collect()
        gc.freeze()
