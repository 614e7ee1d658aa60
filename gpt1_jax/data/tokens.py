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

Kept BPEs: ``cache_dir/bpe-<key>/{tokenizer.json, tokenizer.meta.json}`` (a run folder's pair), ``key`` hashing the source spec and
fingerprint, the vocab size and the tokenizers version. A run in a new workdir on a corpus a BPE was
trained on before (same cache dir) copies that one instead of training again: HF tokenizers' trainer is not
deterministic (the ids of its end-of-word symbols follow a hash map's order, and ties between merges go by
id: huggingface/tokenizers#1794), so two trainings on one corpus give different tokenizers, and two runs
that differ only in their optimizer would not be reading the same tokens.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tokenizers

from gpt1_jax import workdir as run_folder
from gpt1_jax.data.once import LOCK_STALE_S, Peers, build_once
from gpt1_jax.data.sources import FileSource, TextSource
from gpt1_jax.errors import ConfigError, DataError
from gpt1_jax.files import atomic_write_text, staging_folder, sweep_staging_folders, user_cache
from gpt1_jax.metrics import Bar, say
from gpt1_jax.tokenizer import TOKENIZER_META, GPT1Tokenizer, check_recorded_digest

__all__ = [
    "TokenStream",
    "eod_id",
    "token_dtype",
    "tokenizer_hash",
    "tokenizer_for",
    "tokenize_to_cache",
    "encode_documents",
    "check_cache_dir",
]

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the layout or the packing of the stream changes
UNK_WARN = 0.05  # a share of <unk> tokens above this is said when the cache is built
_CHUNK_CHARS = 1 << 20  # text per encode_batch call: big enough to keep both Rust threads busy
TOKENIZER_FILE = "tokenizer.json"
DEFAULT_WAIT_S = 3600.0  # = DataConfig.cache_wait_s: process 0 tokenising ~1B tokens takes tens of minutes


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


def tokenizer_for(
    source: TextSource,
    workdir: str | Path,
    vocab_size: int = 40478,
    tokenizer: str = "train",
    progress: bool = False,
    wait_s: float = DEFAULT_WAIT_S,
    cache_dir: str | Path | None = None,
) -> GPT1Tokenizer:
    """The tokenizer for a run.

    ``tokenizer`` is ``"train"`` (train a BPE on ``source`` once and keep it as
    ``workdir/tokenizer.json``; later calls load that file; in a multi-process job process 0 trains
    and the others wait up to ``wait_s`` for the file), a path to a tokenizer JSON saved by
    ``GPT1Tokenizer.save``, or a directory holding OpenAI's ``encoder_bpe_40000.json`` and
    ``vocab_40000.bpe``. With ``cache_dir``, a BPE trained is also kept there, and one kept there for
    the same corpus and size is copied instead of trained (module docstring).
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
        ready=lambda: path.is_file() and _still_fits(source, workdir, vocab_size, progress),
        build=lambda: _train_tokenizer(source, workdir, vocab_size, progress, cache_dir),
        load=lambda: _load_trained(source, workdir, vocab_size),
        key=f"tokenizer:{workdir}",
        what="the BPE tokenizer",
        path=path,
        wait_s=wait_s,
        remedy="put the workdir on a disk every host shares, or train it ahead (`gpt1-jax tokenize --tokenizer "
               "train --workdir DIR ...` on one host) and set data.tokenizer to a copy of DIR/tokenizer.json "
               "every host can read",
        on_wait=say if progress else None,
    )


def _has_checkpoints(workdir: Path) -> bool:
    folder = workdir / "checkpoints"
    return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


def _meta(workdir: Path) -> dict | None:
    meta_path = workdir / TOKENIZER_META
    if not meta_path.is_file():
        return None  # trained before the meta file existed: nothing to compare
    try:
        return json.loads(meta_path.read_text(encoding="utf-8"))
    except ValueError:
        raise DataError(f"{meta_path} is damaged (not JSON): restore it, or delete it and {TOKENIZER_FILE} to "
                        "retrain (only if no checkpoint of the run uses them)") from None


def _still_fits(source: TextSource, workdir: Path, vocab_size: int, speak: bool) -> bool:
    """Whether a saved BPE is the one this corpus would train. One that no checkpoint uses yet is retrained when
    the corpus or the size changed (a BPE trained on an empty or half-filled file must not outlive it); one a
    checkpoint was trained with stays, since the model's ids mean its tokens (`_load_trained` checks the size)."""
    meta = _meta(workdir)
    if meta is None or _has_checkpoints(workdir):
        return True
    # No recorded fingerprint: written before there was one, possibly by a run that then failed on its corpus.
    fits = meta.get("vocab_size") == vocab_size and meta.get("fingerprint") == source.fingerprint()
    if not fits and speak:
        say(f"retraining {workdir / TOKENIZER_FILE}: the corpus or vocab_size changed since it was trained, and no "
            "checkpoint uses it yet")
    return fits


def _load_trained(source: TextSource, workdir: Path, vocab_size: int) -> GPT1Tokenizer:
    path = workdir / TOKENIZER_FILE
    meta = _meta(workdir)
    if meta is not None:
        if meta.get("vocab_size") != vocab_size:
            raise ConfigError(
                f"{path} was trained with vocab_size={meta.get('vocab_size')}, not {vocab_size}, and the run's "
                f"checkpoints use it: set data.vocab_size back to {meta.get('vocab_size')}, or start a new run in "
                "another workdir"
            )
        check_recorded_digest(workdir)
        if meta.get("source") != source.spec or meta.get("fingerprint", source.fingerprint()) != source.fingerprint():
            # Reusing is what resuming with a new corpus wants; say so rather than fail.
            log.warning("reusing %s trained on %r for source %r", path, meta.get("source"), source.spec)
    return GPT1Tokenizer.load(path)


def _train_tokenizer(source: TextSource, workdir: Path, vocab_size: int, progress: bool,
                     cache_dir: str | Path | None) -> GPT1Tokenizer:
    path, meta_path = workdir / TOKENIZER_FILE, workdir / TOKENIZER_META
    kept = None if cache_dir is None else Path(cache_dir) / f"bpe-{_bpe_key(source, vocab_size)}"
    found = None if kept is None else _kept_bpe(kept)
    if found is not None:
        tok, n_docs = found
        if progress:
            say(f"reusing the BPE trained before on {source.spec!r} with vocab_size={vocab_size} ({kept}): runs on "
                "one corpus read the same tokens")
    else:
        tok, n_docs = _train_bpe(source, vocab_size, progress)
        if kept is not None:
            tok, n_docs = _keep_bpe(kept, tok, n_docs, source.spec, vocab_size)
    workdir.mkdir(parents=True, exist_ok=True)  # only now: a corpus that cannot be read leaves nothing behind
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tok.save(tmp)
        meta = {"source": source.spec, "vocab_size": vocab_size, "fingerprint": source.fingerprint(), "n_docs": n_docs,
                "sha256": hashlib.sha256(tmp.read_bytes()).hexdigest()}
        atomic_write_text(meta_path, json.dumps(meta))
        os.replace(tmp, path)  # last: the tokenizer file's presence means "training finished"
    finally:  # a Ctrl-C between the two writes leaves no temporary file behind
        tmp.unlink(missing_ok=True)
    return tok


BPE_FORMAT = 2  # bump when what GPT1Tokenizer.train makes of a corpus changes: kept BPEs are then trained again
# 2: the same BPE in every process (ties between merges broken the same way; 1 broke them by hash-map order)


def _bpe_key(source: TextSource, vocab_size: int) -> str:
    blob = {"format": BPE_FORMAT, "spec": source.spec, "source": source.fingerprint(), "vocab_size": vocab_size,
            "tokenizers": tokenizers.__version__}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:24]


def _kept_bpe(folder: Path) -> tuple[GPT1Tokenizer, int] | None:
    """(the BPE kept in `folder`, its corpus's documents), or None when none is kept there or it is damaged."""
    try:
        meta = json.loads((folder / TOKENIZER_META).read_text(encoding="utf-8"))
        if "sha256" not in meta:  # always recorded here: a record without it is damaged
            return None
        check_recorded_digest(folder)  # the run folder's check: DataError on another tokenizer.json
        return GPT1Tokenizer.load(folder / TOKENIZER_FILE), int(meta["n_docs"])
    except (OSError, ValueError, KeyError, TypeError, DataError):
        return None  # trained again, and kept in its place


def bpe_of_texts(texts: list[str], vocab_size: int, cache_dir: str | Path, what: str,
                 progress: bool = False) -> GPT1Tokenizer:
    """A BPE of `texts` (fine-tuning from scratch: a task's training text, `what`), trained once per text and size
    and kept in `cache_dir` as a corpus's is (every run of the task then starts at once). `progress`: the
    training's bars and status lines, on process 0."""
    blob = {"format": BPE_FORMAT, "texts": hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest(),
            "vocab_size": vocab_size, "tokenizers": tokenizers.__version__}
    kept = Path(cache_dir) / f"bpe-{hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:24]}"
    if (found := _kept_bpe(kept)) is not None:
        return found[0]
    tok = GPT1Tokenizer.train([texts], vocab_size=vocab_size, show_progress=progress and Peers.current().builds)
    return _keep_bpe(kept, tok, len(texts), what, vocab_size)[0]


# Killed writers' folders (a kept BPE, a token cache) are swept after a few quiet seconds when their writer ran here,
# after LOCK_STALE_S when it may be on another host.
_SWEEP = {"dead_quiet_s": 10.0, "stale_s": LOCK_STALE_S}


def _keep_bpe(folder: Path, tok: GPT1Tokenizer, n_docs: int, spec: str, vocab_size: int) -> tuple[GPT1Tokenizer, int]:
    """Keeps `tok` in `folder` for later runs on the corpus -> what is kept there: another job's BPE where it kept
    one first (every run then reads the same). A damaged one is replaced; a cache that cannot be written is said
    and skipped."""
    try:
        with staging_folder(folder, **_SWEEP) as tmp:
            tok.save(tmp / TOKENIZER_FILE)
            meta = {"source": spec, "vocab_size": vocab_size, "n_docs": n_docs,
                    "sha256": hashlib.sha256((tmp / TOKENIZER_FILE).read_bytes()).hexdigest()}
            (tmp / TOKENIZER_META).write_text(json.dumps(meta), encoding="utf-8")
            if folder.exists() and _kept_bpe(folder) is None:  # damaged (it was read before training)
                shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
    except OSError as e:
        if (theirs := _kept_bpe(folder)) is not None:
            return theirs
        say(f"could not keep the BPE in {folder.parent} ({e.strerror or e}): a run in another workdir will train "
            "its own")
    return tok, n_docs


class _Batches:
    """A source's documents in batches, read afresh by each pass over them (GPT1Tokenizer.train reads its texts
    twice, and would otherwise keep a corpus in memory); `n_docs`: how many documents the last pass read.
    Batches, not documents: GPT1Tokenizer.train treats a plain string that names an existing file as a file, and
    Path(doc).is_file() raises on documents with a >255-character line without '/'."""

    def __init__(self, source: TextSource):
        self.source, self.n_docs = source, 0

    def __iter__(self) -> Iterator[list[str]]:
        return _chunks(self._counted(), _CHUNK_CHARS)

    def _counted(self) -> Iterator[str]:
        for self.n_docs, doc in enumerate(self.source.documents(), 1):
            yield doc


def _train_bpe(source: TextSource, vocab_size: int, progress: bool) -> tuple[GPT1Tokenizer, int]:
    log.info("training a %d-token BPE on %s", vocab_size, source.spec)
    batches = _Batches(source)
    tok = GPT1Tokenizer.train(batches, vocab_size=vocab_size, show_progress=progress)
    if batches.n_docs == 0:  # a BPE of nothing would be reused once the file is filled
        raise DataError(f"text source {source.spec!r} has no documents")
    return tok, batches.n_docs


_PIECE_CHARS = 1 << 17  # text per encode of a long document: tokenizers' working set is ~150 bytes per character
# Flags of a piece: a newline word was cut off after it, its document ends with it, a "<" came before it (see _pieces).
_NEWLINE, _END, _AFTER_LT = 1, 2, 4
# What ftfy changes in ASCII text: the control characters it drops, "\r" (made "\n"), HTML entities.
_FTFY_EDITS_ASCII = re.compile(r"[\x00-\x08\x0b\x0d-\x1f\x7f]|&#?[0-9A-Za-z]{1,24};")


def _pieces(docs: Iterable[str], max_chars: int, mode: str) -> Iterator[tuple[str, int]]:
    """Each document as (piece, flags): pieces of about ``max_chars`` characters (longer where no cut fits), cut
    where encoding the pieces one by one gives the ids of the whole document.

    Mode "hf": BERT's normaliser works per character and its pre-tokeniser ends words at whitespace, so any cut after
    a " " or "\\n" is exact. Mode "original" is stricter. ftfy fixes each line as a whole (it judges mojibake per
    line), and text_standardize strips at a piece's ends the "\\n" that spaCy makes a word: so it cuts after a "\\n"
    (flag _NEWLINE: the caller puts the newline word back), or at a " " between printable characters of a line ftfy
    leaves as it is (ASCII without control characters, "\\r" or HTML entities). ftfy also stops unescaping entities
    for the rest of the text at the first "<": flag _AFTER_LT says one came before the piece.
    """
    original = mode == "original"
    for doc in docs:
        n = len(doc)
        if n <= max_chars:
            yield doc, _END
            continue
        first_lt = doc.find("<") if original else -1
        seen = (0, 0, False)  # the line looked at last: start, end, whether ftfy leaves it as it is

        def solid(i: int) -> bool:
            return 0 <= i < n and "!" <= doc[i] <= "~"

        def cut_in(lo: int, hi: int) -> tuple[int, int]:
            """The last cut in (lo, hi], never at the end (-1 if none), and whether it cut off a newline word."""
            nonlocal seen
            hi = min(hi, n - 1)
            nl = doc.rfind("\n", lo, hi)
            if not original:
                at = max(nl, doc.rfind(" ", lo, hi))
                return (at + 1 if at >= 0 else -1), 0
            line_start, line_end, clean = seen
            if not line_start <= hi - 1 < line_end:  # the last line of the window
                line_start, line_end = doc.rfind("\n", 0, hi - 1) + 1, doc.find("\n", hi - 1)
                line_end = n if line_end < 0 else line_end
                line = doc[line_start:line_end]
                clean = line.isascii() and not _FTFY_EDITS_ASCII.search(line)
                seen = (line_start, line_end, clean)
            if clean:
                low = max(lo, line_start)
                at = doc.rfind(" ", low, hi)
                while at >= low and not (solid(at - 1) and solid(at + 1)):
                    at = doc.rfind(" ", low, at)
                if at >= low:
                    return at + 1, 0
            return (nl + 1, _NEWLINE) if nl >= 0 else (-1, 0)

        start = flags = 0
        while n - start > max_chars:
            lo, hi = start, start + max_chars
            cut, newline = cut_in(lo, hi)
            while cut < 0 and hi < n:  # an unbroken stretch (a long word, or line): the first cut after it
                lo, hi = hi, hi + max_chars
                cut, newline = cut_in(lo, hi)
            if cut < 0:
                break
            yield doc[start:cut], flags | newline
            start = cut
            flags = _AFTER_LT if 0 <= first_lt < start else 0
        yield doc[start:], flags | _END


def _batches(pieces: Iterable[tuple[str, int]], max_chars: int) -> Iterator[list[tuple[str, int]]]:
    batch: list[tuple[str, int]] = []
    size = 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece[0])
        if size >= max_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _chunks(docs: Iterable[str], max_chars: int, piece_chars: int = _PIECE_CHARS) -> Iterator[list[str]]:
    """Lists of texts of about ``max_chars`` characters for BPE training (mode "hf"): a long document comes as pieces
    (`_pieces`) holding the same words, so the trainer counts what it would count on the whole, without the
    gigabyte a 10 MB document costs it at once."""
    for batch in _batches(_pieces(docs, piece_chars, "hf"), max_chars):
        yield [text for text, _ in batch]


def encode_documents(
    docs: Iterable[str], tokenizer: GPT1Tokenizer, dtype: np.dtype, sep: int, chunk_chars: int = _CHUNK_CHARS,
    piece_chars: int = _PIECE_CHARS,
) -> Iterator[tuple[np.ndarray, int]]:
    """(token array, number of documents it ends) per chunk: each document's ids followed by ``sep``. A document
    longer than ``piece_chars`` is encoded in pieces (`_pieces`) whose ids, joined, are those of the whole."""
    def word(w: str) -> list[int]:
        return tokenizer.backend.encode([w], is_pretokenized=True, add_special_tokens=False).ids

    newline, lt = (word("\n"), word("<")) if tokenizer.mode == "original" else ([], [])
    # A piece after a "<" is encoded as "<\n" + piece, so that ftfy keeps its HTML entities as in the whole document;
    # its ids then start with those of "<" and of the newline word (just "<" where the piece has no words).
    lead = lt + newline
    begun = pending = False  # this document has ids so far; a newline word was cut off after them
    for batch in _batches(_pieces(docs, piece_chars, tokenizer.mode), chunk_chars):
        ids = tokenizer.encode_batch(["<\n" + text if flags & _AFTER_LT else text for text, flags in batch])
        total = ends = 0
        for row, (_, flags) in zip(ids, batch):
            if flags & _AFTER_LT:
                if row[: len(lead)] != lead and row != lt:  # a bug, not bad input
                    raise AssertionError(f'"<\\n" + piece encoded as {row[:len(lead)]}..., not {lead}...')
                del row[: len(lt) if row == lt else len(lead)]
            if row:  # the whole document has the newline word only between words
                if pending and begun:
                    row[:0] = newline
                begun, pending = True, False
            if flags & _NEWLINE:
                pending = True
            if flags & _END:
                row.append(sep)
                ends += 1
                begun = pending = False
            total += len(row)
        # fromiter over a flat chain: one C-level pass, no per-document arrays.
        yield np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=total), ends


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


_RUN_DEPTH = 3  # folders above a cache dir read for a run.json: a run's checkpoints/<step>/<item> at most


def check_cache_dir(cache_dir: str | Path, workdir: str | Path | None = None) -> None:
    """Refuses in one line a token cache folder that cannot take a cache (a file, a path through one, an unwritable
    folder that holds none) or that lies in a run's folder (the job's own `workdir` too: it becomes one). Checked
    before a BPE is trained: the first kind failed only when the BPE was kept, minutes in, and the second filled
    other runs' folders with bpe-*/tokens-* folders."""
    path = Path(cache_dir).expanduser().absolute()
    where = f"token cache folder {cache_dir} (data.cache_dir, --cache-dir)"
    fix = f"give another folder (default: {user_cache('tokens')})"
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        what = "is a file, not a folder" if existing == path else f"lies under {existing}, which is a file"
        raise ConfigError(f"{where} {what}: {fix}")
    # A read-only cache built ahead of the job (`gpt1-jax tokenize`) is read, never written; only process 0 writes.
    writes = Peers.current().builds and not (existing == path and any(path.glob("tokens-*")))
    read_only = writes and os.statvfs(existing).f_flag & os.ST_RDONLY
    if writes and (read_only or not os.access(existing, os.W_OK | os.X_OK)):
        why = "is on a read-only file system" if read_only else "is not writable"
        raise ConfigError(f"{where} cannot be written ({existing} {why}) and holds no token cache: {fix}")
    real = path.resolve()
    own = None if workdir is None else Path(workdir).expanduser().resolve()
    if own is not None and (own == real or own in real.parents):
        raise ConfigError(f"{where} lies in --workdir {workdir}, the run's own folder: caches are shared by runs and "
                          f"kept apart from them; {fix}")
    for folder in (real, *real.parents[:_RUN_DEPTH]):
        if (job := run_folder.read(folder)) is not None:
            raise ConfigError(f"{where} lies in {folder}, the folder of {job.describe()}: its bpe-*/tokens-* folders "
                              f"would be written into that run; {fix}")


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

    if peers.builds:
        cache_dir.mkdir(parents=True, exist_ok=True)  # the lock lives there
        _sweep_killed_builds(cache_dir)
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
        on_wait=say if progress else None,
    )


def _sweep_killed_builds(cache_dir: Path) -> None:
    """The token caches killed builds left half-written in `cache_dir` (`staging_folder`'s
    `.tmp-tokens-<key>-<pid>-<random>`), of any corpus: only this run's own key was swept, and only when it built,
    so a build killed before another finished it, or of a corpus not tokenized again, kept its gigabytes."""
    for final in {left.name.removeprefix(".tmp-").rsplit("-", 2)[0] for left in cache_dir.glob(".tmp-tokens-*-*-*")}:
        sweep_staging_folders(cache_dir / final, **_SWEEP)


def _build_cache(
    source: TextSource, tokenizer: GPT1Tokenizer, final: Path, sep: int, dtype: np.dtype, peers: Peers, progress: bool
) -> TokenStream:
    """`_tokenize_into` ``final``; a write's error that names no file (a full disk: "No space left on device", where
    the run's folder may be on another disk) names the cache folder."""
    try:
        return _tokenize_into(source, tokenizer, final, sep, dtype, peers, progress)
    except OSError as e:
        if e.filename is None and e.errno is not None:
            raise OSError(e.errno, e.strerror, str(final.parent)) from e
        raise


def _write_ids(source: TextSource, tokenizer: GPT1Tokenizer, raw: Path, sep: int, dtype: np.dtype,
               progress: bool) -> tuple[int, int, int, str]:
    """Streams the ids of `source`'s documents into `raw` -> (tokens, documents, <unk> tokens, sha256 of the ids).
    Its bar counts a file source's bytes read, of their size, with the tokens so far and their rate beside; another
    source (a tfds or HF dataset, whose size is not known before it is read) counts its tokens."""
    n_tokens = n_docs = n_unk = 0
    digest = hashlib.sha256()
    sized = isinstance(source, FileSource)
    shown = dict(unit="B", total=source.total_bytes()) if sized else dict(unit="tok")
    with open(raw, "wb") as f, Bar(unit_scale=True, desc=f"tokenizing {source.spec}", disable=not progress,
                                   **shown) as bar:
        documents = source.documents(on_read=bar.update) if sized else source.documents()
        for arr, docs in encode_documents(documents, tokenizer, dtype, sep):
            f.write(arr.data)  # not ndarray.tofile, which turns a Ctrl-C inside it into a TypeError
            digest.update(arr.data)
            n_unk += int(np.count_nonzero(arr == 0))  # <unk>'s id (gpt1_jax/tokenizer.py)
            n_tokens += arr.size
            n_docs += docs
            if not sized:
                bar.update(arr.size)
            elif not bar.disable:
                bar.set_postfix_str(_tokens_and_rate(n_tokens, bar.format_dict["elapsed"]), refresh=False)
    return n_tokens, n_docs, n_unk, digest.hexdigest()


def _tokens_and_rate(n_tokens: int, seconds: float) -> str:
    rate = f", {Bar.format_sizeof(n_tokens / seconds)}tok/s" if seconds > 0 else ""
    return f"{Bar.format_sizeof(n_tokens)}tok{rate}"


def _tokenize_into(
    source: TextSource, tokenizer: GPT1Tokenizer, final: Path, sep: int, dtype: np.dtype, peers: Peers, progress: bool
) -> TokenStream:
    """Tokenise into a temporary directory beside ``final``, then rename it into place."""
    with staging_folder(final, **_SWEEP) as tmp:
        # The length is unknown until the end, so stream raw ids first and prepend the .npy
        # header afterwards (one sequential copy, cheap next to tokenising).
        raw = tmp / "tokens.bin"
        n_tokens, n_docs, n_unk, digest = _write_ids(source, tokenizer, raw, sep, dtype, progress)
        if n_tokens == 0:
            raise DataError(f"text source {source.spec!r} has no documents")
        if n_unk > UNK_WARN * n_tokens:  # a model trained on <unk> learns nothing, and nothing else would say so
            say(f"{n_unk / n_tokens:.0%} of the {n_tokens:,} tokens of {source.spec!r} are <unk>: the tokenizer cannot "
                "read much of this text (another script or alphabet than it was trained on?)")
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
            # What the tokens are, whatever path the text came from: a resumed run checks it trains on the same.
            "tokens_sha256": digest,
            "unk_tokens": n_unk,
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
    return _open(final, from_cache=False)
