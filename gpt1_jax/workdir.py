"""Which job a run folder belongs to, and who may write into it.

A workdir belongs to one job. The first time a run writes into one it records `run.json`: the job's kind
(pre-training or fine-tuning), for fine-tuning the task and the `--init` source, the architecture, and the
software it began with (`software`: this package's version, the libraries' its numbers depend on, Python's).
Every verb that writes into a workdir first `check`s it, before reading any data, and refuses with one
line naming the folder, what it holds and what to do:
  - a folder of another kind (`pretrain` into a fine-tuning run, `finetune` into a pre-training run),
    of another task or another init source, or the job's own `--init` source;
  - a path that is a file, or a folder that cannot be written;
  - a non-empty folder that holds no run (a home directory, a project checkout).
A fine-tuning run is also refused when its settings differ from the ones its folder was trained with
(`check_same_settings`): resuming a finished run with other flags would report the old run's scores
under the new settings. A pre-training run resumed with other data settings is refused too (`check_same_data`):
its checkpoint continues only the batches it began. Runs written before `run.json` existed are recognised by
their config.yaml.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from gpt1_jax.config import flat_fields, guarded_text, read_yaml, task_key, to_dict
from gpt1_jax.errors import ConfigError, WorkdirError
from gpt1_jax.files import atomic_write_text, some_names
from gpt1_jax.lockfile import LOCK_STALE_S, break_lock, held, mtime_ns, owner_is_gone, read_owner, try_lock

__all__ = ["Identity", "WorkdirError", "check", "claim", "read", "read_record", "check_same_settings", "init_identity",
           "recorded_step", "check_same_data", "hold", "training_now", "DATA_INFO_FIX"]

RUN_FILE = "run.json"
# The libraries whose versions a run records (and `gpt1-jax --version` prints): the ones its numbers and files
# depend on.
VERSIONED = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "tokenizers", "numpy")
LOCK_FILE = "run.lock"  # held by the job training in the folder (`hold`)
FORMAT = 1


def _ahead_of_a_run(entry: Path) -> bool:
    """What may already sit in a folder no run has claimed: the BPE `gpt1-jax tokenize --tokenizer train
    --workdir W` trains ahead of a pre-training run, an empty checkpoints/ (a mount point or a link to
    a bigger disk), and the lock of a job starting there (`hold`)."""
    if entry.name == "checkpoints":
        return entry.is_dir() and not any(entry.iterdir())
    return entry.name in ("tokenizer.json", "tokenizer.meta.json", LOCK_FILE)
# Fine-tuning settings that may change when a run is resumed: how it is checkpointed, evaluated in
# batches, laid over devices, profiled or watched (per-layer statistics), none of which moves its results.
RESUMABLE_WITH_OTHER = ("mesh", "keep_checkpoints", "checkpoint_every", "eval_batch_size", "model.attention",
                        "model.remat", "profile", "stats_every", "tracker")


# Pre-training settings that fix how a run's corpus is cut into windows and in which order they come
# (gpt1_jax/data/pipeline.py): resumed with others, a run would not continue its own batches. The corpus and
# the tokenizer are paths that may move with a run (a fresh clone, another disk): the data iterator compares
# what they make when the checkpoint is restored. Everything else (steps, the schedule, cadences, the mesh,
# the dtype) may change when a pre-training run is resumed.
PRETRAIN_DATA = ("data.seq_len", "data.global_batch_size", "data.val_fraction", "data.split_seed", "data.seed")
# `seed` too: it drew the initial weights and draws every step's dropout masks (fold_in(seed, step)), so a run
# resumed with another one is no longer the run its config.yaml would reproduce.
PRETRAIN_FIXED = PRETRAIN_DATA + ("seed",)


@dataclasses.dataclass(frozen=True)
class Identity:
    kind: str  # "pretrain" | "finetune"
    task: str | None = None  # fine-tuning only
    init: str | None = None  # fine-tuning only: "none", or the resolved source folder ("scratch:" kept)

    def describe(self) -> str:
        if self.kind == "pretrain":
            return "a pre-training run"
        return f"a fine-tuning run of {self.task}" + (f" from {self.init}" if self.init else "")


def init_identity(init: str, step: int | None = None) -> str:
    """`--init` as recorded: the source folder resolved, so `./run` and `run` are one source; `SOURCE step N` for
    the checkpoint of a run it started from."""
    if init == "none":
        return init
    prefix = "scratch:" if init.startswith("scratch:") else ""
    return prefix + str(Path(init.removeprefix("scratch:")).resolve()) + ("" if step is None else f" step {step}")


def recorded_step(init: str | None) -> int | None:
    """The step a recorded init source names (`SOURCE step N`); None: none recorded."""
    found = re.fullmatch(r"(.*) step (\d+)", init or "", re.DOTALL)
    return None if found is None else int(found.group(2))


def _same_init(held: str, job: str) -> bool:
    """A job that names no step (a rerun with the run's own command) is the run's source at whatever step the run
    recorded: the step it resolved when it began."""
    return held == job or (recorded_step(job) is None and recorded_step(held) is not None
                           and held.removesuffix(f" step {recorded_step(held)}") == job)


def read(workdir: str | Path) -> Identity | None:
    """The job a folder belongs to; None for a new, empty or not-yet-claimed folder."""
    workdir = Path(workdir)
    path = workdir / RUN_FILE
    if path.is_file():
        raw = read_record(path)
        try:
            return Identity(raw["kind"], _task(raw.get("task")), raw.get("init"))
        except (KeyError, TypeError):
            raise _damaged(path) from None
    if (workdir / "config.yaml").is_file() and _trained_here(workdir):  # a run from before run.json
        try:
            saved = read_yaml(guarded_text(workdir / "config.yaml"))
        except yaml.YAMLError:
            saved = None
        if isinstance(saved, dict) and "task" in saved:
            return Identity("finetune", _task(str(saved["task"])))
        return Identity("pretrain")
    return None


# data_info.json only lets a run check that its data did not change: without it the check is skipped.
DATA_INFO_FIX = "restore it, or delete it (the check that the run's data did not change is then skipped)"


RECORD_FIX = "restore it, or start the run in another folder"  # what to do about a damaged record of a run


def read_record(path: Path, fix: str = RECORD_FIX) -> dict[str, Any]:
    """A JSON object a run wrote into its folder (run.json, data_info.json); WorkdirError if it is not one."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:  # not JSON, or not UTF-8
        raw = None
    if not isinstance(raw, dict):
        raise _damaged(path, fix)
    return raw


def _damaged(path: Path, fix: str = RECORD_FIX) -> WorkdirError:
    return WorkdirError(f"{path} is damaged (not the JSON gpt1-jax wrote): {fix}")


def _trained_here(workdir: Path) -> bool:
    """What a run from before run.json left beside its config.yaml. A config.yaml alone is not one: a folder
    `convert --to jax` wrote (config.yaml + params/) and a folder holding the config a user wrote by hand
    were taken for pre-training runs, and `pretrain` overwrote their config.yaml."""
    checkpoints = workdir / "checkpoints"
    return (workdir / "metrics.jsonl").is_file() or (checkpoints.is_dir() and any(checkpoints.iterdir()))


def _task(name: str | None) -> str | None:
    """A recorded task in its one spelling: runs made before FinetuneConfig recorded it so kept `RTE` as typed."""
    try:
        return None if name is None else task_key(name)
    except ConfigError:  # not a task this version knows: compared as it is
        return name


def check(workdir: str | Path, job: Identity, verb: str, *, init_path: str | Path | None = None) -> Identity | None:
    """Refuses (WorkdirError, one line) a workdir this job must not write into; writes nothing.
    Returns what the folder already holds (None: a new run)."""
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise WorkdirError(f"--workdir {workdir} is a file, not a folder: choose another --workdir")
    _check_writable(workdir)
    if init_path is not None and workdir.exists() and workdir.resolve() == Path(init_path).resolve():
        raise WorkdirError(f"--workdir {workdir} is the --init source: {verb} would overwrite the run it starts "
                           "from; choose another --workdir")
    held = read(workdir)
    if held is None:
        strangers = sorted(p.name for p in workdir.iterdir() if not _ahead_of_a_run(p)) if workdir.is_dir() else []
        if strangers:
            raise WorkdirError(f"--workdir {workdir} is not empty and holds no gpt1-jax run ({some_names(strangers)}): "
                               "choose a new or empty folder")
        return None
    where = f"{workdir} holds {held.describe()}"
    if held.kind != job.kind:
        raise WorkdirError(f"{where}; {verb} would overwrite it: choose another --workdir")
    if held.task is not None and job.task is not None and held.task != job.task:
        raise WorkdirError(f"{where}, not of {job.task}: choose another --workdir (one folder per task and setting)")
    if held.init is not None and job.init is not None and not _same_init(held.init, job.init):
        raise WorkdirError(f"{where}, not from {job.init}: choose another --workdir (one folder per init source)")
    return held


def _check_writable(workdir: Path) -> None:
    """The nearest existing folder on the way must be writable: found now, not after tokenizing."""
    if workdir.is_symlink() and not workdir.exists():  # mkdir would say "File exists", and the check below "a file"
        raise WorkdirError(f"--workdir {workdir} is a symbolic link to nothing ({os.readlink(workdir)} does not exist, "
                           "or the links go round): make its target, or choose another --workdir")
    existing = workdir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir() and os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise WorkdirError(f"cannot write --workdir {workdir}: {existing} is on a read-only file system; choose a "
                           "folder on a writable disk")
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise WorkdirError(f"cannot write --workdir {workdir}: {existing} is not writable (permission denied); "
                           "choose a folder you can write")
    if existing != workdir and not existing.is_dir():
        raise WorkdirError(f"cannot create --workdir {workdir}: {existing} is a file, not a folder")


@contextmanager
def hold(workdir: str | Path, verb: str, enabled: bool = True, writes: str = "the same checkpoints and metrics",
         held_by: str = "a job training there now") -> Iterator[None]:
    """Holds <workdir>/run.lock while a job trains there (process 0 of a job: `enabled`), so that a second job
    started on the same folder is refused in one line instead of writing the same checkpoints and metrics
    (interleaved steps in metrics.jsonl, saves failing under each other); an experiment's sweep holds its --out
    the same way (experiments/harness.py `one_sweep`). A lock whose holder is gone (killed on this host, or silent
    for LOCK_STALE_S) is broken (gpt1_jax/lockfile.py)."""
    if not enabled:
        yield
        return
    workdir = Path(workdir)
    created = not workdir.exists()
    workdir.mkdir(parents=True, exist_ok=True)
    lock = workdir / LOCK_FILE
    token = try_lock(lock)
    if token is None and _abandoned(lock):
        break_lock(lock)
        token = try_lock(lock)
    if token is None:
        raise WorkdirError(f"{workdir} is in use by {read_owner(lock)} ({held_by}): wait for it to end, or stop it; "
                           f"{verb} would write {writes}")
    try:
        with held(lock, token):
            yield
    finally:
        if created and not any(workdir.iterdir()):  # a job refused before its first write leaves no folder
            workdir.rmdir()


def _abandoned(lock: Path) -> bool:
    """A run lock whose holder is gone: killed on this host, or silent for LOCK_STALE_S (another host's holder: its
    heartbeat's age on the shared disk, by this host's clock; skew shortens it). A lock gone meanwhile is too."""
    return owner_is_gone(lock) or time.time() - (mtime_ns(lock) or 0) / 1e9 > LOCK_STALE_S


def training_now(workdir: str | Path) -> str | None:
    """Who holds `workdir`'s run.lock (`hold`) when a job is training there now, else None: that run's newest
    checkpoint is about to change."""
    lock = Path(workdir) / LOCK_FILE
    if not lock.is_file() or _abandoned(lock):
        return None
    return read_owner(lock)


def software() -> dict[str, str]:
    """{"gpt1-jax": "0.1.0", "jax": ..., ..., "python": "3.11.7"}, from the installed packages' metadata."""
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path, never pip-installed
            return "not installed"
    return {name: version(name) for name in ("gpt1-jax", *VERSIONED)} | {"python": platform.python_version()}


def claim(workdir: str | Path, job: Identity, architecture: dict[str, Any]) -> None:
    """Creates the folder and records the job, unless it is recorded already (call on process 0, after
    `check` and every other check, right before the run's first write)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if (workdir / RUN_FILE).is_file():
        return
    record = {"format": FORMAT, **{k: v for k, v in dataclasses.asdict(job).items() if v is not None},
              "architecture": architecture, "software": software()}
    atomic_write_text(workdir / RUN_FILE, json.dumps(record, indent=1) + "\n")


def shown_changes(differ: list[str], old: dict, new: dict) -> str:
    """The first few fields that differ, each as `key=old there, new now`."""
    return (", ".join(f"{k}={old.get(k)!r} there, {new.get(k)!r} now" for k in differ[:3])
            + (", ..." if len(differ) > 3 else ""))


def check_same_settings(workdir: Path, config, saved) -> None:
    """A fine-tuning run resumed (or rerun once finished) with other settings than its folder's is refused,
    naming the first few that differ: its checkpoints and scores belong to the saved settings."""
    new, old = flat_fields(to_dict(config)), flat_fields(to_dict(saved))
    differ = [k for k in sorted(set(new) | set(old)) if new.get(k) != old.get(k)
              and not any(k == f or k.startswith(f + ".") for f in RESUMABLE_WITH_OTHER)]
    if differ:
        raise WorkdirError(f"{workdir} holds a fine-tuning run with other settings ({shown_changes(differ, old, new)}): "
                           "choose another --workdir (one folder per setting), or repeat the run's own flags to resume it "
                           "(or leave them out: its config.yaml is the default)")


def check_same_data(workdir: Path, config, saved) -> None:
    """A pre-training run resumed from a checkpoint with other data settings or seed (`PRETRAIN_FIXED`) is refused,
    naming them, before the corpus is read: its checkpoint continues only the stream of batches it began. (The data
    iterator's own check at restore, gpt1_jax/data/pipeline.py, is the backstop for what the config misses.)"""
    new, old = flat_fields(to_dict(config)), flat_fields(to_dict(saved))
    differ = [k for k in PRETRAIN_FIXED if new.get(k) != old.get(k)]
    if differ:
        what = "on other data" if all(k.startswith("data.") for k in differ) else "of another seed or data"
        raise WorkdirError(f"{workdir} holds a pre-training run {what} ({shown_changes(differ, old, new)}): its "
                           "checkpoints continue only the batches they began; repeat the run's own flags to resume "
                           "it (or leave them out: its config.yaml is the default), or choose another --workdir")
