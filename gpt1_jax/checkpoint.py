"""Checkpoints through orbax's CheckpointManager: train state, data-iterator position and run metadata.

Layout under `<workdir>/checkpoints/<step>/`: `state` (params + optimizer state + step, every process
writing its own shards), `data` (JSON: the batch source's position and the loop hooks' state), `meta`
(the model config and what wrote it) and `integrity.json` (every file's size and digest,
gpt1_jax/integrity.py). Saves are asynchronous and land in a temporary folder renamed on completion,
the digests written just before the rename, so a run killed mid-save keeps its previous checkpoint
intact (docs/stack.md). Restoring takes the *target* shardings, so a checkpoint written on one mesh
restores onto any other.

Trust (docs/checkpoints.md): a resumed run starts from the newest checkpoint that matches its
digests; newer damaged ones are reported and moved to `<directory>-damaged/`, and with none intact
the run stops with one error. A save that fails (full disk, unwritable folder) stops the run with one
error, leaving the earlier checkpoints as they were. Reading params from a damaged checkpoint is
refused, naming the newest intact step.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import multihost
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from gpt1_jax import integrity
from gpt1_jax.config import ModelConfig
from gpt1_jax.errors import CheckpointFormatError, CheckpointMismatchError, CheckpointWriteError


def _os_reason(e: BaseException) -> str:
    """The operating system's words for a failed write, also where orbax/tensorstore wrapped it in a
    ValueError ('RESOURCE_EXHAUSTED: ... [os_error_code=28]')."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    code = re.search(r"os_error_code='?(\d+)", str(e))
    return os.strerror(int(code.group(1))) if code else str(e).splitlines()[0]


class _OrbaxWriteFailureFilter(logging.Filter):
    """orbax logs a failure of its save threads with a traceback at each level it passes, then re-raises
    it to `Checkpointer.wait`, which reports it as one line (the traceback stays in the exception's
    chain: GPT1_JAX_DEBUG=1 shows it). Drop those log records; everything else passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        failure = record.exc_info[1] if record.exc_info else None
        if record.name == "asyncio":  # "... exception was never retrieved": a write (or read) orbax gave up on
            return not isinstance(failure, (OSError, ValueError)) \
                and not isinstance(failure.__cause__ if failure else None, (OSError, ValueError))
        return not (isinstance(failure, (OSError, ValueError)) and f"{os.sep}orbax{os.sep}" in record.pathname)


def _is_result_for_a_closed_loop(unraisable) -> bool:
    """A write or read orbax gave up on that completed afterwards: tensorstore's native thread hands its result to
    the event loop orbax already closed (asyncio's `call_soon_threadsafe` -> `_check_closed`), and Python
    reports the RuntimeError through sys.unraisablehook as a bare traceback, once per such write or read."""
    if unraisable.exc_type is not RuntimeError or str(unraisable.exc_value) != "Event loop is closed":
        return False
    tb = unraisable.exc_traceback
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name == "_check_closed" \
        and f"{os.sep}asyncio{os.sep}" in tb.tb_frame.f_code.co_filename


def _is_abandoned_read(unraisable) -> bool:
    """A shard read an orbax restore abandoned when another of its reads failed (the checkpoint deleted under its
    reader, which then reads the next: gpt1_jax/weights.py), closed at garbage collection, often during a later
    read or another test: "Exception ignored in: <coroutine object _read_array_index_and_device_put>" and a page
    of tensorstore spec."""
    code = getattr(unraisable.object, "cr_code", None)
    return code is not None and code.co_name == "_read_array_index_and_device_put" \
        and f"{os.sep}orbax{os.sep}" in code.co_filename


def quiet_orbax_echoes() -> None:
    """A failed save is reported once, as CheckpointWriteError, and a read cut short is read again or reported
    once; silence their echoes: orbax's logged tracebacks (absl), at exit asyncio's reports of the writes orbax
    gave up on ("Future exception was never retrieved"), tensorstore's "Event loop is closed" for each write or
    read still pending when orbax closed its loop, and the abandoned reads' coroutines (docs/checkpoints.md).
    Every other unraisable exception still reaches the hook that was there before."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OrbaxWriteFailureFilter) for f in logger.filters):
            logger.addFilter(_OrbaxWriteFailureFilter())
    previous = sys.unraisablehook
    if getattr(previous, "_drops_orbax_echoes", False):
        return

    def hook(unraisable) -> None:
        if not (_is_result_for_a_closed_loop(unraisable) or _is_abandoned_read(unraisable)):
            previous(unraisable)

    hook._drops_orbax_echoes = True
    sys.unraisablehook = hook


def _one_replica_writes_each_shard() -> None:
    """orbax splits the writing of a replicated array among its replicas ("replica-parallel"). Across hosts
    that spreads a data-parallel pod's save; within one process every replica sits on the same host, and the
    split only adds a device-side slice per array and replica, each a program to compile: 36 on the first save
    of the tiny model over 4 devices, 1.7 s of the 12.5 s of CPU of a 12-step run saving three times (0.4 s
    without; measured 2026-11-27, AVX2 kind). One process: one replica writes each shard (what orbax already
    does on GPUs); several: orbax's default. Either kind of checkpoint restores under either setting, and a
    one-process checkpoint continues in two processes (tests/e2e/test_multihost.py)."""
    if jax.process_count() == 1:
        # Replacing a handler makes orbax log "Type handler registry type ... overriding jax.Array" through absl,
        # a WARNING line in every run's output that asks nothing of the user: silenced for this one call.
        absl_logger = logging.getLogger("absl")
        level = absl_logger.level
        absl_logger.setLevel(logging.ERROR)
        try:
            ocp.type_handlers.register_type_handler(
                jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)
        finally:
            absl_logger.setLevel(level)


@dataclasses.dataclass
class _Pinned(pp.PreservationPolicy):
    """Keeps the steps in a set its owner changes while the run goes on (fine-tuning's best epoch)."""

    steps: set[int]

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        return [c.step in self.steps for c in checkpoints]


class Checkpointer:
    """Saves every `save_every` steps (and at the steps in `keep_steps`), keeps the newest `keep` plus
    every step in `keep_steps` for good (e.g. log-spaced snapshots for curves over training) and the
    step `pin` names (until another is pinned)."""

    def __init__(self, directory: str | Path, *, keep: int = 3, save_every: int = 0, keep_steps=(), async_save: bool = True):
        quiet_orbax_echoes()
        _one_replica_writes_each_shard()
        self.directory = Path(directory).absolute()
        self.save_every = save_every
        self.keep_steps = frozenset(int(s) for s in keep_steps)
        self.async_save = async_save
        self._in_flight: int | None = None  # the step whose save may still be running
        self._failed = False  # a save failed and was reported
        self._checked: int | None = None  # verified by latest_intact_step, for restore not to hash it again
        self._pinned: set[int] = set()
        policy = pp.AnyPreservationPolicy([pp.LatestN(keep), _Pinned(self._pinned)]
                                          + ([pp.CustomSteps(sorted(self.keep_steps))] if self.keep_steps else []))
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                preservation_policy=policy,
                create=True,
                # Always orbax's asynchronous path: its post-finalisation callback is where the digests
                # are recorded (a synchronous save just waits for it).
                enable_async_checkpointing=True,
                # Folders are created before save() returns: where that fails (read-only, full disk) orbax's
                # asynchronous creation would leave its writer threads waiting ~5 min for a signal.
                async_options=ocp.AsyncOptions(post_finalization_callback=self._record_digests,
                                               create_directories_asynchronously=False),
                # Leftovers of a save killed mid-way are not checkpoints; sweep them on start-up.
                cleanup_tmp_directories=True,
            ),
        )

    def folder(self, step: int) -> Path:
        return self.directory / str(step)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def pin(self, step: int) -> None:
        """Keeps checkpoint `step` (saved or still to be saved) beyond the newest `keep`; the step pinned before
        it goes the way of the others at the next save."""
        self._pinned.clear()
        self._pinned.add(int(step))

    def should_save(self, step: int) -> bool:
        return (bool(self.save_every) and step % self.save_every == 0) or step in self.keep_steps

    def save(self, step: int, state: Any, position: dict, model_config: ModelConfig, force: bool = False) -> bool:
        """Train state + `position` (JSON: where the data and the hooks were) + the model's config.
        A failed save, this one or the previous asynchronous one, raises CheckpointWriteError."""
        if self.manager.latest_step() == step:
            return False  # e.g. the final save right after a periodic one
        self.wait()
        meta = {"model": dataclasses.asdict(model_config), "step": int(step)}
        self._in_flight = step
        try:
            saved = self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    data=ocp.args.JsonSave(position),
                    meta=ocp.args.JsonSave(meta),
                ),
                force=force,
            )
        except (OSError, ValueError) as e:  # e.g. the temporary folder cannot be created
            raise self._write_error(step, e) from e
        if not saved:
            self._in_flight = None
        if not self.async_save:
            self.wait()
        return saved

    def _record_digests(self) -> None:
        """orbax's post-finalisation callback (its save thread, primary process only): the files of the
        step being saved are complete and, as of orbax 0.12, still in the temporary folder."""
        step = self._in_flight
        temporary = [p for p in self.directory.glob(f"{step}.orbax-checkpoint-tmp*") if p.is_dir()]
        integrity.record(temporary[0] if len(temporary) == 1 else self.folder(step))

    def wait(self) -> None:
        """Blocks until the save in flight is on disk with its digests; its failure -> CheckpointWriteError."""
        step = self._in_flight
        if step is None:
            return
        try:
            self.manager.wait_until_finished()
        except (OSError, ValueError) as e:  # orbax re-raises what failed in its save thread
            raise self._write_error(step, e) from e
        finally:
            self._in_flight = None  # only now: the save thread's callback reads it

    def _write_error(self, step: int, e: BaseException) -> CheckpointWriteError:
        self._failed, self._in_flight = True, None
        # What is on disk: orbax's list had already dropped the one its keep rule would delete after this save
        # ("steps 2" where 1 and 2 were there, intact)
        earlier = [s for s in integrity.checkpoint_steps(self.directory) if s != step]
        return CheckpointWriteError(
            f"could not write checkpoint {step} in {self.directory}: {_os_reason(e)}; the earlier checkpoints "
            f"are untouched ({'steps ' + ', '.join(map(str, earlier)) if earlier else 'there are none'})")

    def read_meta(self, step: int | None = None) -> dict:
        step = self.latest_step() if step is None else step
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def check_model(self, model_config: ModelConfig, step: int | None = None) -> None:
        """One clear error if the checkpoint's architecture is not the requested one (runtime fields aside)."""
        saved = self.read_meta(step)["model"]
        wanted = {**model_config.architecture(), "scan_layers": model_config.scan_layers}  # scan: the state's layout
        diffs = [f"{k} {saved.get(k)} (checkpoint) vs {v} (requested)" for k, v in wanted.items() if saved.get(k) != v]
        if diffs:
            raise CheckpointMismatchError(
                f"{self.directory} holds a checkpoint of another model: {'; '.join(diffs)}; "
                f"use another --workdir or the same config (drop the --config or --set model.* that change it: the "
                f"run's config.yaml is the default)"
            )

    def verify(self, step: int) -> str | None:
        """None when checkpoint `step` matches the digests recorded at its save, else what does not."""
        return integrity.verify(self.folder(step))

    def latest_intact_step(self) -> int | None:
        """The step to resume from: the newest checkpoint that verifies. Each newer one is reported on
        stderr and moved to `<directory>-damaged/` (kept for inspection); None when there is no
        checkpoint; CheckpointFormatError, everything left in place, when none verifies."""
        damaged = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            problem = self.verify(step)
            if problem is None:
                break
            damaged.append((step, problem))
        else:
            if damaged:
                raise CheckpointFormatError(
                    f"no intact checkpoint in {self.directory}: "
                    + "; ".join(f"step {s}: {p}" for s, p in damaged)
                    + " (left in place; use another --workdir, or move them away to start afresh)")
            return None
        if damaged:
            self._set_aside(damaged, resume=step)
        self._checked = step
        return step

    def _set_aside(self, damaged: list[tuple[int, str]], resume: int) -> None:
        """Process 0 moves the damaged checkpoints out of orbax's sight; every process then re-lists."""
        if jax.process_index() == 0:
            aside = self.directory.with_name(self.directory.name + "-damaged")
            aside.mkdir(exist_ok=True)
            for step, problem in damaged:
                target, n = aside / str(step), 1
                while target.exists():
                    n += 1
                    target = aside / f"{step}-{n}"
                self.folder(step).rename(target)
                print(f"checkpoint {step} is damaged ({problem}); moved to {target}", file=sys.stderr)
            print(f"resuming from checkpoint {resume}, the newest intact one", file=sys.stderr)
        if jax.process_count() > 1:
            multihost.sync_global_processes("gpt1_jax_checkpoints_set_aside")
        self.manager.reload()

    def latest_verified_step(self) -> int | None:
        """The newest checkpoint that verifies, once the save in flight has ended (None: none does).
        Nothing is moved: this names the checkpoint a stopped run can go back to."""
        try:
            self.wait()
        except CheckpointWriteError:
            pass  # that save is simply not a checkpoint
        return next((s for s in sorted(self.manager.all_steps(), reverse=True) if self.verify(s) is None), None)

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """-> (state placed on `abstract_state`'s shardings, the position saved with it, step), after
        checking the checkpoint against its digests (CheckpointFormatError if it does not match)."""
        step = self.latest_step() if step is None else step
        problem = None if step == self._checked else self.verify(step)
        self._checked = None
        if problem is not None:
            raise CheckpointFormatError(f"checkpoint {step} in {self.directory} is damaged: {problem}")
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()),
        )
        return restored["state"], restored["data"], step

    def close(self) -> None:
        """Waits for the save in flight (its failure raises CheckpointWriteError, once) and releases orbax.
        Closing twice is closing once (a job closes what its loop did not take over)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        try:
            self.wait()
        finally:
            if not self._failed:
                self.manager.close()
            else:  # orbax re-raises the failure already reported; release what it lets us
                try:
                    self.manager.close()
                except (OSError, ValueError):
                    pass


KeyPath = tuple[str | int, ...]  # dict keys and list indices from the `state` item's root


def _reader(directory: Path) -> ocp.CheckpointManager:
    """A manager that creates and sweeps nothing, with a handler for each item of the layout, so that
    orbax lists, describes and restores without complaints. A read cut short (the run it reads deleted the
    checkpoint meanwhile: gpt1_jax/weights.py reads the next) echoes as a write does, and more: quieted."""
    quiet_orbax_echoes()
    handlers = {"state": ocp.PyTreeCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(directory.absolute(), item_handlers=handlers,
                                 options=ocp.CheckpointManagerOptions(create=False))


def _pick_step(manager: ocp.CheckpointManager, step: int | None) -> int:
    steps = sorted(manager.all_steps())
    if not steps:
        raise FileNotFoundError(f"{manager.directory}: no checkpoint")
    if step is not None and step not in steps:
        raise FileNotFoundError(f"{manager.directory}: no checkpoint of step {step} (have {', '.join(map(str, steps))})")
    return steps[-1] if step is None else step


def _check_intact(directory: Path, step: int) -> None:
    """Params are never read from a checkpoint that does not match its digests: one error naming the
    newest one that does, for the caller to pick instead (nothing picks it silently)."""
    problem = integrity.verify(directory / str(step))
    if problem is None:
        return
    intact = integrity.newest_intact_checkpoint(directory, skip=step)
    raise CheckpointFormatError(
        f"checkpoint {step} in {directory} is damaged: {problem}; "
        + (f"the newest intact one is step {intact}" if intact is not None else "no other checkpoint there is intact"))


def latest_step(directory: str | Path) -> int:
    """The newest complete checkpoint's step (FileNotFoundError when there is none)."""
    with _reader(Path(directory)) as manager:
        return _pick_step(manager, None)


def state_metadata(directory: str | Path, step: int | None = None) -> Any:
    """The tree of a checkpoint's `state` item: nested dicts/lists of orbax ArrayMetadata (shape, dtype)."""
    with _reader(Path(directory)) as manager:
        return manager.item_metadata(_pick_step(manager, step))["state"].tree


def _subtree(tree: Any, path: KeyPath, where: str) -> Any:
    for key in path:
        try:
            tree = tree[key]
        except (KeyError, IndexError, TypeError):
            raise CheckpointFormatError(f"{where}: the checkpoint has no {'/'.join(map(str, path))}") from None
    return tree


def _selection(metadata: Any, paths: list[KeyPath], leaf: Any) -> Any:
    """The part of `metadata` under `paths`, each array's metadata mapped by `leaf`, in the form orbax's
    partial restore reads: dict entries present are restored, list entries that are None are not."""
    if () in paths:
        return jax.tree.map(leaf, metadata)
    keys = list(dict.fromkeys(p[0] for p in paths))

    def below(key):
        return _selection(metadata[key], [p[1:] for p in paths if p[0] == key], leaf)

    if isinstance(metadata, (list, tuple)):
        return [below(i) if i in keys else None for i in range(len(metadata))]
    return {key: below(key) for key in keys}


def restore_params(directory: str | Path, subtrees: Sequence[KeyPath] = (("params",),), *,
                   step: int | None = None) -> tuple[list[Any], int]:
    """-> ([the arrays under each key path of checkpoint `step`'s `state` item], step); step None = the latest.
    A checkpoint that does not match its digests is refused (CheckpointFormatError naming the newest intact step).

    One orbax partial restore reads only those arrays (optimizer moments stay on disk unless asked
    for), at the shapes and dtypes they were saved with, onto the host's first device. The key paths
    follow the saved tree: `("params",)` is a pre-training run's model, `("params", "transformer")` a
    fine-tuning run's, `("opt_state", 1, "z")` a leaf of an optimizer state (tuples are lists)."""
    with _reader(Path(directory)) as manager:
        step = _pick_step(manager, step)
        _check_intact(Path(manager.directory), step)
        restored = _read_state(manager, step, subtrees)
    return [_subtree(restored, path, str(directory)) for path in subtrees], step


def _read_state(manager: ocp.CheckpointManager, step: int, subtrees: Sequence[KeyPath], metadata: Any = None) -> Any:
    """The arrays under `subtrees` of checkpoint `step`'s state (`metadata`: its tree, when the caller has it)."""
    metadata = manager.item_metadata(step)["state"].tree if metadata is None else metadata
    for path in subtrees:
        _subtree(metadata, path, f"{manager.directory}/{step}")
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    item = _selection(metadata, list(subtrees), lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding))
    restore_args = jax.tree.map(lambda _: ocp.ArrayRestoreArgs(sharding=sharding), item)
    state = ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
    return manager.restore(step, args=ocp.args.Composite(state=state))["state"]


def unreadable(directory: str | Path, step: int) -> str | None:
    """None when every item of checkpoint `step` (each array of its state, its data and meta) reads back, else why
    not, in one line: what `gpt1-jax verify --record-missing` asks before it trusts a checkpoint saved without
    digests, which recorded the digests of a save cut short (a file truncated to 5 bytes) and every later read
    of it ended in an orbax traceback."""
    try:
        with _reader(Path(directory)) as manager:
            metadata = manager.item_metadata(step)["state"].tree
            # One array at a time: a failed read of the whole tree left orbax's other reads pending, and each
            # printed a traceback at exit.
            for keys, _ in jax.tree_util.tree_flatten_with_path(metadata)[0]:
                _read_state(manager, step, [tuple(getattr(k, "key", getattr(k, "idx", None)) for k in keys)], metadata)
            manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
    except Exception as e:  # noqa: BLE001 - whatever orbax or tensorstore raises, the answer is "cannot be read"
        while (e.__cause__ or e.__context__) is not None:  # orbax wraps tensorstore's error in a generic Exception
            e = e.__cause__ or e.__context__
        return f"{type(e).__name__}: {orbax_error_line(e)}"
    return None


def orbax_error_line(e: BaseException) -> str:
    """One line of an error orbax or tensorstore raised while reading: its first line, without the page of
    tensorstore's JSON spec that follows it (`unreadable`; gpt1_jax/weights.py's reader of convert --to jax folders)."""
    if not str(e) and not getattr(e, "strerror", None):
        return type(e).__name__
    return re.split(r" \[tensorstore_spec=|\. See full TensorStore details", _os_reason(e))[0]
