"""Ctrl-C that always stops a verb: `CtrlC`, the guard `gpt1_jax.cli.main` runs every verb in.

The training loop keeps its own first-Ctrl-C behaviour (a checkpoint, then `errors.Interrupted`,
gpt1_jax/loop.py); this guard makes sure a Ctrl-C anywhere else reaches the verb as KeyboardInterrupt.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time


# Once per process: a study runs several loops, and a Ctrl-C passed on between two of them (CtrlC) or inside one (the
# loop's Preemption) is the same first one; the next, wherever it lands, stops this process at once.
_passed_to_jax = [False]


def pass_ctrl_c_to_jax() -> bool:
    """Multi-process: a first Ctrl-C becomes JAX's preemption notice (a SIGTERM to this process, which JAX's notifier
    owns), so every process stops at the step they agree on and saves it -> True; a later one -> False (the caller
    stops this process at once). Says so in one line: os.write, as a print here could re-enter one in progress."""
    if _passed_to_jax[0]:
        return False
    _passed_to_jax[0] = True
    os.write(2, b"gpt1-jax: Ctrl-C: every process stops at the step they agree on (Ctrl-C again: this one "
                b"leaves now)\n")
    os.kill(os.getpid(), signal.SIGTERM)
    return True


# The signal CtrlC last turned into a KeyboardInterrupt, until a caller catches it (`CtrlC.caught`). Code it is raised
# in can swallow it without a trace (an `except BaseException` that goes on; JAX's C++ is known to wrap one, see
# `unwrapped_interrupts`). A study given SIGTERM as its first run started once ran every run to its end and exited 0
# (tests/e2e/test_optimizers_study.py, 2 times in ~150 under load; where the interrupt went was not caught in the
# act). The training loop that starts next takes such a signal as its own (gpt1_jax/loop.py Preemption): a
# checkpoint at its first step, then the stop.
_unanswered: list[int] = []


def unanswered_signal() -> int | None:
    """The signal a KeyboardInterrupt of CtrlC's was raised for, if nothing caught that interrupt; taken once."""
    return _unanswered.pop() if _unanswered else None


def ctrl_c_passed_to_jax() -> bool:
    """Whether this process has passed a Ctrl-C on to JAX (a run started after it stops as one stopped by Ctrl-C)."""
    return _passed_to_jax[0]


@contextlib.contextmanager
def unwrapped_interrupts():
    """Re-raises a KeyboardInterrupt that reached this block wrapped in another error, as itself.

    The signal handler raises KeyboardInterrupt in whatever Python code runs next. Where that code was called from
    JAX's C++ (a pytree's metadata compared while a model is traced: a SIGTERM to a study as its first run started,
    seen in CI), JAX re-raises it as `ValueError: Exception raised while checking equality of metadata fields of
    pytree` with the interrupt as its cause, and the verb ended in a traceback, exit 1, instead of its one line."""
    try:
        yield
    except Exception as e:
        cause, seen = e, set()
        while cause is not None and id(cause) not in seen and not isinstance(cause, KeyboardInterrupt):
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        if not isinstance(cause, KeyboardInterrupt):
            raise
        raise cause from None


class CtrlC:
    """For the whole verb: Ctrl-C (SIGINT) raises KeyboardInterrupt, and one that Python dropped is raised again.

    Python runs the handler in whatever Python code the main thread runs next. Where that is a gc callback
    (JAX's `_xla_gc_callback` runs at every collection, many of them while a corpus is tokenized), a
    `__del__` or a weakref callback, the exception is printed as "Exception ignored" and dropped, and the
    run went on. Each drop passes through sys.unraisablehook: ours has a helper thread deliver SIGINT again,
    until the handler runs where the exception propagates. Only drops are re-delivered: a timer re-sending
    SIGINT until main has caught it could not tell a dropped interrupt from one still unwinding through slow
    clean-up (a checkpoint save finishing in a `finally`), which a second KeyboardInterrupt would cut short.
    Not from the hook itself: the handler would run at once inside the hook, which drops it for good; so
    the handler never raises there either. Hook and handler only write to a pipe: the handler may run
    inside the hook, where taking a lock could deadlock. A SIGINT the parent set to be ignored stays so."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGINT,), first_to_jax: bool = False):
        self.signals = signals  # a script that stops on SIGTERM as on Ctrl-C adds it (experiments/optimizers)
        # Multi-process (experiments/harness.py main): the first Ctrl-C goes to JAX's preemption notifier as a SIGTERM,
        # so every process stops at the step they agree on, as the training loop passes one on (gpt1_jax/loop.py);
        # taken here, it stopped this process alone and left the others to fail in their next collective.
        self.first_to_jax = first_to_jax

    def __enter__(self):
        # A signal the parent set to be ignored stays so: a background job (`nohup cmd &`) has SIGINT ignored,
        # and its SIGTERM must still stop the run with its one line, not kill it silently between two runs.
        active = [sig for sig in self.signals if signal.getsignal(sig) is not signal.SIG_IGN]
        self._installed = threading.current_thread() is threading.main_thread() and bool(active)
        if self._installed:
            self._wake_r, self._wake_w = os.pipe()
            self._thread = threading.Thread(target=self._redeliver, args=(active[0],), name="gpt1-jax Ctrl-C",
                                            daemon=True)
            self._thread.start()
            self._handlers = {sig: signal.signal(sig, self._handle) for sig in active}
            self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def _handle(self, signum, frame) -> None:
        if self.first_to_jax and signum == signal.SIGINT and pass_ctrl_c_to_jax():
            return
        hook = CtrlC._unraisable.__code__
        while frame is not None:
            if frame.f_code is hook:
                os.write(self._wake_w, b"!")
                return
            frame = frame.f_back
        _unanswered[:] = [signum]
        raise KeyboardInterrupt

    def _unraisable(self, unraisable) -> None:
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            os.write(self._wake_w, b"!")
        else:
            self._hook(unraisable)

    def _redeliver(self, signum: int) -> None:
        while os.read(self._wake_r, 1):  # b"": closed by __exit__
            time.sleep(0.005)  # let the main thread leave the hook first (else it asks again)
            _thread.interrupt_main(signum)  # a no-op once `caught` set it to be ignored

    def caught(self) -> None:
        """The interrupt reached main: another Ctrl-C must not cut its one line short."""
        _unanswered.clear()
        if self._installed:
            for sig in self._handlers:
                signal.signal(sig, signal.SIG_IGN)

    def __exit__(self, *exc) -> None:
        _unanswered.clear()  # outside the guard a signal it took means nothing to a loop
        if self._installed:
            for sig in self._handlers:
                signal.signal(sig, signal.SIG_IGN)  # a re-delivery still on its way lands on nothing
            os.close(self._wake_w)
            self._thread.join()
            os.close(self._wake_r)
            sys.unraisablehook = self._hook
            for sig, handler in self._handlers.items():
                # None: a handler not installed from Python (embedded), which signal() cannot put back.
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
