"""Checkpoints through orbax's CheckpointManager: train state, data-iterator position and run metadata.

Layout under `<workdir>/checkpoints/<step>/`: `state` (params + optimizer state + step, every process
writing its own shards), `data` (JSON: the batch source's position and the loop hooks' state) and `meta` (the model config and what
wrote it). Saves are asynchronous and land in a temporary folder renamed on completion, so a run
killed mid-save keeps its previous checkpoint intact (docs/stack.md). Restoring takes the *target*
shardings, so a checkpoint written on one mesh restores onto any other.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import jax
import orbax.checkpoint as ocp

from gpt1_jax.config import ModelConfig
from gpt1_jax.errors import CheckpointFormatError, CheckpointMismatchError


class Checkpointer:
    """Saves every `save_every` steps (and at the steps in `keep_steps`), keeps the newest `keep` plus
    every step in `keep_steps` for good (e.g. log-spaced snapshots for curves over training)."""

    def __init__(self, directory: str | Path, *, keep: int = 3, save_every: int = 0, keep_steps=(), async_save: bool = True):
        from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

        self.directory = Path(directory).absolute()
        self.save_every = save_every
        self.keep_steps = frozenset(int(s) for s in keep_steps)
        policy = pp.LatestN(keep)
        if self.keep_steps:
            policy = pp.AnyPreservationPolicy([policy, pp.CustomSteps(sorted(self.keep_steps))])
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                preservation_policy=policy,
                create=True,
                enable_async_checkpointing=async_save,
                # Leftovers of a save killed mid-way are not checkpoints; sweep them on start-up.
                cleanup_tmp_directories=True,
            ),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def should_save(self, step: int) -> bool:
        return (bool(self.save_every) and step % self.save_every == 0) or step in self.keep_steps

    def save(self, step: int, state: Any, position: dict, model_config: ModelConfig, force: bool = False) -> bool:
        """Train state + `position` (JSON: where the data and the hooks were) + the model's config."""
        if self.manager.latest_step() == step:
            return False  # e.g. the final save right after a periodic one
        meta = {"model": dataclasses.asdict(model_config), "step": int(step)}
        return self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=ocp.args.JsonSave(position),
                meta=ocp.args.JsonSave(meta),
            ),
            force=force,
        )

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
                f"use another --workdir or the same config"
            )

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """-> (state placed on `abstract_state`'s shardings, the position saved with it, step)."""
        step = self.latest_step() if step is None else step
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()),
        )
        return restored["state"], restored["data"], step

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


KeyPath = tuple[str | int, ...]  # dict keys and list indices from the `state` item's root


def _reader(directory: Path) -> ocp.CheckpointManager:
    """A manager that creates and sweeps nothing, with a handler for each item of the layout, so that
    orbax lists, describes and restores without complaints."""
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

    One orbax partial restore reads only those arrays (optimizer moments stay on disk unless asked
    for), at the shapes and dtypes they were saved with, onto the host's first device. The key paths
    follow the saved tree: `("params",)` is a pre-training run's model, `("params", "transformer")` a
    fine-tuning run's, `("opt_state", 1, "z")` a leaf of an optimizer state (tuples are lists)."""
    with _reader(Path(directory)) as manager:
        step = _pick_step(manager, step)
        metadata = manager.item_metadata(step)["state"].tree
        for path in subtrees:
            _subtree(metadata, path, f"{manager.directory}/{step}")
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        item = _selection(metadata, list(subtrees), lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding))
        restore_args = jax.tree.map(lambda _: ocp.ArrayRestoreArgs(sharding=sharding), item)
        state = ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
        restored = manager.restore(step, args=ocp.args.Composite(state=state))["state"]
    return [_subtree(restored, path, str(directory)) for path in subtrees], step
