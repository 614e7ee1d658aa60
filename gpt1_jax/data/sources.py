"""Text sources for pre-training: each yields documents (``str``) in a fixed order.

Source specs understood by :func:`open_source`:

* ``"default"`` / ``"pydoc"``: the demo corpus embedded in every CPython install, the English help
  topics of ``pydoc_data.topics.topics`` (one document per topic). A demo corpus: on CPython 3.11
  it is 79 documents, ~465,000 characters, ~129,000 tokens with OpenAI's GPT-1 vocabulary
  (~121,000 with the 4.4k-token BPE that training on it yields), i.e. ~250 windows of 512 tokens:
  enough to smoke-test training and overfit a tiny model offline, far too small for a useful
  language model. Its content changes with the Python release, and so does its fingerprint
  (hence its token cache).
* a file, directory or glob (``data/*.txt.gz``, ``books/**/*.txt``): UTF-8 text, gzip-compressed when
  the name ends in ``.gz``. A document is a block of lines separated by one or more blank lines,
  the layout of ``shared/data/corpus/english_mixed.txt.gz``. A directory means every ``*.txt`` and
  ``*.txt.gz`` below it. Files are read in sorted path order so the document order is stable.
* ``tfds:NAME[/CONFIG][:SPLIT][?feature=F&data_dir=D]``: a tensorflow-datasets dataset prepared in
  the ``array_record`` format, read without TensorFlow (see :mod:`gpt1_jax.data.tfds_text`).
* ``hf:REPO[/CONFIG][:SPLIT][#FIELD]`` or ``hf:json|parquet|arrow|csv|text:FILES[#FIELD]``: a Hugging Face
  dataset, or local files, through the ``datasets`` library, one row per document
  (see :mod:`gpt1_jax.data.hf_text`).

Every source has a ``fingerprint()`` that changes when its content may have changed (paths, sizes,
mtimes, dataset versions): the token cache is keyed on it, so it must be cheap (no full read).
"""

from __future__ import annotations

import codecs
import glob
import gzip
import hashlib
import io
import json
import os
import shlex
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydoc_data import topics

from gpt1_jax.data.hf_text import HfSource
from gpt1_jax.data.tfds_text import TfdsSource
from gpt1_jax.errors import ConfigError, DataError

__all__ = ["TextSource", "PydocSource", "FileSource", "open_source", "read_blocks"]

DEFAULT_SPECS = ("default", "pydoc")
TFDS_PREFIX = "tfds:"
HF_PREFIX = "hf:"
_TEXT_SUFFIXES = (".txt", ".txt.gz")


@runtime_checkable
class TextSource(Protocol):
    """What the pipeline needs from a source."""

    spec: str

    def documents(self) -> Iterator[str]:
        """Documents in a deterministic order; may be called more than once."""
        ...

    def fingerprint(self) -> str:
        """A string that changes whenever ``documents()`` may yield something else."""
        ...


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class PydocSource:
    """CPython's own help topics: a corpus that exists on every machine, with no download."""

    spec: str = "default"

    def documents(self) -> Iterator[str]:
        # Sorted by topic name: dict order is an implementation detail of the generated module.
        for name in sorted(topics.topics):
            text = topics.topics[name].strip()
            if text:
                yield text

    def fingerprint(self) -> str:
        # Hash of the content itself: it is small (0.5 MB) and the module mtime is meaningless in
        # relocated or zipped installs.
        content = hashlib.sha256(json.dumps(topics.topics, sort_keys=True).encode()).hexdigest()
        return _digest({"kind": "pydoc", "python": sys.version_info[:3], "content": content})


_BOMS = (  # UTF-32's little-endian mark starts with UTF-16's: longest first
    (codecs.BOM_UTF32_LE, "UTF-32", "little-endian"),
    (codecs.BOM_UTF32_BE, "UTF-32", "big-endian"),
    (codecs.BOM_UTF16_LE, "UTF-16", "little-endian"),
    (codecs.BOM_UTF16_BE, "UTF-16", "big-endian"),
)
_NUL = ("{p}: NUL bytes {where}, which no text has: binary data, UTF-16 or UTF-32 without a byte-order mark, or text "
        "damaged by a wrong conversion (such as UTF-16 converted as latin-1)")
_LATIN1_BOMS = (codecs.BOM_UTF16_LE.decode("latin-1").encode(), codecs.BOM_UTF16_BE.decode("latin-1").encode())


def _to_utf8(p: Path, encoding: str) -> str:
    out = shlex.quote(str(p.with_name(p.name.removesuffix(".gz").removesuffix(".txt") + ".utf8.txt")))
    if p.name.endswith(".gz"):
        return f"gunzip -c {shlex.quote(str(p))} | iconv -f {encoding} -t UTF-8 > {out}"
    return f"iconv -f {encoding} -t UTF-8 {shlex.quote(str(p))} > {out}"


def _wide_text(p: Path, head: bytes) -> str | None:
    """The one-line error for UTF-16 or UTF-32 text (what Windows Notepad saves as "Unicode"), else None: read
    as UTF-8 it is an error at byte 0xff, or without a byte-order mark NUL-filled text that would train."""
    for bom, name, order in _BOMS:
        if head.startswith(bom):
            return (f"{p}: {name} text ({order}, it starts with a byte-order mark); convert it to UTF-8 first: "
                    f"{_to_utf8(p, name)}")
    if head.startswith(_LATIN1_BOMS) and 0 in head:
        return (f"{p}: UTF-16 text converted to UTF-8 as if it were latin-1 (it starts with 'ÿþ' or 'þÿ' and has "
                f"NUL bytes); convert the UTF-16 original instead: iconv -f UTF-16 -t UTF-8 ORIGINAL > "
                f"{shlex.quote(str(p))}")
    half = len(head) // 2
    nul_even, nul_odd = head[0::2].count(0), head[1::2].count(0)
    for nul, other, order, name in ((nul_odd, nul_even, "little-endian", "UTF-16LE"),
                                    (nul_even, nul_odd, "big-endian", "UTF-16BE")):
        if half >= 8 and nul > half // 4 and other <= nul // 8:  # English in UTF-16: every other byte is NUL
            return (f"{p}: UTF-16 text ({order}, without a byte-order mark: every other byte is NUL); convert it to "
                    f"UTF-8 first: {_to_utf8(p, name)}")
    return None


def read_blocks(path: str | Path, on_read: Callable[[int], None] | None = None) -> Iterator[str]:
    """Blank-line separated blocks of a text file (``.gz`` decompressed), trailing newline removed. `on_read`: told
    the bytes of the file read since it was last told (compressed ones of a ``.gz``), by the end all of them: a
    progress bar's measure whose total, the file's size, is known before it is read."""
    p = Path(path)
    gzipped = p.name.endswith(".gz")
    opener = gzip.open if gzipped else open
    block: list[str] = []
    # newline="" would keep "\r\n"; universal newlines make Windows files split the same way.
    # Bytes that are not UTF-8 are an error, not a silent U+FFFD: a corpus in another encoding would
    # otherwise train a tokenizer on replacement characters. A UTF-8 byte-order mark is dropped.
    lineno = 0
    try:
        with opener(p, "rb") as raw:
            problem = _wide_text(p, raw.read(4096))
        if problem:
            raise DataError(problem)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{p}: not readable gzip data ({e}) near line 1") from None
    told = 0
    # gzip.open and open in text mode, over a file whose position says how far the reading is
    with open(p, "rb") as raw, io.TextIOWrapper(gzip.GzipFile(fileobj=raw) if gzipped else raw,
                                                encoding="utf-8-sig") as f:
        try:
            for lineno, line in enumerate(f, 1):
                if "\0" in line:  # valid UTF-8, but no text: it would train on NULs
                    raise DataError(_NUL.format(p=p, where=f"on line {lineno}"))
                if line.strip():
                    block.append(line)
                elif block:
                    if on_read is not None and (at := raw.tell()) > told:
                        on_read(at - told)
                        told = at
                    yield "".join(block).rstrip("\n")
                    block = []
        except UnicodeDecodeError as e:
            # Every whole line before the chunk being decoded was read (`lineno`); the chunk's bytes before the bad
            # one hold the rest of the way to it.
            before = e.object[:e.start]
            line = lineno + 1 + (before.count(b"\n") or before.count(b"\r"))
            if 0 in e.object:  # latin-1 is no answer for those: converted, they would train as NULs
                raise DataError(_NUL.format(p=p, where=f"near line {line}")) from None
            raise DataError(
                f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} on line {line}); "
                f"convert it first, e.g. iconv -f latin1 -t utf-8"
            ) from None
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # not gzip, truncated, or corrupt inside
            raise DataError(f"{p}: not readable gzip data ({e}) near line {lineno + 1}") from None
    if block:
        yield "".join(block).rstrip("\n")
    if on_read is not None and (rest := p.stat().st_size - told) > 0:  # the last block's, read after the loop
        on_read(rest)


def _expand(spec: str) -> list[Path]:
    """Files named by a path, a directory or a glob; sorted, so the order is reproducible."""
    expanded = os.path.expanduser(spec)
    p = Path(expanded)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = [q for q in p.rglob("*") if q.is_file() and q.name.endswith(_TEXT_SUFFIXES)]
        if not files:
            raise FileNotFoundError(f"text source {spec!r}: directory has no *.txt or *.txt.gz files")
        return sorted(files)
    if glob.has_magic(expanded):
        files = [Path(q) for q in glob.glob(expanded, recursive=True) if Path(q).is_file()]
        if not files:
            raise FileNotFoundError(f"text source {spec!r}: glob matches no files")
        return sorted(files)
    if p.exists():  # a pipe (`--data <(zcat corpus.gz)`), a device: read once, and nothing to key the token cache by
        raise DataError(f"text source {spec!r}: not a regular file (a pipe or a device): write it to a file first (a "
                        "trained tokenizer reads the corpus twice, and the token cache knows a file by its size and time)")
    raise FileNotFoundError(f"text source {spec!r}: no such file or directory")


@dataclass(frozen=True)
class FileSource:
    """Local text files; one document per blank-line separated block."""

    spec: str
    paths: tuple[Path, ...] = field(default=())

    @classmethod
    def open(cls, spec: str) -> FileSource:
        return cls(spec=spec, paths=tuple(_expand(spec)))

    def documents(self, on_read: Callable[[int], None] | None = None) -> Iterator[str]:
        """`on_read`: told the bytes read (read_blocks), of `total_bytes()` in all."""
        for p in self.paths:
            yield from read_blocks(p, on_read)

    def fingerprint(self) -> str:
        # Size + mtime rather than a content hash: hashing a multi-GB corpus on every start would
        # cost as much as a good part of tokenising it.
        stats = []
        for p in self.paths:
            st = p.stat()
            stats.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
        return _digest({"kind": "files", "files": stats})

    def total_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.paths)


def open_source(spec: str) -> TextSource:
    """Parse a source spec (see the module docstring); fails with one line naming the bad spec."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"text source spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec in DEFAULT_SPECS:
        return PydocSource(spec)
    if spec.startswith(TFDS_PREFIX):
        return TfdsSource.open(spec)
    if spec.startswith(HF_PREFIX):
        return HfSource.open(spec)
    return FileSource.open(spec)
