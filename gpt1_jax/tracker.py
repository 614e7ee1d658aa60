"""Where a run's metrics go besides metrics.jsonl (config `tracker`, flag `--tracker`): TensorBoard event files
under <workdir>/tensorboard/ (tensorboardX), a Weights & Biases run, or nowhere else.

W&B comes through its own library (`pip install -e ".[wandb]"`) and its usual environment: WANDB_PROJECT
(default: gpt1-jax), WANDB_ENTITY, WANDB_MODE (offline: no network, the run is kept under <workdir>/wandb/ for
`wandb sync`), WANDB_DIR (default: the workdir), WANDB_API_KEY, and so on. The W&B run is named after the
workdir, holds the resolved config, and its id is kept in <workdir>/wandb_run_id, so a resumed training run
logs into the same W&B run. Only process 0 logs (gpt1_jax/metrics.py). The run's step is the metric `train/step`,
every chart's x-axis (WandB.log says why); W&B's own `_step` only counts the rows logged.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Protocol

from gpt1_jax.config import to_dict
from gpt1_jax.errors import ConfigError
from gpt1_jax.files import atomic_write_text


class Tracker(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def flush(self) -> None: ...  # what is logged so far reaches the disk (a checkpoint was just saved)

    def close(self) -> None: ...


def open_tracker(kind: str, workdir: Path, config: Any, resume_step: int) -> Tracker | None:
    """The tracker `kind` names for a run in `workdir` resumed at `resume_step` (None: `none`)."""
    if kind == "tensorboard":
        return TensorBoard(workdir, resume_step)
    if kind == "wandb":
        return WandB(workdir, config)
    return None


def check_tracker(kind: str) -> None:
    """What can be known of the tracker before any data is read: W&B's package and, online, its login (no network:
    `wandb.login(verify=False)` reads the key W&B would use). A run without one failed at its first step, after
    the BPE and the token cache were made (minutes on a large corpus)."""
    if kind != "wandb":
        return
    wandb = _import_wandb()
    try:
        wandb.login(verify=False)  # False, not an error, where WANDB_MODE is offline or disabled
    except (wandb.errors.Error, ValueError) as e:
        raise _wandb_error(e) from None


def _import_wandb():
    try:
        import wandb  # the optional extra
    except ImportError:
        raise ConfigError('tracker=wandb needs the wandb package: pip install -e ".[wandb]"') from None
    return wandb


def _wandb_error(e: Exception) -> ConfigError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ConfigError(f"tracker=wandb could not start a W&B run: {first} (or log offline: WANDB_MODE=offline; "
                       "or --tracker tensorboard)")


def _finite(scalars: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in scalars.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def _summary_writer_class():
    """tensorboardX's SummaryWriter, imported here: tensorboardX takes seconds to import, and every CLI verb
    imports this module. tensorboardX also imports PyTorch at its own import, where it is installed, only to
    accept torch tensors (~5 s of a 2-core machine at every run's start; we log floats): `import torch` is made
    to fail, which tensorboardX handles, while tensorboardX loads, unless torch is loaded already."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


# What killed tensorboardX's writer threads (their uncaught exceptions), for the TensorBoard that owns each to raise.
_WRITER_FAILURES: dict[threading.Thread, BaseException] = {}


def _keep_writer_thread_failures() -> None:
    """A writer thread's failure (a full disk) is kept for its run to raise as one error, not printed as a thread's
    traceback between the run's lines; every other thread's still reaches the hook that was there before."""
    previous = threading.excepthook
    if getattr(previous, "_keeps_tensorboard_failures", False):
        return

    def hook(args) -> None:
        if type(args.thread).__name__ == "_EventLoggerThread" and args.exc_value is not None:
            _WRITER_FAILURES[args.thread] = args.exc_value
        else:
            previous(args)

    hook._keeps_tensorboard_failures = True
    threading.excepthook = hook


class TensorBoard:
    def __init__(self, workdir: Path, resume_step: int):
        SummaryWriter = _summary_writer_class()
        self._dir = Path(workdir) / "tensorboard"
        # purge_step: a resumed run drops the events past its checkpoint, as metrics.jsonl does
        self._writer = SummaryWriter(str(self._dir), purge_step=resume_step + 1 if resume_step else None)
        self._events = self._writer._get_file_writer().event_writer  # its queue and the thread that writes it
        _keep_writer_thread_failures()

    def _writer_died(self) -> bool:
        """Whether tensorboardX's writer thread died; then its writer counts as closed: its close (ours, and the one
        tensorboardX runs at exit) would wait on the thread forever."""
        worker = self._events._worker
        if worker is None or worker.is_alive():
            return False
        self._events._closed = True
        return True

    def _check_writer(self) -> None:
        """tensorboardX writes from a thread of its own. One that died (a full disk) left every later add_scalar
        waiting forever on its full queue, and the run with it: SIGTERM did nothing, Ctrl-C's line came and the
        process stayed, in the close at exit. Its failure is raised here instead (an OSError: the CLI's one line)."""
        worker = self._events._worker
        if not self._writer_died():
            return
        failure = _WRITER_FAILURES.pop(worker, None)
        if isinstance(failure, OSError):
            raise OSError(failure.errno, failure.strerror, failure.filename or str(self._dir)) from failure
        raise OSError(f"TensorBoard's writer stopped writing to {self._dir}: {failure!r}")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in _finite(scalars).items():
            self._check_writer()  # each add_scalar may be the one that fills the queue
            self._writer.add_scalar(key, value, step)

    def flush(self) -> None:
        self._check_writer()
        self._writer.flush()

    def close(self) -> None:
        if not self._writer_died():  # else a failure already said (log, flush): nothing left to write, no thread to stop
            self._writer.close()


class WandB:
    STEP = "train/step"  # the x-axis of every W&B chart (see log)

    def __init__(self, workdir: Path, config: Any):
        wandb = _import_wandb()
        workdir = Path(workdir)
        id_file = workdir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]  # W&B: [a-z0-9]
        workdir.mkdir(parents=True, exist_ok=True)  # W&B keeps its files there (an empty folder is still a new run)
        try:
            self._run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "gpt1-jax", name=workdir.resolve().name,
                                   id=run_id, resume="allow", dir=os.environ.get("WANDB_DIR") or str(workdir),
                                   config=to_dict(config))
        # No login, a bad key or project, no network; a bad WANDB_* setting (WANDB_MODE=banana: a pydantic
        # ValidationError, a ValueError): before the run writes anything.
        except (wandb.errors.Error, ValueError) as e:
            raise _wandb_error(e) from None
        if not id_file.is_file():  # only once W&B has the run: a folder the run never claimed holds no stray id
            atomic_write_text(id_file, run_id + "\n")
        self._run.define_metric(self.STEP)
        self._run.define_metric("*", step_metric=self.STEP)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        # Not W&B's step (log(step=)), which only goes up: a run resumed from a checkpoint older than the last step it
        # logged replays steps W&B has seen, and W&B dropped them ("Tried to log to step 4 that is less than the
        # current step 5 ... this data will be ignored"). As its warning advises, the step is a metric of its own,
        # the charts' x-axis: a replayed step is kept, beside the value the stopped session logged past its
        # checkpoint (TensorBoard's purge_step and metrics.jsonl drop those; W&B's rewind, resume_from, needs the
        # run on W&B's server, which an offline run is not).
        self._run.log({**_finite(scalars), self.STEP: step})

    def flush(self) -> None:
        pass  # W&B's own process streams what is logged

    def close(self) -> None:
        self._run.finish()
