"""Ctrl-C, in process: an interrupt Python drops in a gc callback is raised again, and the CLI turns every
kind of Ctrl-C into its one line and exit 130. A real pretrain SIGINTed in every phase:
tests/e2e/test_interrupt.py."""

import gc
import signal
import subprocess
import sys
import time

import jax
import pytest

from gpt1_jax.errors import Interrupted
from gpt1_jax.interrupt import CtrlC
from gpt1_jax.loop import Preemption


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_whose_interrupt_was_swallowed_stops_the_next_training_loop(signum):
    """A KeyboardInterrupt that the code it was raised in swallowed left no trace (a SIGTERM to a study as its first
    run started once let every run train to its end, exit 0). The loop that starts next now stops at its first step
    as if the signal had come to it; only once, and an interrupt that left the guard leaves nothing behind."""
    with CtrlC(signals=(signal.SIGINT, signal.SIGTERM)):
        try:
            signal.raise_signal(signum)
            sum(range(10))  # the handler runs here, raising KeyboardInterrupt...
        except BaseException:  # ...which the code it lands in swallows
            pass
        first, second = Preemption(), None
        first.close()
        second = Preemption()
        second.close()
    assert (first.requested, first.signum) == (True, signum)
    assert not second.requested  # taken once
    with pytest.raises(KeyboardInterrupt), CtrlC(signals=(signal.SIGINT, signal.SIGTERM)):
        signal.raise_signal(signum)
        sum(range(10))
    later = Preemption()  # the interrupt left the guard (the verb ended): nothing is pending
    later.close()
    assert not later.requested


def test_a_ctrl_c_python_drops_in_a_gc_callback_is_raised_again(capsys):
    """What made Ctrl-C while tokenizing go unheeded: the handler ran inside JAX's gc callback, and Python
    printed "Exception ignored" and went on. Without CtrlC this loop runs its 10 s out."""
    dropped = []

    def callback(phase, info):  # SIGINT's handler runs inside it: the KeyboardInterrupt is dropped
        if phase == "start" and not dropped:
            dropped.append(phase)
            signal.raise_signal(signal.SIGINT)
            sum(range(10))

    gc.callbacks.append(callback)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt), CtrlC():
            gc.collect()
            while time.monotonic() - t0 < 10:
                time.sleep(0.001)
    finally:
        gc.callbacks.remove(callback)
    assert dropped and time.monotonic() - t0 < 5
    assert "Exception ignored" not in capsys.readouterr().err


def test_sigterm_stops_a_background_job_whose_sigint_is_ignored():
    """`nohup cmd &` starts a job with SIGINT ignored. The guard left SIGTERM alone then too, so a SIGTERM that
    no training loop caught (between two runs of a sweep) killed the process silently: nothing written.
    In a child, which is all such a SIGTERM would kill."""
    code = """if True:
        import signal, time
        from gpt1_jax.interrupt import CtrlC
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            with CtrlC(signals=(signal.SIGINT, signal.SIGTERM)):
                assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # ignored it stays
                signal.raise_signal(signal.SIGTERM)
                time.sleep(5)
        except KeyboardInterrupt:
            print("stopped", signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
                  signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "stopped True True\n"), done.stderr


@pytest.mark.parametrize("error, line", [
    (KeyboardInterrupt(), "gpt1-jax bench: interrupted (Ctrl-C); nothing was written half-way; run the same command "
                          "to start again"),
    (Interrupted("interrupted (Ctrl-C) at step 7: checkpoint saved; run the same command to resume", step=7),
     "gpt1-jax bench: interrupted (Ctrl-C) at step 7: checkpoint saved; run the same command to resume"),
])
def test_cli_maps_ctrl_c_to_one_line_and_130_and_puts_the_handlers_back(monkeypatch, capsys, error, line):
    from gpt1_jax import bench, cli

    def run(config, **kw):
        raise error

    monkeypatch.setattr(bench, "run", run)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    before = signal.getsignal(signal.SIGINT), sys.unraisablehook
    assert cli.main(["bench", "--config", "tiny"]) == 130
    assert capsys.readouterr().err.splitlines() == [line]
    assert (signal.getsignal(signal.SIGINT), sys.unraisablehook) == before
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(KeyboardInterrupt):
        cli.main(["bench", "--config", "tiny"])


class _Meta:
    """Pytree metadata whose comparison (JAX's C++ calls it) sends this process SIGNAL, once."""

    def __init__(self, sig):
        self.sig = sig

    def __eq__(self, other):
        sig, self.sig = self.sig, None
        if sig is not None:
            signal.raise_signal(sig)  # the guard's handler raises KeyboardInterrupt right here
        return True

    def __hash__(self):
        return 0


class _Node:
    def __init__(self, meta):
        self.meta = meta


jax.tree_util.register_pytree_node(_Node, lambda n: ((), n.meta), lambda meta, _: _Node(meta))


def _signal_inside_jax(sig):
    """A signal that lands while JAX compares two pytrees' metadata: JAX re-raises the handler's KeyboardInterrupt
    as `ValueError: Exception raised while checking equality of metadata fields of pytree`, the interrupt its
    cause (seen in CI: a SIGTERM to a study as its first run traced the model, exit 1 and a traceback)."""
    return jax.tree_util.tree_structure(_Node(_Meta(sig))) == jax.tree_util.tree_structure(_Node(_Meta(None)))


def test_a_ctrl_c_that_jax_wrapped_in_another_error_is_still_one_line_and_130(monkeypatch, capsys):
    from experiments import harness
    from gpt1_jax import bench, cli

    with pytest.raises(ValueError, match="metadata fields of pytree") as raised:  # what JAX does with it
        with CtrlC():
            _signal_inside_jax(signal.SIGINT)
    assert isinstance(raised.value.__cause__, KeyboardInterrupt)

    monkeypatch.setattr(bench, "run", lambda config, **kw: _signal_inside_jax(signal.SIGINT))
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["bench", "--config", "tiny"]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "gpt1-jax bench: interrupted (Ctrl-C); nothing was written half-way; run the same command to start again"]
    # the study's SIGTERM of that CI run
    assert harness.main(lambda: _signal_inside_jax(signal.SIGTERM), "run_study") == 130
    assert capsys.readouterr().err == "run_study: interrupted; the same command resumes\n"


def test_a_ctrl_c_inside_a_bars_close_does_not_glue_the_last_line_to_the_bar(capsys):
    """tqdm's close marks the bar closed, redraws it, then ends its line; a Ctrl-C between the two (a real SIGINT in
    the tokenizing phase, once in a loaded suite) left the line open, and the CLI's one last line was printed on the
    bar's. Here the Ctrl-C lands as the bar writes that newline."""
    from gpt1_jax.metrics import Bar, close_open_bars

    class CtrlCAtTheNewline:
        def __init__(self):
            self.fired = False

        def write(self, text):
            if text == "\n" and not self.fired:
                self.fired = True
                raise KeyboardInterrupt
            sys.stderr.write(text)

        def flush(self):
            sys.stderr.flush()

    stream = CtrlCAtTheNewline()
    bar = Bar(total=10, desc="tokenizing", file=stream, mininterval=0)
    bar.update(3)
    with pytest.raises(KeyboardInterrupt):
        bar.close()
    assert stream.fired
    close_open_bars()
    print("gpt1-jax pretrain: interrupted (Ctrl-C)", file=sys.stderr)
    lines = [l for l in capsys.readouterr().err.replace("\r", "\n").splitlines() if l.strip()]
    assert lines[-1] == "gpt1-jax pretrain: interrupted (Ctrl-C)"
    assert lines[-2].startswith("tokenizing:  30%")
