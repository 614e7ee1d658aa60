"""Throughput of the data pipeline, as JSON lines: ``python -m gpt1_jax.data --source ... --workdir ...``.

Reports each stage separately (tokenizer training, tokenisation into the cache, the batch iterator
alone) with wall and CPU seconds: on a shared machine wall time alone hides contention; and the CPU's flags
beside them (gpt1_jax/flops.py), as every speed number of the project.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gpt1_jax.arguments import Parser, at_least
from gpt1_jax.data.pipeline import BatchIterator, DataConfig, PackedWindows, default_cache_dir, split_windows
from gpt1_jax.data.sources import open_source
from gpt1_jax.data.tokens import tokenize_to_cache, tokenizer_for
from gpt1_jax.flops import cpu_flags

T = TypeVar("T")


def _timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    t0, c0 = time.perf_counter(), os.times()
    out = fn()
    c1 = os.times()
    return out, time.perf_counter() - t0, (c1.user - c0.user) + (c1.system - c0.system)


def benchmark_iterator(it: BatchIterator, n_batches: int = 200, warmup: int = 5) -> dict[str, Any]:
    """Tokens/s of ``next(it)`` alone (no model): the rate the input pipeline can sustain."""
    for _ in range(warmup):
        next(it)

    def run() -> int:
        n = 0
        for _ in range(n_batches):
            n += next(it)["inputs"].size
        return n

    tokens, wall, cpu = _timed(run)
    return {
        "stage": "iterator",
        "batches": n_batches,
        "local_batch": it.local_batch_size,
        "seq_len": it.windows.seq_len,
        "tokens": tokens,
        "seconds": round(wall, 4),
        "cpu_seconds": round(cpu, 4),
        "tokens_per_s": round(tokens / wall),
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = Parser(prog="python -m gpt1_jax.data", description=__doc__, allow_abbrev=False)
    ap.add_argument("--source", default="default")
    ap.add_argument("--workdir", required=True, help="where a trained tokenizer.json is kept")
    ap.add_argument("--tokenizer", default="train")
    ap.add_argument("--vocab-size", type=int, default=40478)
    ap.add_argument("--cache-dir", default=None, help="token cache (a fresh one forces re-tokenising)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=at_least(1), default=200)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    cfg = DataConfig(
        source=args.source,
        seq_len=args.seq_len,
        global_batch_size=args.batch_size,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        cache_dir=args.cache_dir,
        progress=not args.no_progress,
    )

    source, flags = open_source(cfg.source), cpu_flags()
    tok, wall, cpu = _timed(lambda: tokenizer_for(source, args.workdir, cfg.vocab_size, cfg.tokenizer, cfg.progress))
    print(json.dumps({"stage": "tokenizer", "vocab_size": tok.vocab_size, "seconds": round(wall, 3),
                      "cpu_seconds": round(cpu, 3), "cpu_flags": flags}), flush=True)

    cache_dir = cfg.cache_dir or default_cache_dir()
    stream, wall, cpu = _timed(lambda: tokenize_to_cache(source, tok, cache_dir, progress=cfg.progress))
    print(json.dumps({"stage": "tokenize", "source": cfg.source, "tokens": len(stream),
                      "documents": stream.meta["n_docs"], "from_cache": stream.from_cache,
                      "seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
                      "tokens_per_s": round(len(stream) / wall), "cache": str(stream.path), "cpu_flags": flags}),
          flush=True)

    windows = PackedWindows(stream.tokens, cfg.seq_len)
    train, _ = split_windows(len(windows), cfg.val_fraction, cfg.split_seed)
    it = BatchIterator(windows, train, cfg.global_batch_size, seed=cfg.seed, process_index=0, process_count=1)
    print(json.dumps({**benchmark_iterator(it, args.batches), "cpu_flags": flags}), flush=True)


if __name__ == "__main__":
    main()
