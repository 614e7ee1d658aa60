"""Huge pages for XLA:CPU's per-step temporaries: a long run re-executes itself once with glibc's
`glibc.malloc.hugetlb=1` tunable.

XLA:CPU allocates each step's temporaries as one block (962 MB for the paper release's 16 x 256 step) and
frees it after the step. glibc hands a block that large to the kernel and maps a fresh one on the next step,
which the kernel then fills page by page: ~247,000 page faults and ~0.45 s of kernel CPU per step in 4 KB
pages. With the tunable, glibc asks for transparent huge pages on those maps (when the kernel's THP mode is
`madvise`): ~2,600 faults and ~0.15-0.28 s (experiments/bench/README.md). glibc reads its tunables once,
when a process starts, hence the re-execution; it happens before any work, keeps the process id, and is
skipped where it cannot help (not Linux, glibc older than 2.35, THP `never` or `always`).
`GPT1_JAX_HUGE_PAGES=off` turns it off.

`GPT1_JAX_HUGE_PAGES=keep` also keeps the heap: glibc never hands freed memory back (`KEEP`), so every step
after the first few reuses pages already mapped. On a virtual machine that returns a guest's freed memory
to its host (virtio-balloon free page reporting), a fresh page first costs the host's fault: there the 117M
bf16 step went from alternating 1.6/2.3 s to a steady 1.55-1.6 s. Not the default of `gpt1-jax`'s verbs: one
arena for every thread made multi-threaded BPE tokenization 1.6x slower, the demo run's peak RSS grew from 1.1
to 2.6 GB, and the first steps fault the whole heap in at once (experiments/bench/README.md, 2026-11-29
(later)). The default of the experiments' training scripts (experiments/harness.py `main`, `trains`), whose
sweeps run for hours on tokens encoded once: a Table 5 run (RTE, 2 CPU devices) trained in 107.6-109.4 s against
112.6-115.1 with the same scores, the release's pre-training step took 0.467-0.468 s against 0.496-0.507, for a peak
RSS of 3.9-4.7 GB against 2.7 (experiments/bench/README.md, 2026-12-01 (later)).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
# No separate maps for big blocks, no trimming of the heap's top, and one arena: a block freed by one of XLA's
# threads is the block the next step allocates, whichever thread asks (in a thread's own arena, a block over its
# 64 MB heap is mapped afresh whatever mmap_max says; with 2 arenas the 117M step still faulted, with 3 not).
KEEP = ("glibc.malloc.mmap_max=0", "glibc.malloc.trim_threshold=68719476736", "glibc.malloc.arena_max=1")
SWITCH = "GPT1_JAX_HUGE_PAGES"
MODES = {"on": "on", "1": "on", "true": "on", "yes": "on",
         "off": "off", "0": "off", "false": "off", "no": "off", "keep": "keep"}
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _set(environ) -> list[str]:
    return [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]


def active(environ=os.environ) -> bool:
    """Whether this process (or one started with `environ`) runs under the huge-page tunable."""
    return TUNABLE in _set(environ)


def kept_heap(environ=os.environ) -> bool:
    """Whether this process (or one started with `environ`) runs with glibc keeping its heap (`KEEP`)."""
    return all(t in _set(environ) for t in KEEP)


def mode(environ=os.environ, default: str = "on") -> str:
    """`on`, `off` or `keep`, from GPT1_JAX_HUGE_PAGES (`default` where it is unset or empty); another value is one
    line on stderr and exit 2."""
    value = environ.get(SWITCH, "")
    if not value:
        return default
    if value.lower() not in MODES:
        print(f"gpt1-jax: {SWITCH}={value!r}: expected off, on or keep", file=sys.stderr)
        sys.exit(2)
    return MODES[value.lower()]


def _missing(environ, default: str = "on") -> list[str]:
    """The tunables the mode asks for that `environ` does not set yet (a name the user set keeps their value)."""
    chosen = mode(environ, default)
    if chosen == "off" or sys.platform != "linux":
        return []
    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < (2, 35):
        return []
    try:
        asked = [TUNABLE] if "[madvise]" in THP_MODE.read_text() else []
    except OSError:
        asked = []
    asked += list(KEEP) if chosen == "keep" else []
    named = {t.split("=")[0] for t in _set(environ)}
    return [t for t in asked if t.split("=")[0] not in named]


def wanted(environ=os.environ) -> bool:
    """Whether re-executing with the mode's tunables would change how this process's big blocks are mapped."""
    return bool(_missing(environ))


def reexec_with_huge_pages(default: str = "on") -> None:
    """Replaces this process with the same command under the mode's tunables (`default` where GPT1_JAX_HUGE_PAGES
    is unset), when `wanted()`; else returns."""
    missing = _missing(os.environ, default)
    if not missing:
        return
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = ":".join(_set(env) + missing)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:  # an interpreter this user may run but not execute again (a parent folder it cannot enter)
        return  # the same work, on plain pages
