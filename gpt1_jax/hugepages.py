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
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
SWITCH = "GPT1_JAX_HUGE_PAGES"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def active(environ=os.environ) -> bool:
    """Whether this process (or one started with `environ`) runs under the tunable."""
    return TUNABLE in environ.get("GLIBC_TUNABLES", "").split(":")


def wanted(environ=os.environ) -> bool:
    """Whether re-executing with the tunable would change how this process's big blocks are mapped."""
    if environ.get(SWITCH, "").lower() in ("off", "0", "false", "no"):
        return False
    if active(environ):
        return False
    if sys.platform != "linux":
        return False
    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < (2, 35):
        return False
    try:
        return "[madvise]" in THP_MODE.read_text()
    except OSError:
        return False


def reexec_with_huge_pages() -> None:
    """Replaces this process with the same command under the tunable, when `wanted()`; else returns."""
    if not wanted():
        return
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES", ""), TUNABLE]))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:  # an interpreter this user may run but not execute again (a parent folder it cannot enter)
        return  # the same work, on plain pages
