"""Tokenizer choice and the on-disk token cache (one flat ``.npy`` token stream per source+tokenizer).

End-of-document separator (:func:`eod_id`): every document is followed by one separator id.

* With OpenAI's vocabulary it is ``"\\n</w>"`` (id 40477), the token the original pipeline emits for
  a newline; our documents are paragraphs (blank-line blocks), so this reproduces what GPT-1 saw
  between paragraphs. The "hf" pre-tokeniser turns newlines in text into spaces, so the id never
  occurs inside a document and marks boundaries unambiguously.
* A vocabulary trained with ``GPT1Tokenizer.train`` has no ``"\\n</w>"`` (the normaliser removes
  newlines before training), so the ``_delimiter_`` marker is used instead: like ``\\n</w>`` it is
  never produced by BPE from text, and "separator" is already its meaning in fine-tuning.

Cache: ``cache_dir/tokens-<key>/{tokens.npy, meta.json}`` where ``key`` hashes the source spec, the
source fingerprint (file sizes/mtimes, dataset versions), the tokenizer's serialised form, the
separator id and the dtype. The directory is built under a temporary name and renamed into place,
so a crash never leaves a half-written cache that looks complete. ``meta.json`` records who built it.

Built once (:mod:`gpt1_jax.data.once`): in a multi-process job process 0 tokenises and the others
wait (up to ``data.cache_wait_s``) for the finished directory; a lock file beside it
(``.tokens-<key>.lock``, kept alive by a heartbeat) keeps separate jobs sharing a cache directory
from tokenising twice, and a dead builder's lock goes stale instead of blocking everyone. A host
that cannot see process 0's cache (its disk is not shared) fails with one line saying so; put
``data.cache_dir`` on a shared disk, or build the cache ahead of the job with ``gpt1-jax tokenize``.
A BPE trained on the corpus (``data.tokenizer=train``) is trained once the same way: process 0
trains it into the workdir, the others wait for ``tokenizer.json`` there.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpt1_jax.data.once import LOCK_STALE_S, Peers, build_once
from gpt1_jax.data.sources import TextSource
from gpt1_jax.errors import ConfigError, DataError
from gpt1_jax.tokenizer import GPT1Tokenizer

__all__ = [
    "TokenStream",
    "eod_id",
    "token_dtype",
    "tokenizer_hash",
    "tokenizer_for",
    "tokenize_to_cache",
    "encode_documents",
]

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the layout or the packing of the stream changes
_CHUNK_CHARS = 1 << 20  # text per encode_batch call: big enough to keep both Rust threads busy
TOKENIZER_FILE = "tokenizer.json"
DEFAULT_WAIT_S = 3600.0  # = DataConfig.cache_wait_s: process 0 tokenising ~1B tokens takes tens of minutes


def _say(line: str) -> None:
    """A waiting host says once why it is idle: silence for minutes on a pod looks like a hang."""
    print(f"gpt1-jax: {line}", file=sys.stderr, flush=True)


def eod_id(tokenizer: GPT1Tokenizer) -> int:
    """The id appended after every document (see the module docstring for why this one)."""
    newline = tokenizer.token_to_id("\n</w>")
    return newline if newline is not None else tokenizer.delimiter_id


def token_dtype(vocab_size: int) -> np.dtype:
    # uint16 halves the cache and the page-cache footprint for GPT-1's 40k vocabulary.
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def tokenizer_hash(tokenizer: GPT1Tokenizer) -> str:
    """Hash of the serialised tokenizer: identical vocab/merges/normaliser give the same key."""
    h = hashlib.sha256(tokenizer.mode.encode())
    h.update(tokenizer.backend.to_str().encode())
    return h.hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of one (a unique temporary name: safe with
    several processes writing the same file)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def tokenizer_for(
    source: TextSource,
    workdir: str | Path,
    vocab_size: int = 40478,
    tokenizer: str = "train",
    progress: bool = False,
    wait_s: float = DEFAULT_WAIT_S,
) -> GPT1Tokenizer:
    """The tokenizer for a run.

    ``tokenizer`` is ``"train"`` (train a BPE on ``source`` once and keep it as
    ``workdir/tokenizer.json``; later calls load that file; in a multi-process job process 0 trains
    and the others wait up to ``wait_s`` for the file), a path to a tokenizer JSON saved by
    ``GPT1Tokenizer.save``, or a directory holding OpenAI's ``encoder_bpe_40000.json`` and
    ``vocab_40000.bpe``.
    """
    if tokenizer != "train":
        tok = GPT1Tokenizer.from_path(tokenizer)
        if tok is None:
            raise FileNotFoundError(f"tokenizer {tokenizer!r}: expected 'train', a tokenizer .json or a vocab directory")
        return tok

    workdir = Path(workdir)
    path = workdir / TOKENIZER_FILE
    # No lock file: it would be written in the workdir before the corpus is read. Separate jobs do
    # not share a workdir; the processes of one job are ordered by process 0 alone.
    return build_once(
        ready=path.is_file,
        build=lambda: _train_tokenizer(source, workdir, vocab_size, progress),
        load=lambda: _load_trained(source, workdir, vocab_size),
        key=f"tokenizer:{workdir}",
        what="the BPE tokenizer",
        path=path,
        wait_s=wait_s,
        remedy="put the workdir on a disk every host shares, or train it ahead (`gpt1-jax tokenize --tokenizer "
               "train --workdir DIR ...` on one host) and set data.tokenizer to a copy of DIR/tokenizer.json "
               "every host can read",
        on_wait=_say if progress else None,
    )


def _load_trained(source: TextSource, workdir: Path, vocab_size: int) -> GPT1Tokenizer:
    path, meta_path = workdir / TOKENIZER_FILE, workdir / "tokenizer.meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("vocab_size") != vocab_size:
            raise ConfigError(
                f"{path} was trained with vocab_size={meta.get('vocab_size')}, not {vocab_size}: "
                "use another workdir or delete the file to retrain"
            )
        if meta.get("source") != source.spec:
            # Reusing is what resuming with a new corpus wants; say so rather than fail.
            log.warning("reusing %s trained on %r for source %r", path, meta.get("source"), source.spec)
    return GPT1Tokenizer.load(path)


def _train_tokenizer(source: TextSource, workdir: Path, vocab_size: int, progress: bool) -> GPT1Tokenizer:
    path, meta_path = workdir / TOKENIZER_FILE, workdir / "tokenizer.meta.json"
    log.info("training a %d-token BPE on %s", vocab_size, source.spec)
    # Documents go in as lists (batches): GPT1Tokenizer.train treats a plain string that names an
    # existing file as a file, and Path(doc).is_file() raises on documents with a >255-character
    # line without '/'. tokenizers' trainer accepts lists of strings as batches.
    batches = _chunks(source.documents(), _CHUNK_CHARS)
    tok = GPT1Tokenizer.train(batches, vocab_size=vocab_size, show_progress=progress)
    workdir.mkdir(parents=True, exist_ok=True)  # only now: a corpus that cannot be read leaves nothing behind
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tok.save(tmp)
    atomic_write_text(meta_path, json.dumps({"source": source.spec, "vocab_size": vocab_size}))
    os.replace(tmp, path)  # last: the tokenizer file's presence means "training finished"
    return tok


def _chunks(docs: Iterable[str], max_chars: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for d in docs:
        chunk.append(d)
        size += len(d)
        if size >= max_chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def encode_documents(
    docs: Iterable[str], tokenizer: GPT1Tokenizer, dtype: np.dtype, sep: int, chunk_chars: int = _CHUNK_CHARS
) -> Iterator[tuple[np.ndarray, int]]:
    """(token array, number of documents) per chunk: each document's ids followed by ``sep``."""
    for chunk in _chunks(docs, chunk_chars):
        ids = tokenizer.encode_batch(chunk)
        total = 0
        for row in ids:
            row.append(sep)
            total += len(row)
        # fromiter over a flat chain: one C-level pass, no per-document arrays.
        yield np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=total), len(chunk)


@dataclass(frozen=True)
class TokenStream:
    """The cached token stream of one source under one tokenizer."""

    tokens: np.ndarray  # read-only memmap, 1-D
    path: Path
    meta: dict
    from_cache: bool  # False when this call tokenised the source

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def _cache_key(source: TextSource, tokenizer: GPT1Tokenizer, sep: int, dtype: np.dtype) -> str:
    blob = {
        "format": CACHE_FORMAT,
        "spec": source.spec,
        "source": source.fingerprint(),
        "tokenizer": tokenizer_hash(tokenizer),
        "sep": sep,
        "dtype": dtype.str,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:24]


def _open(path: Path, from_cache: bool) -> TokenStream:
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    tokens = np.load(path / "tokens.npy", mmap_mode="r")
    return TokenStream(tokens=tokens, path=path, meta=meta, from_cache=from_cache)


def tokenize_to_cache(
    source: TextSource,
    tokenizer: GPT1Tokenizer,
    cache_dir: str | Path,
    progress: bool = True,
    wait_s: float = DEFAULT_WAIT_S,
    stale_s: float = LOCK_STALE_S,
) -> TokenStream:
    """Tokenise ``source`` into ``cache_dir`` unless an up-to-date cache exists; memory-map it.

    Several processes asking at once tokenise it once (module docstring); a process that waits longer
    than ``wait_s`` for another to finish raises a one-line DataError. ``stale_s``: how long a lock's
    heartbeat may stand still before its builder counts as dead.
    """
    cache_dir = Path(cache_dir)
    sep = eod_id(tokenizer)
    dtype = token_dtype(tokenizer.vocab_size)
    key = _cache_key(source, tokenizer, sep, dtype)
    final = cache_dir / f"tokens-{key}"
    peers = Peers.current()

    if peers.builds and not (final / "tokens.npy").is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)  # the lock lives there
    return build_once(
        ready=(final / "tokens.npy").is_file,
        build=lambda: _build_cache(source, tokenizer, final, sep, dtype, peers, progress),
        load=lambda: _open(final, from_cache=True),
        key=final.name,
        what=f"the token cache of {source.spec!r}",
        path=final,
        wait_s=wait_s,
        remedy=f"put data.cache_dir on a disk every host shares, or build the cache ahead of the job with "
               f"`gpt1-jax tokenize --data {source.spec} --tokenizer ... --cache-dir {cache_dir}` (on every host "
               f"if their disks are not shared)",
        lock=cache_dir / f".{final.name}.lock",
        peers=peers,
        stale_s=stale_s,
        on_wait=_say if progress else None,
    )


def _build_cache(
    source: TextSource, tokenizer: GPT1Tokenizer, final: Path, sep: int, dtype: np.dtype, peers: Peers, progress: bool
) -> TokenStream:
    """Tokenise into a temporary directory beside ``final``, then rename it into place."""
    from tqdm.auto import tqdm

    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        n_tokens = n_docs = 0
        # The length is unknown until the end, so stream raw ids first and prepend the .npy
        # header afterwards (one sequential copy, cheap next to tokenising).
        raw = tmp / "tokens.bin"
        with open(raw, "wb") as f, tqdm(
            unit="tok", unit_scale=True, desc=f"tokenizing {source.spec}", disable=not progress
        ) as bar:
            for arr, docs in encode_documents(source.documents(), tokenizer, dtype, sep):
                arr.tofile(f)
                n_tokens += arr.size
                n_docs += docs
                bar.update(arr.size)
        if n_tokens == 0:
            raise DataError(f"text source {source.spec!r} has no documents")
        with open(tmp / "tokens.npy", "wb") as out, open(raw, "rb") as f:
            header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n_tokens,)}
            np.lib.format.write_array_header_1_0(out, header)
            shutil.copyfileobj(f, out, 16 << 20)
        raw.unlink()
        meta = {
            "format": CACHE_FORMAT,
            "spec": source.spec,
            "n_tokens": n_tokens,
            "n_docs": n_docs,
            "eod_id": sep,
            "dtype": dtype.str,
            "vocab_size": tokenizer.vocab_size,
            "tokenizer_sha256": tokenizer_hash(tokenizer),
            # Who tokenised it: how a pod job's log shows it was done once, and by whom.
            "built_by": {"host": socket.gethostname(), "pid": os.getpid(), "process_index": peers.index},
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "tokens.npy").is_file():
                raise
            # Another process finished first with identical content (a broken lock's race): use theirs.
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return _open(final, from_cache=False)
