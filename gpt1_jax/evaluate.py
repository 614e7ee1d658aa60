"""LM loss and perplexity: the evaluation used during pre-training and by `gpt1-jax evaluate`."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path


def lm_loss(trainer, params, batches, max_batches: int = 0) -> tuple[float, float]:
    """(token-weighted mean LM loss, tokens) over (up to max_batches of) an iterator; padding weighs 0."""
    total, weight = 0.0, 0.0
    for i, batch in enumerate(batches):
        if max_batches and i >= max_batches:
            break
        loss_sum, weight_sum, _ = trainer.eval_sums(params, trainer.put_batch(batch, train=False))
        total, weight = total + float(loss_sum), weight + float(weight_sum)
    return total / max(weight, 1.0), weight


def evaluate_workdir(workdir: str | Path, *, data: str | None = None, step: int | None = None,
                     batch_size: int | None = None, max_batches: int = 0, overrides=()) -> dict:
    """A pre-training run's checkpoint (latest, or `step`) on its own validation split or on every window
    of another text source `data`, tokenised with the run's tokenizer."""
    import numpy as np

    from gpt1_jax.checkpoint import latest_step
    from gpt1_jax.config import PretrainConfig, apply_overrides, load_yaml
    from gpt1_jax.data.pipeline import BatchIterator, build_pipeline
    from gpt1_jax.step import lm_trainer
    from gpt1_jax.errors import WorkdirError
    from gpt1_jax.weights import load_pretrained
    from gpt1_jax.workdir import read as workdir_identity

    workdir = Path(workdir)
    held = workdir_identity(workdir) if workdir.is_dir() else None
    if held is None or not (workdir / "config.yaml").is_file():
        raise FileNotFoundError(f"{workdir} is not a pre-training workdir (no config.yaml)")
    if held.kind != "pretrain":
        raise WorkdirError(f"{workdir} holds {held.describe()}, not a pre-training run: evaluate measures a "
                           f"pre-training checkpoint's LM loss; this run's dev scores are in {workdir / 'results.json'}")
    config = apply_overrides(load_yaml(PretrainConfig, workdir / "config.yaml"), list(overrides))
    step = step if step is not None else latest_step(workdir / "checkpoints")
    model_config, params = load_pretrained(workdir, config.model, step=step)
    trainer = lm_trainer(model_config, config.optim, config.mesh)
    params = trainer.place_params(params)
    data_config = dataclasses.replace(config.data, progress=False,
                                      global_batch_size=batch_size or config.data.global_batch_size)
    if data is None:  # the run's held-out windows
        batches, split = build_pipeline(data_config, workdir).val_iter(), "validation split"
    else:
        pipeline = build_pipeline(dataclasses.replace(data_config, source=data, tokenizer=str(workdir / "tokenizer.json"),
                                                      val_fraction=0.0), workdir)
        batches = BatchIterator(pipeline.windows, np.arange(len(pipeline.windows)), data_config.global_batch_size,
                                shuffle=False, repeat=False, pad_last=True)
        split = "all windows"
    loss, n_tokens = lm_loss(trainer, params, batches, max_batches)
    return {"workdir": str(workdir), "step": step, "data": data or config.data.source,
            "split": split, "tokens": int(n_tokens), "loss": loss, "perplexity": math.exp(min(loss, 50.0))}

