"""tensorflow-datasets text, read through ``tfds.data_source`` (array_record): no TensorFlow needed.

Spec: ``tfds:NAME[/CONFIG][:SPLIT][?feature=F&data_dir=D]``. SPLIT defaults to ``train`` and may
use tfds slicing (``train[:10%]``); ``feature`` names the text feature (``text`` by default; nested
features as ``outer/inner``); ``data_dir`` defaults to tfds' own default (``$TFDS_DATA_DIR`` or
``~/tensorflow_datasets``).

The dataset must already be prepared in the ``array_record`` format, e.g.
``tfds.builder(NAME, data_dir=D, file_format="array_record").download_and_prepare()``.
We never download here: offline, some tfds downloads retry for minutes before failing, and a
training job should not start one implicitly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from gpt1_jax.errors import ConfigError, DataError

__all__ = ["TfdsSpec", "TfdsSource", "parse_tfds_spec"]

PREFIX = "tfds:"
_INSTALL_HINT = "pip install tensorflow-datasets importlib_resources array_record"
_READ_CHUNK = 1024  # records per random-access read: amortises the per-call overhead


@dataclass(frozen=True)
class TfdsSpec:
    name: str  # NAME or NAME/CONFIG (what tfds.builder takes)
    split: str = "train"
    feature: str = "text"
    data_dir: str | None = None


def parse_tfds_spec(spec: str) -> TfdsSpec:
    if not spec.startswith(PREFIX):
        raise ConfigError(f"not a tfds spec (must start with {PREFIX!r}): {spec!r}")
    body, _, query = spec[len(PREFIX):].partition("?")
    # First ':' only: tfds split slices contain colons themselves ("train[:10%]").
    name, _, split = body.partition(":")
    if not name or name.count("/") > 1 or not all(name.split("/")):
        raise ConfigError(f"tfds source {spec!r}: expected tfds:NAME[/CONFIG][:SPLIT][?feature=F&data_dir=D]")
    opts = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = set(opts) - {"feature", "data_dir"}
    if unknown:
        raise ConfigError(f"tfds source {spec!r}: unknown option(s) {sorted(unknown)}; known: feature, data_dir")
    return TfdsSpec(
        name=name,
        split=split or "train",
        feature=opts.get("feature") or "text",
        data_dir=opts.get("data_dir") or None,
    )


def _import_tfds() -> Any:
    try:  # imported here: tensorflow-datasets takes ~0.4 s to import, and only a tfds: source needs it
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(f"tfds: sources need tensorflow-datasets ({e.name} is missing): {_INSTALL_HINT}") from None
    return tfds


@contextlib.contextmanager
def quiet_tfds(tfds: Any) -> Iterator[None]:
    """tfds, asked about a dataset not prepared yet, logs "WARNING:absl:Variant folder ... has no dataset_info.json"
    (its own check, and its own half-written folder while it prepares: that reads as damage, and is the normal first
    run), and makes an empty folder in the system's temp dir to copy GCS's metadata into, which this tfds never
    fetches (gcs_utils._is_gcs_disabled), and leaves it: one /tmp/tmp*tfds a builder (2,150 on a machine after two
    days of GLUE runs). Neither while this is open; the metadata is the code's own, as it was."""
    from absl import logging as absl_logging  # tensorflow-datasets' dependency: imported with it

    info_class, verbosity = tfds.core.DatasetInfo, absl_logging.get_verbosity()
    from_bucket = info_class.initialize_from_bucket
    absl_logging.set_verbosity(absl_logging.ERROR)
    info_class.initialize_from_bucket = lambda self: None
    try:
        yield
    finally:
        info_class.initialize_from_bucket = from_bucket
        absl_logging.set_verbosity(verbosity)


def _builder(tfds: Any, spec: str, parsed: TfdsSpec) -> Any:
    try:
        return tfds.builder(parsed.name, data_dir=parsed.data_dir)
    except tfds.core.DatasetNotFoundError:
        pass
    # Text datasets (glue, lm1b, wikipedia, ...) register only when their package is imported.
    try:
        import tensorflow_datasets.text  # noqa: F401
    except Exception:  # a broken optional module must not hide the real "not found" below
        pass
    try:
        return tfds.builder(parsed.name, data_dir=parsed.data_dir)
    except tfds.core.DatasetNotFoundError:
        where = parsed.data_dir or "the default data_dir"
        raise DataError(
            f"tfds source {spec!r}: dataset {parsed.name!r} not found (not registered, not prepared in {where})"
        ) from None


def _feature_path(features: Any, feature: str, spec: str) -> list[str]:
    """Validate the (possibly nested) feature name against the dataset's features."""
    path = feature.split("/")
    node = features
    for i, key in enumerate(path):
        keys = list(node.keys()) if hasattr(node, "keys") else []
        if key not in keys:
            raise ConfigError(
                f"tfds source {spec!r}: no feature {'/'.join(path[: i + 1])!r}; available: {keys}"
            )
        node = node[key]
    return path


@dataclass(frozen=True)
class TfdsSource:
    spec: str
    parsed: TfdsSpec
    _builder: Any
    _feature: tuple[str, ...]

    @classmethod
    def open(cls, spec: str) -> TfdsSource:
        parsed = parse_tfds_spec(spec)
        tfds = _import_tfds()
        with quiet_tfds(tfds):
            builder = _builder(tfds, spec, parsed)
            prepared = builder.is_prepared()
        if not prepared:
            raise DataError(
                f"tfds source {spec!r}: {builder.info.full_name} is not prepared in {builder.data_dir}; "
                f"prepare it once with tfds.builder({parsed.name!r}, file_format='array_record')"
                ".download_and_prepare()"
            )
        fmt = str(getattr(builder.info, "file_format", ""))
        if "array_record" not in fmt.lower():
            raise DataError(
                f"tfds source {spec!r}: prepared as {fmt}, random access needs file_format='array_record'"
            )
        split_names = list(builder.info.splits.keys())
        base_split = parsed.split.split("[", 1)[0]
        if base_split not in split_names:
            raise ConfigError(f"tfds source {spec!r}: no split {base_split!r}; available: {split_names}")
        path = _feature_path(builder.info.features, parsed.feature, spec)
        return cls(spec=spec, parsed=parsed, _builder=builder, _feature=tuple(path))

    def _data_source(self) -> Any:
        try:
            return self._builder.as_data_source(split=self.parsed.split)
        except ValueError as e:  # bad slice syntax and the like
            raise ConfigError(f"tfds source {self.spec!r}: {e}") from None

    def documents(self) -> Iterator[str]:
        ds = self._data_source()
        n = len(ds)
        for start in range(0, n, _READ_CHUNK):
            for record in ds.__getitems__(list(range(start, min(n, start + _READ_CHUNK)))):
                value = record
                for key in self._feature:
                    value = value[key]
                text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
                if text.strip():
                    yield text

    def __len__(self) -> int:
        return len(self._data_source())

    def fingerprint(self) -> str:
        split = self._builder.info.splits[self.parsed.split.split("[", 1)[0]]
        files = []
        for fp in getattr(split, "filepaths", []):
            st = fp.stat()
            files.append([str(fp), st.length if hasattr(st, "length") else None, getattr(st, "mtime", None)])
        blob = {
            "kind": "tfds",
            "dataset": self._builder.info.full_name,
            "split": self.parsed.split,
            "feature": list(self._feature),
            "files": files,
        }
        return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()
