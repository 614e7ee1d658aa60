"""JAX's persistent compilation cache for every gpt1-jax process: a run whose programs were compiled
before (same shapes, mesh, jax and XLA flags) loads them from disk instead of compiling them again.
Short experiment runs, hundreds of them in the GLUE and optimizer sweeps, otherwise spend much of their
time compiling.

JAX keys an entry by the program, jaxlib's version, the backend, XLA flags and the devices, but not by
the host CPU's instruction set. An XLA:CPU executable is compiled for the host it runs on, so one made
on an AVX-512 machine and loaded on an AVX2 machine sharing the directory (an NFS home on a cluster)
would crash. The cache therefore lives in a directory named after this CPU: its model name and its
full feature-flag list.

The directory is bounded (MAX_BYTES, least recently used entries evicted first), which also makes JAX read
and write it under a file lock: processes sharing it at once (a sweep's, a test session's workers) never
read an entry another one is still writing. JAX's default is neither. The price: each new entry's write scans
the folder's sizes (two unit-test files compiling their small programs against a 3,000-entry folder: 13.8 s
bounded, 11.7 s unbounded), so the test suite, which writes thousands of tiny entries, runs unbounded.

    GPT1_JAX_COMPILE_CACHE=DIR        put the per-CPU directories under DIR (default $XDG_CACHE_HOME/gpt1_jax/xla,
                                      ~/.cache/gpt1_jax/xla without it)
    GPT1_JAX_COMPILE_CACHE=off        no persistent cache
    JAX_COMPILATION_CACHE_DIR         JAX's own setting; when set it is used as it is
    JAX_COMPILATION_CACHE_MAX_SIZE    JAX's own bound in bytes, when set (-1: unbounded and unlocked)

The cache only saves time: a directory that cannot be made or written (a read-only home, another user's shared
folder) is said in one line on stderr and the process goes on without it.

Entries written unbounded keep no record of their last use, which the bounded cache needs for every entry;
`enable` gives them one (`adopt_unbounded_entries`), so a folder filled by an older gpt1-jax keeps working.
"""

from __future__ import annotations

import errno
import hashlib
import os
import platform
import sys
from pathlib import Path

import filelock
import jax

from gpt1_jax.files import user_cache

MAX_BYTES = 4 << 30  # a 117M step's executable is a few MB, a tiny one's ~100 KB
OFF = ("0", "off", "none", "false", "no")


def cpu_identity() -> str:
    """The machine, the CPU model and every feature flag the kernel reports (what LLVM may compile for)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if key.strip() in ("flags", "Features"):  # the first processor's block is enough
                    break
    except OSError:
        pass
    model = fields.get("model name") or platform.processor()
    flags = " ".join(sorted((fields.get("flags") or fields.get("Features") or "").split()))
    return f"{platform.machine()} | {model} | {flags}"


def cache_dir(root: str | os.PathLike | None = None) -> Path:
    digest = hashlib.sha256(cpu_identity().encode()).hexdigest()[:16]
    return (Path(root).expanduser() if root else user_cache("xla")) / f"{platform.machine()}-{digest}"


def enable(root: str | os.PathLike | None = None) -> Path | None:
    """Turn the persistent cache on for this process (before its first compilation) and for the processes
    it starts; -> the directory used, or None when switched off."""
    setting = os.environ.get("GPT1_JAX_COMPILE_CACHE", "")
    if setting.lower() in OFF:
        return None
    variable = "JAX_COMPILATION_CACHE_DIR" if os.environ.get("JAX_COMPILATION_CACHE_DIR") else "GPT1_JAX_COMPILE_CACHE"
    path = Path(os.environ[variable]) if variable == "JAX_COMPILATION_CACHE_DIR" else cache_dir(root or setting or None)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ:
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):  # an existing folder of another user's, or read-only
            raise PermissionError(errno.EACCES, "not writable")
        if jax.config.jax_compilation_cache_max_size != -1:
            adopt_unbounded_entries(path)  # bounded: JAX locks the folder; taking its lock is the first write
    except (OSError, filelock.Timeout) as e:
        print(f"gpt1-jax: no compilation cache ({path}: {getattr(e, 'strerror', None) or e}): every program is compiled "
              f"afresh; set {variable} to a folder you can write, or GPT1_JAX_COMPILE_CACHE=off", file=sys.stderr)
        jax.config.update("jax_compilation_cache_dir", None)  # JAX read JAX_COMPILATION_CACHE_DIR itself
        return None
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(path)  # child processes (sweeps) share it
    jax.config.update("jax_compilation_cache_dir", str(path))
    # Every program, however quick to compile: a short run compiles dozens of small ones (init, eval, ...).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def adopt_unbounded_entries(path: Path) -> int:
    """Gives each entry written without a bound (no "-atime" record: by gpt1-jax before the cache was bounded,
    or by a process with JAX_COMPILATION_CACHE_MAX_SIZE=-1) its file time as last use; -> how many.

    A bounded cache reads every entry's last use before each write; one missing record makes every write
    fail (JAX warns "Error writing persistent compilation cache entry" for each program) and nothing new is
    kept, so every process compiles its programs again. Done under JAX's own lock on the folder."""
    adopted = 0
    with filelock.FileLock(path / ".lockfile", timeout=60):
        for entry in path.glob("*-cache"):
            atime = entry.with_name(entry.name.removesuffix("-cache") + "-atime")
            if not atime.exists():
                try:
                    atime.write_bytes(entry.stat().st_mtime_ns.to_bytes(8, "little"))  # jax's format
                    adopted += 1
                except FileNotFoundError:  # evicted meanwhile by a process that does not take the lock
                    continue
    return adopted
