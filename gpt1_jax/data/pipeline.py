"""Packing, train/validation split and the deterministic, resumable, per-process batch iterator.

Packing: the token stream (documents joined by the end-of-document id, see ``tokens.py``) is cut
into contiguous windows of ``seq_len + 1`` tokens, as GPT-1 trained on contiguous 512-token
sequences. Window ``w`` covers tokens ``[w*seq_len, (w+1)*seq_len]``: consecutive windows share one
token (the last target of one is the first input of the next), so every token is an input exactly
once and a target exactly once per epoch; only the tail shorter than a window is unused.

Split: window ``w`` is held out for validation when a seeded 64-bit hash of ``w`` falls below
``val_fraction``. A hash of the window index (rather than "the last X%") keeps validation spread
over the whole corpus, which is ordered by source (books first, then news, ...); it is stable when
the corpus grows at the end, and it needs neither a copy of the stream nor document offsets.
Neighbouring train/validation windows can share a document, a mild optimism of the validation loss
we accept for a sanity metric.

Order: each epoch visits the train windows in the order of a hash of (seed, epoch, position): a
permutation computed with integer arithmetic only, so it is identical on every process, machine
and numpy version, and a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from gpt1_jax.config import DataConfig
from gpt1_jax.data.sources import TextSource, open_source
from gpt1_jax.data.tokens import TokenStream, check_cache_dir, tokenize_to_cache, tokenizer_for
from gpt1_jax.errors import CheckpointFormatError, CheckpointMismatchError, ConfigError
from gpt1_jax.files import user_cache
from gpt1_jax.tokenizer import GPT1Tokenizer

__all__ = [
    "DataConfig",
    "PackedWindows",
    "BatchIterator",
    "DataPipeline",
    "build_pipeline",
    "tokenize_source",
    "split_windows",
    "default_cache_dir",
]

Batch = dict[str, np.ndarray]


def default_cache_dir() -> Path:
    """Shared across runs so a corpus is tokenised once per machine, not once per experiment."""
    return user_cache("tokens")


# --- hashing ---------------------------------------------------------------------------------------
_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), 0x9E3779B97F4A7C15


def _key(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def _hash64(values: np.ndarray, key: int) -> np.ndarray:
    """splitmix64 of (values + key): a fixed, well-mixed uint64 per value; wraps on purpose."""
    z = values.astype(np.uint64) + np.uint64((key * _GOLD) % (1 << 64))
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def split_windows(n_windows: int, val_fraction: float, split_seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) window indices, each ascending. Deterministic in (n_windows, fraction, seed).

    With a positive fraction and at least two windows, validation gets at least one window and
    train keeps at least one, so tiny corpora still produce both splits.
    """
    idx = np.arange(n_windows, dtype=np.int64)
    if val_fraction <= 0 or n_windows < 2:
        return idx, idx[:0]
    u = (_hash64(idx, _key("split", split_seed)) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    is_val = u < val_fraction
    if not is_val.any():
        is_val[np.argmin(u)] = True
    if is_val.all():
        is_val[np.argmax(u)] = False
    return idx[~is_val], idx[is_val]


class PackedWindows:
    """``seq_len + 1``-token windows over a 1-D token array (a memmap is read lazily); `digest`: the tokens'
    sha256, when known (a token cache built before it was recorded has none)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, digest: str | None = None) -> None:
        if tokens.ndim != 1:
            raise ValueError(f"token stream must be 1-D, got shape {tokens.shape}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.digest = digest
        self.n_windows = max(0, (tokens.shape[0] - 1) // seq_len)
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    def __len__(self) -> int:
        return self.n_windows

    def gather(self, windows: np.ndarray) -> np.ndarray:
        """int32 array (len(windows), seq_len + 1); one fancy-index read from the memmap."""
        starts = np.asarray(windows, dtype=np.int64) * self.seq_len
        # Sorted reads walk the file forwards (page cache friendly); rows are put back after.
        order = np.argsort(starts, kind="stable")
        rows = np.empty((starts.size, self.seq_len + 1), dtype=np.int32)
        rows[order] = self.tokens[starts[order, None] + self._offsets]
        return rows


def check_process_share(global_batch_size: int, process_count: int) -> None:
    """Each process reads rows of its own, an equal share of every global batch (BatchIterator): a batch the
    processes do not divide is refused. Jobs ask before reading any data (`gpt1-jax evaluate` refused only once
    its text was tokenized)."""
    if global_batch_size % process_count:
        raise ConfigError(f"global batch {global_batch_size} is not divisible by the {process_count} processes (each "
                          f"reads an equal share of every batch): give a batch size that is a multiple of {process_count}")


class BatchIterator:
    """Batches ``{"inputs", "targets": int32[b, T], "weights": float32[b, T]}`` for one process.

    Global batch ``i`` of an epoch holds windows ``order[i*B:(i+1)*B]``; this process gets rows
    ``[pid*B/P, (pid+1)*B/P)`` of it, so P processes together produce exactly the batches of one.
    ``weights`` is 1 everywhere except rows padding the last validation batch (``pad_last``).
    The position is ``state()`` (a small JSON-able dict) and ``restore(state)`` resumes exactly.
    """

    def __init__(
        self,
        windows: PackedWindows,
        indices: np.ndarray,
        global_batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        repeat: bool = True,
        pad_last: bool = False,
        process_index: int | None = None,
        process_count: int | None = None,
    ) -> None:
        if process_index is None or process_count is None:
            process_index = jax.process_index() if process_index is None else process_index
            process_count = jax.process_count() if process_count is None else process_count
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index {process_index} not in [0, {process_count})")
        check_process_share(global_batch_size, process_count)
        self.windows = windows
        self.indices = np.asarray(indices, dtype=np.int64)
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.repeat = repeat
        self.pad_last = pad_last
        self.process_index = process_index
        self.process_count = process_count
        self.local_batch_size = global_batch_size // process_count
        n = self.indices.size
        self.batches_per_epoch = -(-n // global_batch_size) if pad_last else n // global_batch_size
        if self.batches_per_epoch == 0:
            raise ConfigError(
                f"only {n} window{'s' * (n != 1)} of {windows.seq_len + 1} tokens, fewer than global_batch_size "
                f"{global_batch_size}: use a bigger corpus, a smaller batch or a shorter seq_len"
            )
        self._epoch = 0
        self._index = 0
        self._order_epoch = -1
        self._order = self.indices

    # position -------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Where the next batch comes from, plus what must match for a restore to be exact."""
        return {
            "epoch": self._epoch,
            "index": self._index,
            "seed": self.seed,
            "windows": int(self.indices.size),
            "global_batch_size": self.global_batch_size,
            **({"tokens_sha256": self.windows.digest} if self.windows.digest else {}),
        }

    def restore(self, state: dict[str, Any]) -> None:
        named = {"seed": "data.seed", "windows": "training windows", "global_batch_size": "data.global_batch_size"}
        for k, what in named.items():
            if k in state and int(state[k]) != self.state()[k]:
                why = " (another corpus, tokenizer, seq_len or val_fraction than the run began with)" if k == "windows" else ""
                raise CheckpointMismatchError(
                    f"the checkpoint was saved with {what} {state[k]}, this run's data has {self.state()[k]}{why}: "
                    "resuming would not continue its batches; repeat the run's own data flags, or choose another --workdir"
                )
        if state.get("tokens_sha256") and self.windows.digest and state["tokens_sha256"] != self.windows.digest:
            raise CheckpointMismatchError(
                "the checkpoint was saved on other tokens than this run's data gives (the corpus's files changed, or a "
                "relative path now names another file: it is read from the folder the command runs in): resuming would "
                "not continue its batches; give the run's own corpus, or choose another --workdir")
        epoch, index = int(state["epoch"]), int(state["index"])
        if epoch < 0 or not 0 <= index <= self.batches_per_epoch:
            raise CheckpointFormatError(f"data state out of range: epoch={epoch} index={index}")
        self._epoch, self._index = epoch, index

    @property
    def epoch(self) -> int:
        return self._epoch

    # order ----------------------------------------------------------------------------------------
    def epoch_order(self, epoch: int) -> np.ndarray:
        """The window indices of ``epoch`` in visiting order (the same on every process)."""
        if not self.shuffle:
            return self.indices
        if self._order_epoch != epoch:
            pos = np.arange(self.indices.size, dtype=np.int64)
            perm = np.argsort(_hash64(pos, _key("order", self.seed, epoch)), kind="stable")
            self._order, self._order_epoch = self.indices[perm], epoch
        return self._order

    # iteration ------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self._index >= self.batches_per_epoch:
            if not self.repeat:
                raise StopIteration
            self._epoch += 1
            self._index = 0
        order = self.epoch_order(self._epoch)
        B, b = self.global_batch_size, self.local_batch_size
        lo = self._index * B + self.process_index * b
        rows = order[lo : lo + b]  # short (or empty) only in a padded last batch
        self._index += 1
        return self._make_batch(rows, b)

    def _make_batch(self, rows: np.ndarray, b: int) -> Batch:
        T = self.windows.seq_len
        tokens = np.zeros((b, T + 1), dtype=np.int32)
        weights = np.zeros((b, T), dtype=np.float32)
        if rows.size:
            tokens[: rows.size] = self.windows.gather(rows)
            weights[: rows.size] = 1.0
        # Contiguous copies: device transfers of strided views would copy anyway, less predictably.
        inputs, targets = np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])
        return {"inputs": inputs, "targets": targets, "weights": weights}


@dataclass
class DataPipeline:
    """Everything between a source spec and batches; build with :func:`build_pipeline`."""

    config: DataConfig
    source: TextSource
    tokenizer: GPT1Tokenizer
    stream: TokenStream
    windows: PackedWindows
    train_indices: np.ndarray
    val_indices: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    def train_iter(
        self, process_index: int | None = None, process_count: int | None = None, global_batch_size: int | None = None
    ) -> BatchIterator:
        """Endless, reshuffled every epoch; restore its ``state()`` to resume."""
        batch = global_batch_size or self.config.global_batch_size
        if 0 < self.train_indices.size < batch <= len(self.windows):  # the corpus would do: the held-out share is why
            raise ConfigError(f"data.val_fraction={self.config.val_fraction} holds out {self.val_indices.size} of the "
                              f"corpus's {len(self.windows)} windows, leaving {self.train_indices.size} to train on, fewer "
                              f"than one batch of {batch}: lower data.val_fraction")
        return BatchIterator(self.windows, self.train_indices, batch, seed=self.config.seed,
                             process_index=process_index, process_count=process_count)

    def val_iter(
        self, process_index: int | None = None, process_count: int | None = None, global_batch_size: int | None = None
    ) -> BatchIterator:
        """One pass over every validation window in order; the last batch padded (weights 0)."""
        if self.val_indices.size == 0:
            raise ConfigError("no validation windows (val_fraction is 0 or the corpus has one window)")
        return BatchIterator(
            self.windows,
            self.val_indices,
            global_batch_size or self.config.global_batch_size,
            shuffle=False,
            repeat=False,
            pad_last=True,
            process_index=process_index,
            process_count=process_count,
        )


def unigram_loss(pipeline: DataPipeline, chunk: int = 4096) -> float:
    """Cross-entropy (nats/token) on the validation targets of the training targets' token frequencies (add-one
    smoothed): what a model that ignores its context reaches. Post-LN GPT-1 can sit on this plateau early in
    training (docs/gpt1.md, "The unigram plateau"), so a run whose loss stays there did not train."""
    counts = np.ones(pipeline.tokenizer.vocab_size, np.float64)
    for first in range(0, pipeline.train_indices.size, chunk):
        targets = pipeline.windows.gather(pipeline.train_indices[first:first + chunk])[:, 1:]
        counts += np.bincount(targets.ravel(), minlength=counts.size)[:counts.size]
    log_p = np.log(counts / counts.sum())
    total, n = 0.0, 0
    for first in range(0, pipeline.val_indices.size, chunk):
        targets = pipeline.windows.gather(pipeline.val_indices[first:first + chunk])[:, 1:]
        total, n = total - float(log_p[targets].sum()), n + targets.size
    if n == 0:
        raise ConfigError("no validation windows (val_fraction is 0 or the corpus has one window)")
    return total / n


def tokenize_source(config: DataConfig, workdir: str | Path | None) -> tuple[TextSource, GPT1Tokenizer, TokenStream]:
    """Open the source, get the tokenizer (trained once into ``workdir``), tokenise once (cached).

    What ``pretrain`` does before packing, and all ``gpt1-jax tokenize`` does: the same cache key, so
    a cache built ahead of a job is the one the job reads.
    """
    if workdir is None and config.tokenizer == "train":
        raise ConfigError("data.tokenizer=train needs a workdir to keep the trained tokenizer.json in")
    cache_dir = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir()
    check_cache_dir(cache_dir, workdir)  # before the BPE is trained, the corpus read or a cache written
    source = open_source(config.source)
    tokenizer = tokenizer_for(source, workdir or ".", config.vocab_size, config.tokenizer, progress=config.progress,
                              wait_s=config.cache_wait_s, cache_dir=cache_dir)
    stream = tokenize_to_cache(source, tokenizer, cache_dir, progress=config.progress, wait_s=config.cache_wait_s)
    return source, tokenizer, stream


def build_pipeline(config: DataConfig, workdir: str | Path) -> DataPipeline:
    """Tokenise (:func:`tokenize_source`), pack, split."""
    source, tokenizer, stream = tokenize_source(config, workdir)
    windows = PackedWindows(stream.tokens, config.seq_len, stream.meta.get("tokens_sha256"))
    train, val = split_windows(len(windows), config.val_fraction, config.split_seed)
    info = {
        "source": config.source,
        "tokens": len(stream),
        "documents": stream.meta.get("n_docs"),
        "vocab_size": tokenizer.vocab_size,
        "eod_id": stream.meta.get("eod_id"),
        "tokens_sha256": stream.meta.get("tokens_sha256"),
        "windows": len(windows),
        "train_windows": int(train.size),
        "val_windows": int(val.size),
        "cache": str(stream.path),
    }
    return DataPipeline(config, source, tokenizer, stream, windows, train, val, info)
