"""Checkpoints and the training loop, in process on real orbax folders: digests catch changed, missing and
resized files; the NaN stop names only a verified checkpoint; a finished or pre-empted loop returns its
outcome, with its training time over every session; SIGTERM and Ctrl-C save, stop and leave the signal handlers as they found them; a failed save's
echoes through sys.unraisablehook are dropped, nothing else. Damaged runs,
full and read-only disks through `gpt1-jax`: tests/e2e/test_checkpoint.py."""

import asyncio
import contextlib
import gc
import os
import re
import signal
import sys
from typing import NamedTuple

import numpy as np
import pytest

from gpt1_jax import integrity
from gpt1_jax.checkpoint import _one_replica_writes_each_shard, quiet_orbax_echoes
from gpt1_jax.errors import DivergenceError, Interrupted
from tests.support.checkpoint import corrupt, largest_file


def test_digests_catch_changed_missing_and_resized_files(tmp_path):
    folder = tmp_path / "7"
    (folder / "state" / "d").mkdir(parents=True)
    (folder / "state" / "d" / "big").write_bytes(np.random.default_rng(1).bytes(3 * integrity.BLOCK_BYTES // 2))
    (folder / "data").mkdir()
    (folder / "data" / "metadata").write_text('{"batches": 3}')
    (folder / "commit_success.txt").write_text("rewritten by orbax after the digests")
    assert integrity.verify(folder).startswith("no integrity.json")
    integrity.record(folder)
    assert integrity.verify(folder) is None
    (folder / "commit_success.txt").write_text("not recorded: may change")
    (folder / "data" / "commit_success.txt").write_text("orbax's marker names the folder's absolute path")
    assert integrity.verify(folder) is None
    integrity.record(folder)
    assert "data/commit_success.txt" not in (folder / integrity.DIGESTS).read_text()  # in no folder is it state
    (folder / "data" / "commit_success.txt").write_text("a copy may rewrite it")
    assert integrity.verify(folder) is None
    corrupt(folder / "state" / "d" / "big")
    assert integrity.verify(folder) == "state/d/big differs from its recorded digest"
    (folder / "data" / "metadata").write_text('{"batches": 30}')
    (folder / "state" / "d" / "big").unlink()
    assert integrity.verify(folder) == "data/metadata has 15 bytes, 14 recorded; state/d/big is missing"
    assert list(integrity.verify_checkpoints(tmp_path)) == [(7, integrity.verify(folder))]


class State(NamedTuple):
    step: np.ndarray
    w: np.ndarray


class Quiet:
    """Metrics writer and progress bar that record nothing."""

    def write(self, *args, **kw): ...
    def warn(self, *args, **kw): ...
    def update(self, *args, **kw): ...
    def flush(self): ...
    def close(self): ...
    def paused(self, doing): return contextlib.nullcontext()


class Trainer:
    """Each step adds 1 to w and reports `loss(step)`; `before(step)` runs first (damage a checkpoint, send a
    signal)."""

    def __init__(self, before, loss=lambda step: 1.0, grad_norm=lambda step: 1.0):
        self.before, self.loss, self.grad_norm = before, loss, grad_norm

    def put_batch(self, batch):
        return batch

    def step(self, state, batch, **stats):
        step = int(state.step) + 1
        self.before(step)
        return State(np.int32(step), state.w + 1), {"loss": np.float32(self.loss(step)),
                                                    "grad_norm": np.float32(self.grad_norm(step))}


class Batches:
    def __next__(self):
        return {}

    def state(self):
        return {}


def test_nan_stop_names_only_a_verified_checkpoint(tmp_path):
    """Checkpoints at steps 1 and 2; checkpoint 2 is damaged before step 3's loss turns NaN: the stop
    names step 1."""
    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Loop

    ckpt = Checkpointer(tmp_path / "checkpoints", save_every=1)

    def damage(step):
        if step == 3:
            ckpt.wait()
            corrupt(largest_file(ckpt.folder(2)))

    loop = Loop(Trainer(damage, loss=lambda step: np.nan if step == 3 else 1.0), 5, ckpt, ModelConfig(), Quiet(), Quiet())
    outcome = loop.run(State(np.int32(0), np.zeros(4, np.float32)), Batches())
    assert (outcome.status, outcome.step, outcome.last_good) == ("diverged", 3, 1)
    assert re.match(r"loss is nan at step 3; .* Last good checkpoint: step 1 in ", outcome.message), outcome.message
    error = outcome.divergence()  # what a command reports, exit 1
    assert isinstance(error, DivergenceError) and error.last_good == 1 and str(error) == outcome.message
    assert integrity.checkpoint_steps(tmp_path / "checkpoints") == [1, 2]  # reported, not moved


def test_a_gradient_that_is_not_finite_stops_the_run_before_its_step_is_saved(tmp_path):
    """The loss is measured before the update: at lr 1e6 step 4's loss read finite while its gradient norm was
    nan, the run ended with status 0 and checkpoint 4 held NaN weights, which a resume then called good."""
    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Loop

    ckpt = Checkpointer(tmp_path / "checkpoints", save_every=1)
    trainer = Trainer(lambda step: None, loss=lambda step: 3e16, grad_norm=lambda step: np.nan if step == 4 else 1e9)
    outcome = Loop(trainer, 4, ckpt, ModelConfig(), Quiet(), Quiet()).run(State(np.int32(0), np.zeros(4, np.float32)),
                                                                         Batches())
    assert (outcome.status, outcome.step, outcome.last_good) == ("diverged", 4, 3)
    assert outcome.message.startswith("grad_norm is nan at step 4; stopping")
    assert integrity.checkpoint_steps(tmp_path / "checkpoints") == [1, 2, 3]


class Recorded(Quiet):
    def __init__(self):
        self.rows = []

    def write(self, step, **scalars):
        self.rows.append((step, scalars))


def test_epoch_end_hooks_save_and_compiling_steps_log_no_throughput(tmp_path):
    """Fine-tuning saved no checkpoint at its epoch ends (README said it did): a kill after an epoch's dev score
    retrained from step 0. Step 1, and the step recorded after the first per-layer-statistics step was dispatched,
    logged a compilation as tokens/s (134 against ~60,000)."""
    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Hook, Loop

    ckpt = Checkpointer(tmp_path / "checkpoints", save_every=0, keep=5)
    metrics = Recorded()
    epoch_end = Hook("dev", lambda step, state, loss: None, every=2, saves=True)
    loop = Loop(Trainer(lambda step: None), 5, ckpt, ModelConfig(), metrics, Quiet(), [epoch_end], tokens_per_step=100,
                stats_every=4)
    assert loop.run(State(np.int32(0), np.zeros(4, np.float32)), Batches()).finished
    assert integrity.checkpoint_steps(tmp_path / "checkpoints") == [2, 4, 5]
    timed = {step for step, scalars in metrics.rows if "tokens_per_s" in scalars}
    assert timed == {2, 4, 5}  # not 1 (its compilation), nor 3 (recorded right after step 4's stats step compiled)


class Said(Recorded):
    """A progress bar that adds to `said` what each pause says and when it ends (the steps and hooks add theirs)."""

    def __init__(self, said):
        super().__init__()
        self.said = said

    @contextlib.contextmanager
    def paused(self, doing):
        self.said.append(doing)
        yield
        self.said.append("resumed")


def test_compilations_evaluations_and_saves_are_said_on_the_bar_and_left_out_of_its_clock(tmp_path):
    """Step 1 sat at 0/N through its compilation, and fine-tuning compiled again, without a word, for each new
    padded length (up to ~14 shapes; 5-7 s on SST-2); the bar froze through each evaluation and save, and tqdm's ETA
    and rate counted them all. Batches of lengths 4 4 8 4 8 6; an epoch-end hook (with its save) every 3 steps."""
    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Hook, Loop

    said = []

    class Bucketed(Batches):
        def __init__(self):
            self.lengths = iter([4, 4, 8, 4, 8, 6])

        def __next__(self):
            return {"tokens": np.zeros((2, next(self.lengths)), np.int32)}

    progress = Said(said)
    dev = Hook("dev", lambda step, state, loss: said.append(f"dev at {step}"), every=3, saves=True,
               doing="evaluating dev")
    loop = Loop(Trainer(said.append), 6, Checkpointer(tmp_path / "checkpoints", save_every=0), ModelConfig(), progress,
                progress, [dev], tokens_per_step=100)
    assert loop.run(State(np.int32(0), np.zeros(4, np.float32)), Bucketed()).finished

    def epoch_end(step):
        return ["evaluating dev", f"dev at {step}", "resumed", "saving checkpoint", "resumed"]

    assert said == ["compiling", 1, "resumed", 2, "compiling", 3, "resumed", *epoch_end(3),
                    4, 5, "compiling", 6, "resumed", *epoch_end(6), "saving checkpoint", "resumed"]
    # the steps read after a compilation log no tokens/s (the loop's, as the bar's rate, leaves it out)
    assert {step for step, scalars in progress.rows if "tokens_per_s" in scalars} == {3, 4, 6}


def test_throughput_is_timed_over_several_steps_so_a_late_read_is_no_spike(tmp_path):
    """A step's interval ends when the host reads its metrics: read late (the host busy while the device went on),
    the next interval was short, and a tiny run logged 274,177 tokens/s and an MFU of 168% between steps of
    ~50,000. Here each step takes 20 ms, step 5's read comes 80 ms late and step 6 takes no time."""
    import time

    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Loop

    delays = {6: 0.1, 7: 0.0}  # seconds of the call that dispatches step s (the previous step is read after it)
    metrics = Recorded()
    loop = Loop(Trainer(lambda step: time.sleep(delays.get(step, 0.02))), 12, Checkpointer(tmp_path / "c"),
                ModelConfig(), metrics, Quiet(), tokens_per_step=100, log_every=1)
    assert loop.run(State(np.int32(0), np.zeros(4, np.float32)), Batches()).finished
    rates = {step: scalars["tokens_per_s"] for step, scalars in metrics.rows if "tokens_per_s" in scalars}
    assert set(rates) == set(range(2, 13))
    assert max(rates.values()) < 1.2 * 100 / 0.02, rates  # never above the steps' own rate (5,000 tokens/s)
    # each step's own interval is logged too (the optimizer study drops pauses by it): step 5's read came late
    own = {step: scalars["step_s"] for step, scalars in metrics.rows if "step_s" in scalars}
    assert own[5] == pytest.approx(0.1, abs=0.03) and own[6] < 0.01 and own[4] == pytest.approx(0.02, abs=0.01)


def test_the_pinned_step_outlives_the_newest_keep_until_another_is_pinned(tmp_path):
    """Fine-tuning's best epoch: with keep_checkpoints=1 an early best epoch's checkpoint rotated out, and no
    checkpoint held the weights results.json scored. Best at epoch 1 (step 2), then at epoch 3 (step 6)."""
    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Hook, Loop

    ckpt = Checkpointer(tmp_path / "checkpoints", save_every=0, keep=1)
    seen = []

    def best_epoch(step, state, loss):
        if step in (2, 6):
            ckpt.pin(step)
        ckpt.wait()
        seen.append(integrity.checkpoint_steps(tmp_path / "checkpoints"))

    loop = Loop(Trainer(lambda step: None), 8, ckpt, ModelConfig(), Quiet(), Quiet(),
                [Hook("dev", best_epoch, every=2, saves=True)])
    assert loop.run(State(np.int32(0), np.zeros(4, np.float32)), Batches()).finished
    ckpt.close()
    # what the hook saw before each epoch end's save, then what is left
    assert seen == [[], [2], [2, 4], [6]]
    assert integrity.checkpoint_steps(tmp_path / "checkpoints") == [6, 8]


def test_choosing_one_writer_per_shard_logs_nothing(caplog):
    """Every run printed `WARNING:absl:Type handler registry type "<class 'jax.jaxlib._jax.Array'>" overriding
    jax.Array` (orbax, as our Checkpointer replaces its array handler): a line that asks nothing of the user."""
    import logging

    before = logging.getLogger("absl").level
    with caplog.at_level(logging.INFO):
        _one_replica_writes_each_shard()
    assert not [r for r in caplog.records if "Type handler registry" in r.getMessage()], caplog.text
    assert logging.getLogger("absl").level == before  # put back as it was


def test_a_result_handed_to_a_closed_event_loop_is_dropped_and_other_unraisables_are_not(monkeypatch):
    """After a failed save, tensorstore hands each abandoned write's result to the event loop orbax closed;
    Python reports each RuntimeError through sys.unraisablehook. Only that one is silenced."""
    reported = []

    def record(unraisable):  # only this test's: an earlier test's tensorstore reads left their own to be collected
        if getattr(unraisable.object, "__qualname__", "").endswith("Raises.__del__"):
            reported.append(str(unraisable.exc_value))

    monkeypatch.setattr(sys, "unraisablehook", record)
    quiet_orbax_echoes()
    quiet_orbax_echoes()  # a second Checkpointer wraps nothing twice
    closed = asyncio.new_event_loop()
    closed.close()

    class Raises:  # an exception in __del__ goes through sys.unraisablehook, as tensorstore's callback does
        def __init__(self, raise_it):
            self.raise_it = raise_it

        def __del__(self):
            self.raise_it()

    def look_alike():
        raise RuntimeError("Event loop is closed")  # the same words, not asyncio's check

    def other():
        raise ValueError("something else")

    for raise_it in (lambda: closed.call_soon_threadsafe(print), look_alike, other):
        Raises(raise_it)
        gc.collect()
    assert reported == ["Event loop is closed", "something else"]


def test_a_finished_loop_returns_its_last_step_and_metrics(tmp_path):
    """The outcome is a value: the last step, the last logged loss, and the state it ended with."""
    outcome = _loop(tmp_path, lambda step: None).run(State(np.int32(0), np.zeros(4, np.float32)), Batches())
    assert (outcome.status, outcome.step, outcome.finished) == ("finished", 5, True)
    assert outcome.metrics["loss"] == 1.0 and int(outcome.state.step) == 5 and outcome.results is None


def test_sigterm_saves_stops_and_gives_the_handlers_back(tmp_path):
    """A real SIGTERM at step 2 of 5: checkpoint 2, stop, preempted. Then the process's own handlers are
    back, so a study that runs loop after loop in one process (experiments/optimizers) stops on a signal
    that arrives between two runs instead of a finished loop's handler swallowing it."""
    import signal

    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Loop

    ckpt = Checkpointer(tmp_path / "checkpoints", save_every=0)

    def terminate(step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    outcome = Loop(Trainer(terminate), 5, ckpt, ModelConfig(), Quiet(), Quiet()).run(
        State(np.int32(0), np.zeros(4, np.float32)), Batches())
    assert (outcome.status, outcome.step, outcome.finished) == ("preempted", 2, False) and int(outcome.state.step) == 2
    assert not outcome.stop_requested  # preempted says it already
    assert integrity.checkpoint_steps(tmp_path / "checkpoints") == [2]
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_ctrl_c_in_the_last_step_finishes_the_run(tmp_path):
    """It stopped nothing (the last step saves anyway), yet said "interrupted ... run the same command to resume"
    with status 130, and a fine-tuning run wrote no results.json until that rerun."""
    import signal

    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Loop

    def interrupt(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    outcome = Loop(Trainer(interrupt), 3, Checkpointer(tmp_path / "checkpoints", save_every=0), ModelConfig(), Quiet(),
                   Quiet()).run(State(np.int32(0), np.zeros(4, np.float32)), Batches())
    assert (outcome.status, outcome.step, outcome.stop_requested) == ("finished", 3, True)  # a sweep stops after it
    assert integrity.checkpoint_steps(tmp_path / "checkpoints") == [3]


def test_the_training_time_adds_up_over_the_sessions_of_a_run(tmp_path):
    """Preempted at step 2 of 5, then resumed from its checkpoint: the finished outcome's seconds count both
    sessions (the checkpoint carries the time), so a resumed fine-tuning run's train_seconds is not its last
    session's alone. A checkpoint saved before it kept the time gives None."""
    import time

    import jax

    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Loop

    ckpt = Checkpointer(tmp_path / "checkpoints", save_every=0)

    def slow(step):
        time.sleep(0.2)
        if step == 2 and first_session:
            os.kill(os.getpid(), signal.SIGTERM)

    first_session = True
    first = Loop(Trainer(slow), 5, ckpt, ModelConfig(), Quiet(), Quiet()).run(State(np.int32(0), np.zeros(4, np.float32)),
                                                                              Batches())
    assert first.status == "preempted" and 0.4 <= first.seconds < 5
    first_session = False
    ckpt = Checkpointer(tmp_path / "checkpoints", save_every=0)
    abstract = State(jax.ShapeDtypeStruct((), np.int32), jax.ShapeDtypeStruct((4,), np.float32))
    state, position, step = ckpt.restore(abstract)
    assert step == 2 and position["seconds"] == first.seconds  # what the resume starts from, to the bit
    loop = Loop(Trainer(slow), 5, ckpt, ModelConfig(), Quiet(), Quiet())
    loop.restore_position(position)
    second = loop.run(state, Batches())
    assert second.finished and second.seconds >= position["seconds"] + 0.6  # steps 3 to 5 on top of the first two
    loop = Loop(Trainer(slow), 5, Checkpointer(tmp_path / "other"), ModelConfig(), Quiet(), Quiet())
    loop.restore_position({k: v for k, v in position.items() if k != "seconds"})
    assert loop.run(state, Batches()).seconds is None


def _loop(tmp_path, before, save_every=0):
    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Loop

    ckpt = Checkpointer(tmp_path / "checkpoints", save_every=save_every)
    return Loop(Trainer(before), 5, ckpt, ModelConfig(), Quiet(), Quiet())


def test_first_ctrl_c_in_the_loop_saves_then_raises_interrupted(tmp_path):
    def ctrl_c(step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted, match=r"^interrupted \(Ctrl-C\) at step 2: checkpoint saved; run the same") as e:
        _loop(tmp_path, ctrl_c).run(State(np.int32(0), np.zeros(4, np.float32)), Batches())
    assert e.value.step == 2 and isinstance(e.value, KeyboardInterrupt)
    assert integrity.checkpoint_steps(tmp_path / "checkpoints") == [2]
    assert signal.getsignal(signal.SIGINT) is handler


def test_second_ctrl_c_in_the_loop_stops_at_once_naming_the_kept_checkpoint(tmp_path):
    def twice(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted, match=r"in step 3, without saving it: checkpoint 2 is kept; run the same") as e:
        _loop(tmp_path, twice, save_every=1).run(State(np.int32(0), np.zeros(4, np.float32)), Batches())
    assert e.value.step == 2 and integrity.checkpoint_steps(tmp_path / "checkpoints") == [1, 2]


def test_a_save_in_one_process_writes_replicated_arrays_whole_and_compiles_nothing(tmp_path):
    """Parameters replicated over 8 devices: orbax's default splits their writing among the replicas by
    device-side slices, each a program to compile; in one process one replica writes each shard instead.
    The state restores equal, onto the same shardings."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.config import ModelConfig

    mesh = jax.make_mesh((8,), ("data",), devices=jax.devices()[:8])
    rng = np.random.default_rng(0)
    state = {"w": jax.device_put(rng.normal(size=(16, 24)).astype(np.float32), NamedSharding(mesh, P())),
             "b": jax.device_put(rng.normal(size=(40,)).astype(np.float32), NamedSharding(mesh, P("data")))}
    ckpt = Checkpointer(tmp_path / "checkpoints", save_every=1)
    compiles = []
    listener = lambda event, secs, **kw: compiles.append(event) if event.startswith("/jax/core/compile/") else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        ckpt.save(1, state, {"batches": 1}, ModelConfig())
        ckpt.wait()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
    restored, position, step = ckpt.restore(abstract)
    ckpt.close()
    assert (position, step) == ({"batches": 1}, 1)
    for k in state:
        assert restored[k].sharding == state[k].sharding
        np.testing.assert_array_equal(np.asarray(restored[k]), np.asarray(state[k]))
