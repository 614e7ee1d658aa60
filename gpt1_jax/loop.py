"""The training loop that pre-training and fine-tuning both configure.

    for step in start+1 .. steps:
        dispatch the step on the next batch
        read the *previous* step's metrics (no host sync per step: the device keeps working meanwhile)
        at hook steps, checkpoint steps and the end: read this step's metrics first (a diverged step is
        never evaluated or saved), run the hooks (evaluation, best-epoch choice), then save
        on SIGTERM / SIGINT: save and stop (SIGTERM: exit 0; Ctrl-C: Interrupted, exit 130; the same
        command resumes either way)

A NaN/inf loss raises `DivergenceError` naming the newest checkpoint that verifies against its
digests; a failed save stops the run (CheckpointWriteError). A checkpoint holds the train state and
`position()`: the batch source's position plus every hook's state, so a resumed run replays
exactly what an uninterrupted one would have done.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import time
from typing import Any, Callable, Protocol

import jax

from gpt1_jax.errors import DivergenceError


class Batches(Protocol):
    """The host side of the data: process-local numpy batches and a JSON-able resume position."""

    def __next__(self) -> dict: ...

    def state(self) -> Any: ...


@dataclasses.dataclass
class Hook:
    """`fn(step, state, train_loss) -> metrics to log (or None)`, run every `every` steps and at the last
    step; `train_loss` is the mean training loss since the hook last ran. A hook with memory (e.g. the
    best epoch so far) gives `state`/`restore` so checkpoints carry it."""

    name: str
    fn: Callable[[int, Any], dict | None]
    every: int = 0  # 0: at the last step only
    state: Callable[[], Any] | None = None
    restore: Callable[[Any], None] | None = None

    def due(self, step: int, last: int) -> bool:
        return step == last or (self.every > 0 and step % self.every == 0)


class Preemption:
    """SIGTERM/SIGINT -> a flag the loop checks between steps (a checkpoint, then the loop stops); `signum`
    says which came first: after SIGTERM (a scheduler's pre-emption) the run ends normally (exit 0), after
    SIGINT (Ctrl-C) Loop.run raises Interrupted (exit 130). A second signal raises KeyboardInterrupt at once.
    Multi-process: JAX's preemption notifier owns SIGTERM and `poll` agrees on the step with the others
    (multihost_utils.reached_preemption_sync_point), so every process saves the same step.
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

    def close(self) -> None:
        for sig, handler in self._previous.items():
            if handler is not None:  # None: a handler not installed from Python, which signal() cannot restore
                signal.signal(sig, handler)
        self._previous = {}

    def poll(self, step: int) -> bool:
        if self.multiprocess and not self.requested:  # call once per step, on every process
            from jax.experimental import multihost_utils

            self.requested = multihost_utils.reached_preemption_sync_point(step)
        return self.requested

    def _handle(self, signum, frame):
        if self.requested:  # a second Ctrl-C: give up at once
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum


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
    tokens_per_step: int = 0  # for tokens/s and MFU in the log (0: not logged)
    flops_per_token: float = 0.0
    peak_flops: float = 0.0

    def __post_init__(self):
        self._tally = {h.name: [0.0, 0] for h in self.hooks}  # train-loss sum and count since each hook ran

    def position(self, batches: Batches) -> dict:
        """What a checkpoint records beside the train state: a copy, since the save is written after the
        loop has gone on changing the live lists (asynchronous checkpointing)."""
        return json.loads(json.dumps({"batches": batches.state(), "tally": self._tally,
                                      "hooks": {h.name: h.state() for h in self.hooks if h.state}}))

    def restore_position(self, position: dict, batches) -> None:
        batches.restore(position["batches"])
        for h in self.hooks:
            if h.restore and h.name in position.get("hooks", {}):
                h.restore(position["hooks"][h.name])
        self._tally.update({k: list(v) for k, v in position.get("tally", {}).items() if k in self._tally})

    def run(self, state, batches: Batches):
        """Trains from `state.step` to `steps`. Returns (state, preempted); stopped by Ctrl-C, raises
        Interrupted once its checkpoint is saved."""
        from gpt1_jax.distributed import abort

        start = int(jax.device_get(state.step))
        preemption, pending, preempted, cut, step = Preemption(), None, False, None, start
        self._t_last = time.perf_counter()
        try:
            for step in range(start + 1, self.steps + 1):
                epoch = getattr(batches, "epoch", None)
                state, metrics = self.trainer.step(state, self.trainer.put_batch(next(batches)))
                if pending:
                    self._record(*pending)  # the previous step's, while this one runs
                pending = (step, metrics, epoch)
                preempted = preemption.poll(step)
                due = [h for h in self.hooks if h.due(step, self.steps)]
                save = preempted or self.checkpointer.should_save(step) or step == self.steps
                if due or save:
                    self._record(*pending)
                    pending = None
                for hook in due:
                    total, count = self._tally[hook.name]
                    self._tally[hook.name] = [0.0, 0]
                    logged = hook.fn(step, state, total / max(count, 1))
                    if logged:
                        self.metrics.write(step, **logged)
                if save:
                    self.checkpointer.save(step, state, self.position(batches), self.model_config)
                if due:
                    self._t_last = time.perf_counter()  # evaluation time is not training throughput
                if preempted:
                    if preemption.signum != signal.SIGINT:  # Ctrl-C's line comes last, from Interrupted below
                        self.progress.write(f"preempted: checkpoint saved at step {step}; run the same command to "
                                            "resume")
                    break
            if pending:
                self._record(*pending)
            self.checkpointer.wait()  # the last save failing fails the run
        except KeyboardInterrupt as e:  # a second Ctrl-C (or one in a multi-process run): stop without saving
            abort(130, e)  # multi-process: leave now; the peers may never join a collective
            cut = e
        except BaseException as e:
            if not isinstance(e, DivergenceError):
                abort(1, e)
            raise
        finally:  # an error still lets the save in flight finish, so the last checkpoint stays whole
            preemption.close()
            self.progress.close()
            self.checkpointer.close()
            self.metrics.close()
        # Only now, with every save on disk and everything closed, is it true what the message says.
        from gpt1_jax.errors import Interrupted

        if cut is not None:
            from gpt1_jax.integrity import checkpoint_steps

            try:
                last = checkpoint_steps(self.checkpointer.directory)[-1]
            except (OSError, IndexError):
                last = None
            kept = (f"checkpoint {last} is kept; run the same command to resume from it" if last is not None
                    else "no checkpoint was saved yet; run the same command to start again")
            raise Interrupted(f"interrupted (Ctrl-C) in step {step}, without saving it: {kept}", step=last) from cut
        if preempted and preemption.signum == signal.SIGINT:
            raise Interrupted(f"interrupted (Ctrl-C) at step {step}: checkpoint saved; run the same command to resume",
                              step=step)
        return state, preempted

    def _record(self, step: int, metrics, epoch) -> None:
        m = {k: float(v) for k, v in jax.device_get(metrics).items() if k != "weight"}
        if not math.isfinite(m["loss"]):
            self.metrics.write(step, loss=m["loss"])
            last = self.checkpointer.latest_verified_step()
            raise DivergenceError(
                f"loss is {m['loss']} at step {step}; stopping (lower optim.lr?). Last good checkpoint: "
                f"{'step ' + str(last) if last is not None else 'none'} in {self.checkpointer.directory}",
                step=step, loss=m["loss"], last_good=last)
        for tally in self._tally.values():
            tally[0] += m["loss"]
            tally[1] += 1
        now = time.perf_counter()
        fields = {}
        if self.tokens_per_step:
            tokens_per_s = self.tokens_per_step / max(now - self._t_last, 1e-9)
            fields = {"tokens_per_s": tokens_per_s}
            if self.flops_per_token and self.peak_flops:
                fields["mfu"] = tokens_per_s * self.flops_per_token / self.peak_flops
        self._t_last = now
        if self.log_every and (step % self.log_every == 0 or step == self.steps):
            self.metrics.write(step, **m, **fields, **({"epoch": epoch} if epoch is not None else {}))
        shown = {"loss": m["loss"]}
        if "tokens_per_s" in fields:
            shown["tok_s"] = f"{fields['tokens_per_s']:,.0f}"
        if "mfu" in fields:
            shown["mfu"] = f"{fields['mfu']:.1%}"
        self.progress.update(1, **shown)
