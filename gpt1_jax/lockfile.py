"""A lock file that says who holds it, keeps beating while held, and is broken once its holder is gone: the
token cache's and the BPE's build-once lock (gpt1_jax/data/once.py) and a run folder's lock
(gpt1_jax/workdir.py) are this one.

The lock is a file created with ``O_CREAT|O_EXCL`` holding host, pid, start time and a token. Its holder touches
it every ``LOCK_HEARTBEAT_S``; another process treats the holder as gone when the file's mtime stood still for
``LOCK_STALE_S`` of its own clock (no comparison of clocks across hosts), or at once when the holder ran on this
host and its pid is no longer alive (kill -9 leaves the file behind)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["LOCK_HEARTBEAT_S", "LOCK_STALE_S", "try_lock", "held", "read_owner", "owner_is_gone", "break_lock",
           "mtime_ns", "pid_alive", "remove_abandoned"]

LOCK_HEARTBEAT_S = 5.0
# A holder whose heartbeat stood still this long is dead (or stalled for good). Well above NFS's longest
# attribute caching (acregmax 60 s), during which a live lock's mtime can look frozen from another host.
LOCK_STALE_S = 120.0


def try_lock(lock: Path) -> str | None:
    """Create the lock; its token (None: someone else holds it)."""
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return None
    token = uuid.uuid4().hex
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "token": token}, f)
    return token


def _still_ours(lock: Path, token: str) -> bool:
    """After a (wrongly) broken lock another process may hold a new one under the same name: not ours to touch."""
    try:
        return json.loads(lock.read_text(encoding="utf-8")).get("token") == token
    except (OSError, ValueError, AttributeError):
        return False


def _owner(lock: Path) -> dict | None:
    try:
        owner = json.loads(lock.read_text(encoding="utf-8"))
        return owner if isinstance(owner, dict) and {"host", "pid"} <= set(owner) else None
    except (OSError, ValueError):
        return None


def read_owner(lock: Path) -> str:
    owner = _owner(lock)
    return f"pid {owner['pid']} on {owner['host']}" if owner else "an unknown process"


def owner_is_gone(lock: Path) -> bool:
    """Whether the lock's holder ran on this host and has exited (its pid is not alive)."""
    owner = _owner(lock)
    if owner is None or owner["host"] != socket.gethostname() or owner["pid"] == os.getpid():
        return False
    try:
        return not pid_alive(int(owner["pid"]))
    except (ValueError, OverflowError):  # not a pid
        return False


def pid_alive(pid: int) -> bool:
    """Whether a process of this host has that pid (another user's included), and it is not a zombie: a job killed
    but not yet reaped by its parent still answers kill(pid, 0), and its lock held the rerun off."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, under another user
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # Linux: "pid (comm) STATE ..."; comm may hold spaces and ')'
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:  # gone meanwhile, or no /proc (macOS: kill's answer stands)
        return not os.path.isdir("/proc/self")
    except (OSError, IndexError):
        return True


def mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def break_lock(lock: Path) -> None:
    """Rename first: of several processes breaking the same stale lock, exactly one succeeds."""
    graveyard = lock.with_name(f"{lock.name}.stale-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(lock, graveyard)
    except FileNotFoundError:
        return
    graveyard.unlink(missing_ok=True)


@contextmanager
def held(lock: Path, token: str, heartbeat_s: float = LOCK_HEARTBEAT_S) -> Iterator[None]:
    """Keep the lock's mtime moving while the body runs; remove the lock after, whatever happens."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat_s):
            if not _still_ours(lock, token):  # broken by a process that thought us dead: finish anyway
                return
            os.utime(lock)

    thread = threading.Thread(target=beat, name=f"heartbeat {lock.name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if _still_ours(lock, token):
            lock.unlink(missing_ok=True)


def remove_abandoned(parent: Path, prefix: str, *, dead_quiet_s: float = 0.0, stale_s: float | None = None) -> None:
    """Removes the folders `<parent>/<prefix><pid>-...` that killed writers left (a half-written model, a token
    cache's gigabytes): those whose writer ran on this host and is gone, once their files stood still for
    `dead_quiet_s`; and with `stale_s`, whoever wrote them, those whose files stood still that long (a live writer,
    on another host too, writes without pause)."""
    for left in parent.glob(f"{prefix}*"):
        pid = left.name.removeprefix(prefix).split("-")[0]
        try:
            quiet = time.time() - max(p.stat().st_mtime for p in [left, *left.iterdir()])
        except OSError:  # gone meanwhile, or not a folder
            continue
        gone = pid.isdigit() and not pid_alive(int(pid))
        if (gone and quiet >= dead_quiet_s) or (stale_s is not None and quiet > stale_s):
            shutil.rmtree(left, ignore_errors=True)
