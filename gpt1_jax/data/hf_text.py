"""Hugging Face datasets as pre-training text, through the `datasets` library's own loading path
(`pip install -e ".[hf]"`).

Specs:

* ``hf:REPO[/CONFIG][:SPLIT][#FIELD]``: a dataset on the Hub (or in the local `datasets` cache when
  HF_DATASETS_OFFLINE=1), REPO its repo id (``owner/name``, or a bare name), e.g.
  ``hf:Salesforce/wikitext/wikitext-103-raw-v1:train#text`` or ``hf:HuggingFaceFW/fineweb:train``.
* ``hf:json:FILES[#FIELD]``, ``hf:parquet:FILES[#FIELD]``, ``hf:arrow:FILES[#FIELD]`` (also ``csv``, ``text``):
  local files read by `datasets`' packaged builders; FILES is a path or a glob, e.g.
  ``hf:json:data/*.jsonl#text``.

SPLIT defaults to ``train`` (slices such as ``train[:10%]`` work where the dataset is not streamed), FIELD to
``text``. One row is one document. Rows are streamed (`streaming=True`: nothing is downloaded whole or
converted to Arrow first); a dataset that cannot stream is loaded whole. The fingerprint that keys the token
cache: for local files their paths, sizes and mtimes (as for plain text files), for a Hub dataset its name,
config, split, field and the builder's hash and version.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt1_jax.errors import ConfigError, DataError

PREFIX = "hf:"
PACKAGED = ("json", "parquet", "arrow", "csv", "text")  # datasets' builders for local files
_INSTALL_HINT = 'pip install -e ".[hf]"'


@dataclass(frozen=True)
class HfSpec:
    name: str  # a Hub dataset, or one of PACKAGED
    config: str | None = None
    split: str = "train"
    field: str = "text"
    files: tuple[str, ...] = ()  # PACKAGED: the files the pattern matched


def parse_hf_spec(spec: str) -> HfSpec:
    if not spec.startswith(PREFIX):
        raise ConfigError(f"not a Hugging Face datasets spec (must start with {PREFIX!r}): {spec!r}")
    body, _, field = spec[len(PREFIX):].rpartition("#") if "#" in spec else (spec[len(PREFIX):], "", "text")
    field = field or "text"
    kind, _, rest = body.partition(":")
    if kind in PACKAGED:
        if not rest:
            raise ConfigError(f"hf source {spec!r}: expected hf:{kind}:FILES[#FIELD]")
        rest = os.path.expanduser(rest)  # as every path flag reads `~`
        files = tuple(sorted(glob.glob(rest, recursive=True))) if glob.has_magic(rest) else (rest,)
        missing = [f for f in files if not Path(f).is_file()]
        if not files or missing:
            raise DataError(f"hf source {spec!r}: no such file {missing[0] if missing else rest!r}")
        return HfSpec(kind, field=field, files=files)
    name, _, split = body.partition(":")  # first ':' only: split slices have colons ("train[:10%]")
    if not name or name.count("/") > 2 or not all(name.split("/")):
        raise ConfigError(f"hf source {spec!r}: expected hf:REPO[/CONFIG][:SPLIT][#FIELD] or "
                          f"hf:{{{','.join(PACKAGED)}}}:FILES[#FIELD]")
    parts = name.split("/")  # the Hub's repo id (owner/name, or a bare name), then /CONFIG
    name, config = ("/".join(parts[:2]), parts[2]) if len(parts) == 3 else (name, None)
    return HfSpec(name, config, split or "train", field)


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"hf: sources need the datasets package: {_INSTALL_HINT}") from None
    # its progress bars, notices and logged errors are not ours to print: a failure is raised, and becomes one line
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    return datasets


def _one_line(e: Exception, what: str) -> Exception:
    """`datasets`' failure as a DataError of one line, or `e` itself when it is not one of the data's: OS and value
    errors (pyarrow's parse errors are value errors), and datasets' own (DatasetNotFoundError, ...), which have no
    common base here."""
    if not (isinstance(e, (ValueError, OSError)) or type(e).__module__.split(".")[0] in ("datasets", "huggingface_hub")):
        return e
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return DataError(f"{what}: {first}")


@dataclass(frozen=True)
class HfSource:
    spec: str
    parsed: HfSpec

    @classmethod
    def open(cls, spec: str) -> HfSource:
        """Loads the dataset and reads its first row now: a missing dataset or field is one line here, not an
        error once the token cache asks for documents."""
        source = cls(spec, parse_hf_spec(spec))
        first = next(iter(source._rows()), None)
        if first is None:
            raise DataError(f"hf source {spec!r} has no rows")
        source._check(first, 0)
        return source

    def _check(self, row: dict, i: int) -> str:
        field = self.parsed.field
        if field not in row:
            raise DataError(f"hf source {self.spec!r}: rows have no field {field!r} (they have: "
                            f"{', '.join(sorted(row))}); name it after '#'")
        if row[field] is None:  # a missing value (an empty CSV cell, a JSON null): an empty document, skipped
            return ""
        if not isinstance(row[field], str):
            raise DataError(f"hf source {self.spec!r}: field {field!r} of row {i} is {type(row[field]).__name__}, not text")
        return row[field]

    def _load(self):
        datasets = _import_datasets()
        p = self.parsed
        kwargs = dict(data_files=list(p.files)) if p.files else dict(name=p.config)
        try:
            try:
                return datasets.load_dataset(p.name, split=p.split, streaming=True, **kwargs)
            except NotImplementedError:  # a dataset that cannot stream
                return datasets.load_dataset(p.name, split=p.split, **kwargs)
        except StopIteration:  # datasets' json builder on an empty file (inside a generator: a RuntimeError)
            raise DataError(f"hf source {self.spec!r} has no rows") from None
        except Exception as e:
            raise _one_line(e, f"hf source {self.spec!r}: cannot load it") from None

    def _rows(self) -> Iterator[dict]:
        """The rows, as `datasets` reads them (lazily, when streamed): a file it cannot parse is one line too."""
        rows = self._load()
        try:
            yield from rows
        except Exception as e:
            raise _one_line(e, f"hf source {self.spec!r}: cannot read its rows") from None

    def documents(self) -> Iterator[str]:
        for i, row in enumerate(self._rows()):
            if text := self._check(row, i).strip():
                yield text

    def fingerprint(self) -> str:
        p = self.parsed
        if p.files:
            stats = [[str(Path(f).resolve()), st.st_size, st.st_mtime_ns] for f in p.files if (st := Path(f).stat())]
            key = {"kind": "hf-files", "builder": p.name, "files": stats, "split": p.split, "field": p.field}
        else:
            builder = _import_datasets().load_dataset_builder(p.name, p.config)
            key = {"kind": "hf", "name": p.name, "config": p.config, "split": p.split, "field": p.field,
                   "hash": builder.hash, "version": str(builder.info.version)}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
