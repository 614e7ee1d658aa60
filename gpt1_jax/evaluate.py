"""`gpt1-jax evaluate --workdir DIR --data SOURCE`: LM loss and perplexity of a run's latest checkpoint on
every window of any text source (tokenised with the run's own tokenizer). Prints one JSON line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True, help="a pre-training run directory")
    p.add_argument("--data", default=None, help="text source (default: the run's own validation split)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per batch (default: the run's)")
    p.add_argument("--max-batches", type=int, default=0, help="stop after this many batches (0: all)")
    p.add_argument("--simulate-devices", type=int, default=None, metavar="N", help="N fake CPU devices")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides (e.g. data.cache_dir=...)")


def main(args: argparse.Namespace) -> int:
    import numpy as np

    from gpt1_jax.data.pipeline import BatchIterator, build_pipeline
    from gpt1_jax.pretrain import evaluate_loss, load_run

    workdir = Path(args.workdir)
    config, trainer, params, step = load_run(workdir, args.step, overrides=args.set)
    data = config.data
    if args.batch_size:
        data = dataclasses.replace(data, global_batch_size=args.batch_size)
    if args.data is None:  # the run's held-out windows
        pipeline = build_pipeline(dataclasses.replace(data, progress=False), workdir)
        batches, split = pipeline.val_iter(), "validation split"
    else:
        tokenizer_file = str(workdir / "tokenizer.json")
        pipeline = build_pipeline(dataclasses.replace(data, source=args.data, tokenizer=tokenizer_file,
                                                      val_fraction=0.0), workdir)
        every = np.arange(len(pipeline.windows))
        batches = BatchIterator(pipeline.windows, every, data.global_batch_size, shuffle=False, repeat=False,
                                pad_last=True)
        split = "all windows"
    loss, n_tokens = evaluate_loss(trainer, params, batches, args.max_batches)
    print(json.dumps({"workdir": str(workdir), "step": step, "data": args.data or config.data.source, "split": split,
                      "tokens": int(n_tokens), "loss": loss, "perplexity": math.exp(min(loss, 50.0))}))
    return 0
