"""The training loop that pre-training and fine-tuning both configure.

    for step in start+1 .. steps:
        dispatch the step on the next batch
        read the *previous* step's metrics (no host sync per step: the device keeps working meanwhile)
        at hook steps, checkpoint steps and the end: read this step's metrics first (a diverged step is
        never evaluated or saved), run the hooks (evaluation, best-epoch choice), then save
        on SIGTERM / SIGINT: save and stop (SIGTERM: exit 0; Ctrl-C: Interrupted, exit 130; the same
        command resumes either way)

`Loop.run` returns an `Outcome`: finished, preempted (SIGTERM: saved, the same command resumes) or
diverged (a NaN/inf loss: nothing saved at that step; the outcome names the newest checkpoint that
verifies against its digests). A failed save stops the run (CheckpointWriteError), and a Ctrl-C is the
user stopping the process, not an outcome: `Interrupted`, once its checkpoint is saved. A checkpoint
holds the train state and `position()`: the batch source's position plus every hook's state, so a
resumed run replays exactly what an uninterrupted one would have done, and the training seconds so far.

`start` is what both jobs do around the loop: resume from the newest intact checkpoint or initialise,
claim the workdir and write its config, open the metrics and the progress bar.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import signal
import time
import typing
from collections import deque
from pathlib import Path
from typing import Any, Callable, Protocol

import jax
from jax.experimental import multihost_utils

from gpt1_jax import workdir as run_folder
from gpt1_jax.config import profile_window, save_yaml
from gpt1_jax.distributed import abort
from gpt1_jax.errors import ConfigError, DivergenceError, Interrupted
from gpt1_jax.integrity import newest_checkpoint
from gpt1_jax.interrupt import ctrl_c_passed_to_jax, pass_ctrl_c_to_jax, unanswered_signal, unwrapped_interrupts
from gpt1_jax.tracker import open_tracker
from gpt1_jax.metrics import MetricsWriter, Progress

# tokens/s (and MFU) are timed over the last this many steps: a step's own interval is when the host read its
# metrics, which runs late behind the device under load, and one late read made the next step's interval short
# (a tiny run logged 274,177 tokens/s, an MFU of 168%, between steps of ~50,000).
THROUGHPUT_STEPS = 8


class Batches(Protocol):
    """The host side of the data: process-local numpy batches and a JSON-able resume position."""

    def __next__(self) -> dict: ...

    def state(self) -> Any: ...

    def restore(self, state: Any) -> None: ...


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a run ended. `step`: the last step trained (diverged: the step whose loss was not finite);
    `metrics`: the last values logged of every metric (train loss, the hooks' evaluations); `last_good`
    (diverged): the newest checkpoint that verifies, None if there is none; `results`: what the job adds
    (fine-tuning: its results.json); `seconds`: the loop's wall clock over every session that trained the run
    (steps, hooks, saves; checkpoints carry it), None for a run resumed from a checkpoint that did not;
    `stop_requested`: a stop (SIGTERM, Ctrl-C) came with the last step, so the run finished, and a sweep of several
    runs is to stop after it (in several processes, the step they agreed on can be a run's last)."""

    status: typing.Literal["finished", "preempted", "diverged"]
    step: int
    metrics: dict = dataclasses.field(default_factory=dict)
    message: str = ""
    last_good: int | None = None
    results: dict | None = None
    seconds: float | None = None
    state: Any = dataclasses.field(default=None, repr=False, compare=False)  # the train state it ended with
    stop_requested: bool = False

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    def divergence(self) -> DivergenceError:
        """The diverged outcome as the error a command reports (exit 1)."""
        return DivergenceError(self.message, step=self.step, loss=self.metrics.get("loss", math.nan),
                               last_good=self.last_good)


@dataclasses.dataclass
class Hook:
    """`fn(step, state, train_loss) -> metrics to log (or None)`, run every `every` steps and at the last
    step; `train_loss` is the mean training loss since the hook last ran. A hook with memory (e.g. the
    best epoch so far) gives `state`/`restore` so checkpoints carry it; one that runs a program of its own gives
    `prepare(state)`, which compiles it without running it (before a profile window the hook runs in)."""

    name: str
    fn: Callable[[int, Any], dict | None]
    every: int = 0  # 0: at the last step only
    state: Callable[[], Any] | None = None
    restore: Callable[[Any], None] | None = None
    saves: bool = False  # a checkpoint follows each run of it (fine-tuning's epoch ends)
    prepare: Callable[[Any], None] | None = None
    doing: str = ""  # what the progress bar says while it runs ("": its name)

    def due(self, step: int, last: int) -> bool:
        return step == last or (self.every > 0 and step % self.every == 0)


# JAX's preemption sync point is a count of reached_preemption_sync_point calls, and a notice fixes it at one past
# the highest count any process had passed in: numbered by each loop's own steps, a notice that came after one
# loop's last step (its sync point last+1) was never reached by a next loop of as many steps, and a study in several
# processes ran on to its end (or stopped at that step of a longer one). Counted over every loop of the process,
# the next step polled anywhere reaches it. The processes of a job run the same loops, so their counts agree.
_sync_calls = [0]


class Preemption:
    """SIGTERM/SIGINT -> a flag the loop checks between steps (a checkpoint, then the loop stops); `signum`
    says which came first: after SIGTERM (a scheduler's pre-emption) the run ends normally (exit 0), after
    SIGINT (Ctrl-C) Loop.run raises Interrupted (exit 130). A second signal raises KeyboardInterrupt at once.
    Multi-process: JAX's preemption notifier owns SIGTERM and `poll` agrees on the step with the others
    (multihost_utils.reached_preemption_sync_point), so every process saves the same step; a Ctrl-C in one
    process's terminal is passed to that notifier as a SIGTERM of its own (it left at once, saving nothing),
    and that process then says so and exits 130 while the others end as pre-empted. Once per process
    (gpt1_jax/interrupt.py pass_ctrl_c_to_jax): one passed on between two runs of a study stops the next run as
    Ctrl-C, and a second Ctrl-C, in that run or before it, leaves at once.
    `close()` puts the previous handlers back: a process that runs several loops (a study) must not
    leave a finished loop's handler to swallow a signal that arrives between runs."""

    def __init__(self):
        self.requested = False
        self.signum: int | None = None  # None: JAX's preemption notifier (multi-process), i.e. SIGTERM
        self.multiprocess = jax.process_count() > 1
        self._previous = {}
        if not self.multiprocess:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
            if (lost := unanswered_signal()) is not None:  # came before this loop, and its interrupt was swallowed
                self.requested, self.signum = True, lost
        else:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle_ctrl_c)
            if ctrl_c_passed_to_jax():  # between two runs of a study: this run stops where the processes agree
                self.signum = signal.SIGINT

    def close(self) -> None:
        for sig, handler in self._previous.items():
            if handler is not None:  # None: a handler not installed from Python, which signal() cannot restore
                signal.signal(sig, handler)
        self._previous = {}

    def poll(self, step: int) -> bool:
        # Once per step, on every process; JAX is given the count of calls (_sync_calls), not the loop's `step`.
        if self.multiprocess and not self.requested:
            _sync_calls[0] += 1
            self.requested = multihost_utils.reached_preemption_sync_point(_sync_calls[0])
        return self.requested

    def _handle(self, signum, frame):
        if self.requested:  # a second Ctrl-C: give up at once
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum

    def _handle_ctrl_c(self, signum, frame):
        if not pass_ctrl_c_to_jax():  # a second Ctrl-C (in this run or before it): give up at once
            raise KeyboardInterrupt
        self.signum = signal.SIGINT


@dataclasses.dataclass
class Loop:
    trainer: Any  # gpt1_jax.step.Trainer
    steps: int  # the last step
    checkpointer: Any  # gpt1_jax.checkpoint.Checkpointer
    model_config: Any  # recorded with every checkpoint
    metrics: Any  # gpt1_jax.metrics.MetricsWriter
    progress: Any  # gpt1_jax.metrics.Progress
    hooks: list[Hook] = dataclasses.field(default_factory=list)
    log_every: int = 1
    tokens_per_step: int = 0  # for tokens/s and MFU in the log (0: not logged), over THROUGHPUT_STEPS steps
    flops_per_token: float = 0.0
    peak_flops: float = 0.0
    profile: tuple[int, int] | None = None  # (START, STOP): trace those steps (config.profile_window)
    profile_dir: Path | None = None
    stats_every: int = 0  # steps that also compute and log the per-layer statistics (0: none)

    def __post_init__(self):
        self._tally = {h.name: [0.0, 0] for h in self.hooks}  # train-loss sum and count since each hook ran
        self._seconds_before: float | None = 0.0  # the sessions before this one (a resumed checkpoint's)
        self._t_run = time.perf_counter()
        self._tracing = False
        if self.profile and self.profile[1] > self.steps:
            raise ConfigError(f"profile {self.profile[0]}:{self.profile[1]} ends after the run's last step ({self.steps})")

    def position(self, batches: Batches) -> dict:
        """What a checkpoint records beside the train state: a copy, since the save is written after the
        loop has gone on changing the live lists (asynchronous checkpointing)."""
        return json.loads(json.dumps({"batches": batches.state(), "tally": self._tally, "seconds": self._seconds(),
                                      "hooks": {h.name: h.state() for h in self.hooks if h.state}}))

    def _seconds(self) -> float | None:
        """The run's training time so far, this session included."""
        if self._seconds_before is None:
            return None
        return self._seconds_before + time.perf_counter() - self._t_run

    def restore_position(self, position: dict) -> None:
        """The hooks' and the tally's part of `position` (the batches restore theirs first: `start`)."""
        for h in self.hooks:
            if h.restore and h.name in position.get("hooks", {}):
                h.restore(position["hooks"][h.name])
        self._tally.update({k: list(v) for k, v in position.get("tally", {}).items() if k in self._tally})
        self._seconds_before = position.get("seconds")  # None: saved before checkpoints kept the time

    def run(self, state, batches: Batches) -> Outcome:
        """Trains from `state.step` to `steps` -> Outcome. Stopped by Ctrl-C, raises Interrupted once its
        checkpoint is saved."""
        start = int(jax.device_get(state.step))
        preemption, step, cut, diverged = Preemption(), start, None, None
        self._t_run = time.perf_counter()
        self._restart_clock()
        self._last, self._step = {}, start
        self._saved_seconds: tuple[int, float | None] | None = None  # (step, seconds) of this session's last save
        self._dispatched: set[tuple] = set()  # the step programs (`_program`) run or compiled in this session
        self._hooks_compiled: set[str] = set()  # the hooks run (or prepared) in this session
        self._untimed = False  # the next step recorded has no tokens/s of its own (a compilation cut its interval)
        try:
            with unwrapped_interrupts():  # a second Ctrl-C that JAX's C++ wrapped in another error is one all the same
                state, step = self._steps(state, batches, start, preemption)
            with self.progress.paused("saving checkpoint"):
                self.checkpointer.wait()  # the last save failing fails the run
        except KeyboardInterrupt as e:  # a second Ctrl-C (or one in a multi-process run): stop without saving
            abort(130, e)  # multi-process: leave now; the peers may never join a collective
            cut, step = e, self._step
        except DivergenceError as e:  # every process sees the same loss: each stops here, none aborts
            diverged = e
        except BaseException as e:
            abort(1, e)
            raise
        finally:  # an error still lets the save in flight finish, so the last checkpoint stays whole
            if self._tracing:  # stopped inside the profile window: the trace so far is still written
                self._stop_trace(None)
            preemption.close()
            self.progress.close()
            self.checkpointer.close()
            self.metrics.close()
        # Only now, with every save on disk and everything closed, is it true what the messages say.
        if cut is not None:
            last = newest_checkpoint(self.checkpointer.directory)
            kept = (f"checkpoint {last} is kept; run the same command to resume from it" if last is not None
                    else "no checkpoint was saved yet; run the same command to start again")
            raise Interrupted(f"interrupted (Ctrl-C) in step {step}, without saving it: {kept}", step=last) from cut
        if diverged is not None:
            return Outcome("diverged", diverged.step, dict(self._last), str(diverged), diverged.last_good,
                           seconds=self._seconds(), state=state)
        if preemption.requested and preemption.signum == signal.SIGINT and step < self.steps:
            raise Interrupted(f"interrupted (Ctrl-C) at step {step}: checkpoint saved; run the same command to resume",
                              step=step, together=preemption.multiprocess)
        # A signal that came with the last step stopped nothing of this run: it is finished, and says the stop was
        # asked for (a sweep stops after it). Its seconds are those its last checkpoint keeps, so a resumed run's
        # sessions add up to exactly what it reports.
        seconds = self._saved_seconds[1] if self._saved_seconds and self._saved_seconds[0] == step else self._seconds()
        return Outcome("finished" if step == self.steps else "preempted", step, dict(self._last), seconds=seconds,
                       state=state, stop_requested=preemption.requested and step == self.steps)

    def _steps(self, state, batches: Batches, start: int, preemption: Preemption):
        """The steps themselves -> (state, the last step run)."""
        pending = None
        for step in range(start + 1, self.steps + 1):
            self._step = step
            if self._profiled(step) and not self._tracing:  # the window's first step, or the first one resumed in it
                if pending:
                    self._record(*pending)
                    pending = None
                with self.progress.paused("compiling"):
                    self._compile_window(state, batches, step)
                self._start_trace()
            epoch = getattr(batches, "epoch", None)
            local = next(batches)
            batch = self.trainer.put_batch(local)
            stats = {"stats": True} if self._watched(step) else {}
            program = self._program(step, local)
            # Its first dispatch compiles it (or loads it from the cache); before a profile window, _compile_window did
            compiles = program not in self._dispatched
            with self.progress.paused("compiling") if compiles else contextlib.nullcontext():
                state, metrics = self.trainer.step(state, batch, **stats)
            if compiles:
                self._dispatched.add(program)
                self._untimed = True  # the step recorded next has the compilation in its interval: no tokens/s
            if pending:
                self._record(*pending)  # the previous step's, while this one runs
            pending = (step, metrics, epoch)
            preempted = preemption.poll(step)
            due = [h for h in self.hooks if h.due(step, self.steps)]
            save = preempted or self.checkpointer.should_save(step) or step == self.steps or any(h.saves for h in due)
            if due or save or self._tracing:  # in the profile window each step ends before the next one starts
                self._record(*pending)
                pending = None
            if self._tracing and step == self.profile[1]:
                self._stop_trace(state)
            self._run_hooks(due, step, state)
            if save:
                with self.progress.paused("saving checkpoint"):
                    position = self.position(batches)
                    self.checkpointer.save(step, state, position, self.model_config)
                    self._saved_seconds = (step, position["seconds"])
                    self.metrics.flush()
                self._restart_clock()  # saving is not training throughput (nor the next step's time)
            if preempted:
                if step == self.steps:
                    self.progress.warn(f"stopped with the last step ({step}): checkpoint saved; the run is finished")
                elif preemption.signum != signal.SIGINT:  # Ctrl-C's line comes last, from Interrupted in run
                    self.progress.warn(f"preempted: checkpoint saved at step {step}; run the same command to resume")
                return state, step
        if pending:
            self._record(*pending)
        return state, self._step

    def _watched(self, step: int) -> bool:
        """A step that computes (and always logs) the per-layer statistics."""
        return bool(self.stats_every) and step % self.stats_every == 0

    def _program(self, step: int, batch: dict) -> tuple:
        """What picks the compiled program a step runs: its kind (per-layer statistics or not) and its batch's
        shapes. Fine-tuning buckets its batches by length: a run meets up to ~14 shapes, each compiling once."""
        return (self._watched(step), *((k, v.shape) for k, v in sorted(batch.items())))

    def _profiled(self, step: int) -> bool:
        return self.profile is not None and self.profile[0] <= step <= self.profile[1]

    def _compile_window(self, state, batches: Batches, first: int) -> None:
        """Compiles what the profile window runs before it opens: every step kind (per-layer statistics or not) and
        batch shape (fine-tuning's batches have several lengths) of its steps, read ahead and the batches' position
        put back, and the hooks due in it that this session has not run. A compilation inside the window (step 1's,
        a first step with statistics, a first evaluation) filled a tiny run's trace with ~190,000-800,000 events of
        tracing and compiling against ~9,000 for its steps, and took ~10 s more to write. The hooks of the window's
        last step run after it closes. A program compiled before compiles again in no time (jax.jit keeps it)."""
        window = range(first, self.profile[1] + 1)
        position = json.loads(json.dumps(batches.state()))
        kinds = {}
        for step in window:
            batch = next(batches)
            kinds.setdefault(self._program(step, batch), batch)
        batches.restore(position)
        for program, batch in kinds.items():
            self.trainer.compile(state, self.trainer.put_batch(batch), stats=program[0])
            self._dispatched.add(program)
        for hook in self.hooks:
            if (hook.prepare and hook.name not in self._hooks_compiled
                    and any(hook.due(step, self.steps) for step in window[:-1])):
                hook.prepare(state)
                self._hooks_compiled.add(hook.name)

    def _start_trace(self) -> None:
        """jax.profiler's trace of the window into profile_dir (per process when there are several: each writes
        its own host's trace): TensorBoard's profile plugin / XProf read the .xplane.pb, ui.perfetto.dev the
        perfetto_trace.json.gz."""
        folder = Path(self.profile_dir)
        if jax.process_count() > 1:
            folder = folder / f"process{jax.process_index()}"
        folder.mkdir(parents=True, exist_ok=True)
        jax.profiler.start_trace(str(folder), create_perfetto_trace=True)
        self._tracing, self._trace_folder, self._trace_first = True, folder, self._step

    def _stop_trace(self, state) -> None:
        if state is not None:
            jax.block_until_ready(state)  # the last profiled step's update, whole
        self._tracing = False
        with self.progress.paused("writing the profile"):
            jax.profiler.stop_trace()
        traces = sorted(self._trace_folder.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
        if traces:  # where the trace went, and what reads it
            self.progress.warn(f"profile of steps {self._trace_first}-{self._step}: {traces[-1]} (ui.perfetto.dev; "
                               f"TensorBoard's profile plugin or XProf read the .xplane.pb beside it)")
        self._restart_clock()  # writing the trace is not training throughput

    def _run_hooks(self, due: list[Hook], step: int, state) -> None:
        for hook in due:
            total, count = self._tally[hook.name]
            self._tally[hook.name] = [0.0, 0]
            with self.progress.paused(hook.doing or hook.name):
                logged = hook.fn(step, state, total / max(count, 1))
            self._hooks_compiled.add(hook.name)
            if logged:
                self.metrics.write(step, **logged)
                self._last.update(logged)
        if due:
            self._restart_clock()  # evaluation time is not training throughput

    def _restart_clock(self) -> None:
        """Throughput is timed from now on: what came before (a compilation, a save) was not training."""
        self._clock = deque([time.perf_counter()], maxlen=THROUGHPUT_STEPS + 1)

    def _record(self, step: int, metrics, epoch) -> None:
        m = {k: float(v) for k, v in jax.device_get(metrics).items() if k != "weight"}
        # The loss is measured before the update; a gradient that is not finite makes the updated weights NaN
        # while the loss still reads finite: either one and the step's state is not saved.
        bad = [f"{k} is {m[k]}" for k in ("loss", "grad_norm") if k in m and not math.isfinite(m[k])]
        if bad:
            self.metrics.write(step, **{k: m[k] for k in ("loss", "grad_norm") if k in m})
            last = self.checkpointer.latest_verified_step()
            raise DivergenceError(
                f"{' and '.join(bad)} at step {step}; stopping (lower optim.lr?). Last good checkpoint: "
                f"{'step ' + str(last) if last is not None else 'none'} in {self.checkpointer.directory}",
                step=step, loss=m["loss"], last_good=last)
        for tally in self._tally.values():
            tally[0] += m["loss"]
            tally[1] += 1
        fields = {}
        if self._untimed or self._profiled(step):  # a compilation in its interval; a traced step runs slower
            self._restart_clock()
            self._untimed = False
        else:
            self._clock.append(time.perf_counter())
            if self.tokens_per_step:
                tokens_per_s = self.tokens_per_step * (len(self._clock) - 1) / max(self._clock[-1] - self._clock[0], 1e-9)
                # the step's own interval too: a pause shows whole in it (the optimizer study drops such steps)
                fields = {"tokens_per_s": tokens_per_s, "step_s": self._clock[-1] - self._clock[-2]}
                if self.flops_per_token and self.peak_flops:
                    fields["mfu"] = tokens_per_s * self.flops_per_token / self.peak_flops
        self._last.update(m, **fields)
        if self._watched(step) or (self.log_every and (step % self.log_every == 0 or step == self.steps)):
            self.metrics.write(step, **m, **fields, **({"epoch": epoch} if epoch is not None else {}))
        shown = {"loss": m["loss"]}
        if "tokens_per_s" in fields:
            shown["tok_s"] = f"{fields['tokens_per_s']:,.0f}"
        if "mfu" in fields:
            shown["mfu"] = f"{fields['mfu']:.1%}"
        self.progress.update(1, **shown)


def resume_step(checkpointer, model_config) -> int:
    """The step a run resumes at: its newest intact checkpoint's (0: a new run), checked to hold this model."""
    step = checkpointer.latest_intact_step() or 0
    if step:
        checkpointer.check_model(model_config, step)
    return step


def start(workdir: Path, job: run_folder.Identity, config, trainer, checkpointer, batches: Batches, begin: int, *,
          steps: int, init_state: Callable[[], Any], hooks: Callable[[Progress], list[Hook]], desc: str,
          write_files: Callable[[], None] = lambda: None, progress: bool = True,
          **loop_options) -> tuple[Loop, Any]:
    """Everything both jobs do before their loop -> (loop, state at `begin`). The state comes from checkpoint
    `begin` (`resume_step`), with the batches' and the hooks' positions, or from `init_state()` for a new run.
    Then process 0 opens the tracker, claims the workdir for `job` and writes config.yaml (and the job's own
    `write_files`): in that order, so a resume the checkpoint refuses (another corpus or batch size) or a
    tracker that cannot start leaves the folder as it was. `hooks(progress)` makes the hooks, which may write
    to the progress bar."""
    is_main = jax.process_index() == 0
    if begin:
        state, position, _ = checkpointer.restore(trainer.abstract_state_sharded(), begin)
        batches.restore(position["batches"])
    else:
        state, position = init_state(), None
    tracker = open_tracker(config.tracker, workdir, config, begin) if is_main else None
    if is_main:
        run_folder.claim(workdir, job, config.model.architecture())
        save_yaml(config, workdir / "config.yaml")
        write_files()
    bar = Progress(steps, begin, enabled=progress and is_main, desc=desc, speaks=is_main)
    metrics = MetricsWriter(workdir, enabled=is_main, resume_step=begin, tracker=tracker)
    loop = Loop(trainer, steps, checkpointer, config.model, metrics, bar, hooks(bar),
                profile=profile_window(config.profile), profile_dir=workdir / "profile",
                stats_every=config.stats_every, **loop_options)
    if position is not None:
        loop.restore_position(position)
    return loop, state
