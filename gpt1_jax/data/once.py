"""Build a shared file once, however many processes ask for it: the token cache and a trained tokenizer.

A pod job runs the same program on every host; each host would otherwise tokenise the whole corpus
(or train the same BPE) itself, 64 hosts doing 64 times the work. :func:`build_once` makes one
process build and every other one wait for the finished result:

* **Who builds.** In a job started with ``jax.distributed`` (``gpt1-jax`` on a pod, ``launch/local.py``)
  process 0 builds and the other processes never do: they wait. A process on its own (no
  ``jax.distributed``) builds, unless another process already holds the lock (below).
* **The lock** (``<name>.lock`` beside the result, created with ``O_CREAT|O_EXCL``; holds host, pid and
  start time) keeps separate jobs sharing a cache directory (two runs on one machine, or two jobs on
  one shared disk) from building the same thing twice. The builder touches it every
  ``LOCK_HEARTBEAT_S``; a waiter that sees its mtime stand still for ``LOCK_STALE_S`` of its own clock
  (no comparison of clocks across hosts), or whose builder ran on this host and is gone (kill -9), treats the
  builder as dead, breaks the lock and builds (gpt1_jax/lockfile.py). In
  the rare race where a lock is broken while its holder still runs, both build: the result is renamed
  into place atomically, first rename wins, and both contents are identical, so this costs time only.
* **Waiting.** A waiter polls for the finished result (its presence means complete: results are built
  under a temporary name and renamed into place, so a crash never leaves a half-written one that
  looks complete). Process 0 also announces "ready at PATH" or "failed: why" in ``jax.distributed``'s
  key-value store, so a waiter learns at once that the build failed, or that it is done but not
  visible here: its disk is not process 0's (a grace of ``VISIBILITY_GRACE_S`` covers a shared
  filesystem's attribute caching). After ``wait_s`` (``data.cache_wait_s``) a waiter gives up; the
  other processes of a job a few seconds after process 0, so that when process 0 gives up (or its
  build fails) they read its reason and say it, rather than being aborted by JAX when it exits.
  Every failure is one :class:`DataError` line naming the path, how long it waited and what to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gpt1_jax.errors import DataError
from gpt1_jax.lockfile import (LOCK_HEARTBEAT_S, LOCK_STALE_S, break_lock, held, mtime_ns, owner_is_gone, read_owner,
                               try_lock)

__all__ = ["Peers", "build_once", "LOCK_HEARTBEAT_S", "LOCK_STALE_S"]

T = TypeVar("T")

VISIBILITY_GRACE_S = 30.0  # NFS-like filesystems cache attributes for a few seconds (actimeo: 3-60 s)
# The other processes wait this much longer than process 0, and process 0, failing, waits up to
# ACK_WAIT_S for them to read why: its exit takes jax.distributed's coordinator down, and JAX then
# aborts every peer at once (SIGABRT, a page of C++ log) before it could say anything itself.
PEER_MARGIN_S = 5.0
ACK_WAIT_S = 10.0
_POLL_S = 0.25
_ANNOUNCE_PREFIX = "gpt1_jax/build_once/"


@dataclass(frozen=True)
class Peers:
    """This process's place in its job: index and count from ``jax.distributed``, (0, 1) without it."""

    index: int = 0
    count: int = 1
    client: object | None = None  # jax.distributed's key-value client, when there is one

    @classmethod
    def current(cls) -> Peers:
        """Read from jax.distributed's state without starting a backend (jax.process_index() would
        start one, and grab the accelerator, in a process that only tokenises)."""
        try:
            from jax._src import distributed  # private: the one place that knows without a backend

            state = distributed.global_state
        except Exception:  # no jax, or a jax that moved it: behave as one process (the lock still works)
            return cls()
        if state.client is None or not state.num_processes or state.num_processes < 2:
            return cls()
        return cls(index=int(state.process_id), count=int(state.num_processes), client=state.client)

    @property
    def builds(self) -> bool:
        return self.index == 0


# --- announcements through jax.distributed's key-value store --------------------------------------
def _announce(peers: Peers, key: str, value: str) -> None:
    if peers.client is None or not peers.builds:
        return
    try:
        peers.client.key_value_set(_ANNOUNCE_PREFIX + key, value)
    except Exception:  # already announced by an earlier call in this job: the first value stands
        pass


def _announce_failure(peers: Peers, key: str, error: Exception) -> None:
    """Tell the waiting processes why, and give them until they acknowledge (or ACK_WAIT_S) to read it."""
    if peers.client is None or not peers.builds:
        return
    _announce(peers, key, f"failed: {error}")
    deadline = time.monotonic() + ACK_WAIT_S
    for i in range(1, peers.count):
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            return
        try:
            peers.client.blocking_key_value_get(f"{_ANNOUNCE_PREFIX}{key}/ack/{i}", left_ms)
        except Exception:  # timed out: that process is gone, or elsewhere
            return


def _acknowledge(peers: Peers, key: str) -> None:
    try:
        peers.client.key_value_set(f"{_ANNOUNCE_PREFIX}{key}/ack/{peers.index}", "1")
    except Exception:
        pass


def _announcement(peers: Peers, key: str) -> str | None:
    if peers.client is None:
        return None
    try:
        return peers.client.key_value_try_get(_ANNOUNCE_PREFIX + key)
    except Exception:  # not set yet (NOT_FOUND), or a client without try_get: rely on the filesystem
        return None


# --- the protocol ----------------------------------------------------------------------------------
@dataclass
class _Wait:
    """One waiter's deadline and what it has seen, for the one-line error at the end."""

    what: str
    path: Path
    wait_s: float
    remedy: str
    started: float = 0.0

    def __post_init__(self) -> None:
        self.started = time.monotonic()

    @property
    def waited(self) -> float:
        return time.monotonic() - self.started

    def expired(self, margin: float = 0.0) -> bool:
        return self.waited >= self.wait_s + margin

    def fail(self, why: str) -> DataError:
        return DataError(f"{self.what} at {self.path}: {why} (waited {self.waited:.0f} s, "
                         f"data.cache_wait_s={self.wait_s:g}); {self.remedy}")


def build_once(
    ready: Callable[[], bool],
    build: Callable[[], T],
    load: Callable[[], T],
    *,
    key: str,
    what: str,
    path: Path,
    wait_s: float,
    remedy: str,
    lock: Path | None = None,
    peers: Peers | None = None,
    stale_s: float = LOCK_STALE_S,
    heartbeat_s: float = LOCK_HEARTBEAT_S,
    on_wait: Callable[[str], None] | None = None,
) -> T:
    """``load()`` the result if ``ready()``, else build it once (see the module docstring) and return it.

    ``build`` must create the result atomically (the state ``ready()`` checks appears last). ``key``
    names the result the same way on every process of a job (it must not contain the path, which may
    differ between hosts). ``lock`` (a path beside the result) also coordinates separate jobs; None
    relies on process 0 alone. ``on_wait`` gets one line when this process starts waiting.
    """
    peers = peers or Peers.current()
    try:
        if ready():
            result = load()
        elif not peers.builds:
            return _wait_for_process_0(ready, load, peers, key, _Wait(what, path, wait_s, remedy), on_wait)
        elif lock is None:
            result = build()
        else:
            result = _build_under_lock(ready, build, load, lock, _Wait(what, path, wait_s, remedy),
                                       stale_s, heartbeat_s, on_wait)
    except Exception as e:
        _announce_failure(peers, key, e)
        raise
    _announce(peers, key, f"ready: {path}")
    return result


def _build_under_lock(ready, build, load, lock: Path, wait: _Wait, stale_s: float, heartbeat_s: float,
                      on_wait) -> T:
    seen_mtime, seen_at, told = None, time.monotonic(), False
    while True:
        token = try_lock(lock)
        if token is not None:
            with held(lock, token, heartbeat_s):
                # Someone may have finished between our ready() and taking the lock.
                return load() if ready() else build()
        time.sleep(_POLL_S)
        if ready():
            return load()
        if owner_is_gone(lock):  # killed on this host (kill -9, a crash): no need to wait for its heartbeat to stop
            break_lock(lock)
            continue
        mtime = mtime_ns(lock)
        if mtime != seen_mtime:
            seen_mtime, seen_at = mtime, time.monotonic()
        elif mtime is not None and time.monotonic() - seen_at >= stale_s:
            break_lock(lock)  # its holder stopped beating: dead, or stuck for good
            continue
        if on_wait and not told:
            on_wait(f"waiting up to {wait.wait_s:g} s for {read_owner(lock)} to build {wait.what} at {wait.path}")
            told = True
        if wait.expired():
            raise wait.fail(f"still being built by {read_owner(lock)} (lock {lock.name} alive)")


def _wait_for_process_0(ready, load, peers: Peers, key: str, wait: _Wait, on_wait) -> T:
    if on_wait:
        on_wait(f"process {peers.index}: waiting up to {wait.wait_s:g} s for process 0 to build {wait.what} "
                f"at {wait.path}")
    announced_at = None
    while True:
        if ready():
            return load()
        news = _announcement(peers, key)
        if news is not None and news.startswith("failed:"):
            _acknowledge(peers, key)
            # Its error already names the path, its wait and the remedy: pass it on, not wrapped in ours.
            raise DataError(f"process {peers.index}: process 0 failed: {news[len('failed:'):].strip()}")
        if news is not None and announced_at is None:
            announced_at = time.monotonic()
        if announced_at is not None and (time.monotonic() - announced_at >= VISIBILITY_GRACE_S or wait.expired(0)):
            theirs = news[len("ready:"):].strip()
            raise wait.fail(f"process 0 finished it (at {theirs} on its host) but this host does not see it: "
                            "its disk is not shared with process 0's")
        if wait.expired(PEER_MARGIN_S):  # process 0's own deadline comes first: its reason is the better one
            raise wait.fail("process 0 did not build it")
        time.sleep(_POLL_S)
