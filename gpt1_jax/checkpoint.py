"""Checkpoints through orbax's CheckpointManager: train state, data-iterator position and run metadata.

Layout under `<workdir>/checkpoints/<step>/`: `state` (params + optimizer state + step, every process
writing its own shards), `data` (JSON: the batch source's position and the loop hooks' state) and `meta` (the model config and what
wrote it). Saves are asynchronous and land in a temporary folder renamed on completion, so a run
killed mid-save keeps its previous checkpoint intact (docs/stack.md). Restoring takes the *target*
shardings, so a checkpoint written on one mesh restores onto any other.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from gpt1_jax.config import ModelConfig
from gpt1_jax.errors import CheckpointMismatchError


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


def restore_params(directory: str | Path, model_config: ModelConfig, step: int | None = None):
    """-> (params, step): only the `params` subtree of a checkpoint's `state` item (an orbax partial
    restore, so optimizer moments are never read), on the host's first device; step None = latest."""
    import flax.linen as nn

    from gpt1_jax.model import init_params

    directory = Path(directory).absolute()
    steps = sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit()) if directory.is_dir() else []
    if not steps:
        raise FileNotFoundError(f"{directory}: no checkpoint")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise FileNotFoundError(f"{directory}: no checkpoint of step {step} (have {', '.join(map(str, steps))})")
    abstract = nn.meta.unbox(jax.eval_shape(functools.partial(init_params, model_config), jax.random.key(0)))
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), abstract)
    restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=sharding), target)
    with ocp.PyTreeCheckpointer() as ckptr:
        restored = ckptr.restore(
            directory / str(step) / "state",
            args=ocp.args.PyTreeRestore(item={"params": target}, restore_args={"params": restore_args},
                                        partial_restore=True),
        )
    return restored["params"], step
