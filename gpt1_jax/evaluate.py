"""LM loss and perplexity: the evaluation used during pre-training and by `gpt1-jax evaluate`."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import jax
import numpy as np

from gpt1_jax.attention import check_runnable as check_attention
from gpt1_jax.config import MeshConfig, PretrainConfig
from gpt1_jax.data.pipeline import BatchIterator, build_pipeline, check_process_share
from gpt1_jax.errors import ConfigError, DataError, WorkdirError
from gpt1_jax.metrics import Bar
from gpt1_jax.sharding import batch_divisor, batch_rows_shared_by_processes, make_mesh
from gpt1_jax.step import lm_trainer
from gpt1_jax.workdir import DATA_INFO_FIX, read_record
from gpt1_jax.workdir import read as workdir_identity


def split_rows(mesh, rows: int) -> int:
    """The rows a process's batch of `rows` is padded to for the data x fsdp devices of `mesh` to split it evenly
    (`rows` itself where they do): an evaluation's batch is the run's, and the mesh it falls back to
    (mesh_here: every device here, data-parallel) may not divide it, e.g. a batch of 8 over 3 devices."""
    processes = jax.process_count()
    multiple = math.lcm(batch_divisor(mesh), processes)
    return -(-rows * processes // multiple) * multiple // processes


def padded(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """`batch` with rows of zeros after its own up to `rows`: their weights are 0, so a loss counts them for
    nothing (as pad_last's rows in the last batch)."""
    have = next(iter(batch.values())).shape[0]
    return batch if have >= rows else {
        k: np.concatenate([v, np.zeros((rows - have, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}


def eval_batch(trainer, batch: dict[str, np.ndarray]):
    """A process's rows of an evaluation batch -> on the devices, padded for the mesh to split them."""
    return trainer.put_batch(padded(batch, split_rows(trainer.mesh, next(iter(batch.values())).shape[0])), train=False)


def lm_loss(trainer, params, batches, max_batches: int = 0, *, progress: bool = False) -> tuple[float, float]:
    """(token-weighted mean LM loss, tokens) over (up to max_batches of) an iterator; padding weighs 0, and a batch
    the mesh's devices cannot split evenly is padded so they can (the same loss as on one device).
    `progress`: a bar of batches on stderr (`gpt1-jax evaluate`; not inside training, which has its own)."""
    total, weight = 0.0, 0.0
    count = getattr(batches, "batches_per_epoch", None)  # a BatchIterator that does not repeat: one pass
    count = min(count, max_batches) if count and max_batches else count or max_batches or None
    with Bar(total=count, desc="evaluate", unit="batch", disable=not progress, file=sys.stderr, dynamic_ncols=True,
              mininterval=0.5) as bar:
        for i, batch in enumerate(batches):
            if max_batches and i >= max_batches:
                break
            loss_sum, weight_sum, _ = trainer.eval_sums(params, eval_batch(trainer, batch))
            total, weight = total + float(loss_sum), weight + float(weight_sum)
            bar.update(1)
    return total / max(weight, 1.0), weight


def pretraining_run(source: Path, *, required: bool) -> bool:
    """Whether `source` is a pre-training run's workdir, whose saved config and validation split are then
    what it is evaluated with. `required` (`--workdir`): anything else is one error saying what it holds."""
    held = workdir_identity(source) if source.is_dir() else None
    if not required:  # a gpt1-jax checkpoint folder has a config.yaml too, but no checkpoints/
        return held is not None and held.kind == "pretrain" and (source / "checkpoints").is_dir()
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist: give a pre-training run's workdir")
    if held is None or not (source / "config.yaml").is_file():
        raise FileNotFoundError(f"{source} is not a pre-training workdir (it holds no run)")
    if held.kind != "pretrain":
        raise WorkdirError(f"{source} holds {held.describe()}, not a pre-training run: evaluate measures a "
                           f"pre-training checkpoint's LM loss; this run's dev scores are in {source / 'results.json'}")
    return True


def perplexity(loss: float) -> float:
    """exp(loss), inf where a float cannot hold it (it was capped at exp(50) without a word)."""
    return math.inf if loss >= 700 else math.exp(loss)  # a NaN loss stays NaN


def check_same_tokens(run: Path, digest: str | None) -> None:
    """Refuses to score a run on another text than it trained on: its corpus path, read again, may name another
    file now (a relative path, from another folder) or edited files. Runs and caches from before the digest
    was kept are not compared."""
    info = run / "data_info.json"
    trained_on = read_record(info, DATA_INFO_FIX).get("tokens_sha256") if info.is_file() else None
    if trained_on and digest and trained_on != digest:
        raise DataError(f"{run}'s corpus gives other tokens now than the run trained on (its files changed, or a "
                        "relative path names another file from this folder): its validation split would be another "
                        "text's; run evaluate from the folder the run was started in, or pass --data")


def mesh_here(mesh: MeshConfig) -> MeshConfig:
    """The run's mesh where it fits the devices here, else data-parallel over all of them (said once): a loss reads
    the same on any mesh, and a run trained on 8 devices (or a tensor-only mesh, which several processes cannot
    split a batch over) was refused on a laptop's 1, with --mesh refused too."""
    try:
        devices = make_mesh(mesh)
        fits = not (jax.process_count() > 1 and batch_rows_shared_by_processes(devices))
    except ConfigError:
        fits = False
    if fits:
        return mesh
    if jax.process_index() == 0:
        n = jax.device_count()
        print(f"gpt1-jax: evaluating data-parallel over the {n} device{'s' if n > 1 else ''} here (the run's mesh "
              f"{mesh.spec()} does not fit them)", file=sys.stderr, flush=True)
    return MeshConfig(rules=mesh.rules)


def evaluate(config: PretrainConfig, params, *, run: Path | None, data: str | None, tokenizer: str,
             max_batches: int = 0, progress: bool = False) -> dict:
    """LM loss and perplexity of `params` (a model of `config.model`) on every `config.data.seq_len` window of
    the text source `data`, tokenised by `tokenizer` (a path), or, with `data` None, on the validation split
    of the pre-training run `run`, cut as its config cuts it. Batches of `config.data.global_batch_size`
    over `config.mesh`. `progress`: bars of the tokenizing (a text not tokenized before) and of the batches on
    process 0."""
    # before the pipeline: each process tokenized the text (minutes for a corpus) before it found this
    check_process_share(config.data.global_batch_size, jax.process_count())
    check_attention(config.model.attention, config.model.attn_dropout, False, config.model.head_dim)
    trainer = lm_trainer(config.model, config.optim, mesh_here(config.mesh))
    params = trainer.place_params(params)
    speaks = progress and jax.process_index() == 0
    # as pre-training shows it: tokenizing a corpus the cache lacks takes minutes
    data_config = dataclasses.replace(config.data, progress=config.data.progress and speaks)
    if data is None:  # the run's held-out windows
        pipeline = build_pipeline(data_config, run)
        check_same_tokens(run, pipeline.windows.digest)
        batches, split = pipeline.val_iter(), "validation split"
    else:
        pipeline = build_pipeline(dataclasses.replace(data_config, source=data, tokenizer=tokenizer, val_fraction=0.0),
                                  run)
        if not len(pipeline.windows):
            raise DataError(f"--data {data}: {len(pipeline.stream)} tokens, not one window of {data_config.seq_len} + 1: "
                            "pass a smaller --seq-len, or more text")
        # A text of fewer windows than a batch is one batch of its own size (a process's share each), not the run's
        # batch padded: evaluating a paragraph on 117M computed 64 rows for 2.
        processes = jax.process_count()
        rows = min(data_config.global_batch_size, -(-len(pipeline.windows) // processes) * processes)
        batches = BatchIterator(pipeline.windows, np.arange(len(pipeline.windows)), rows, shuffle=False, repeat=False,
                                pad_last=True)
        split = "all windows"
    loss, n_tokens = lm_loss(trainer, params, batches, max_batches, progress=speaks)
    return {"data": data or config.data.source, "split": split, "seq_len": data_config.seq_len,
            "tokens": int(n_tokens), "loss": loss, "perplexity": perplexity(loss)}
