"""GLUE through tensorflow-datasets, read back with `tfds.data_source` (array_record): no TensorFlow.

Two builders give the same features (those of tfds' own `glue/<task>`: the text fields, `label` and
`idx`; test labels are -1):
  * `GlueTsv`, this project's builder, which prepares the same features from GLUE's official TSV
    distribution in a local directory (`<data_dir>/<Task>/{train,dev,test}.tsv`, `--data-dir`);
  * without a directory, the files tfds' own `glue/<task>` builder downloads, fetched by tfds' download
    manager, unpacked into that layout and prepared by `GlueTsv` (`remote_builder`: tfds' builder unpacks
    with TensorFlow, which is not installed). Offline the download retries for minutes, so a 5 s
    reachability check runs first and fails with "use --data-dir".

The TSV reader handles the official files' quirks: fields are split on tabs only (quote characters
are text, never CSV quoting), MRPC's byte-order mark, CoLA's header-less train/dev, test files with
other columns and no labels, STS-B's float labels. A malformed row is an error naming file and line;
no example is ever dropped silently.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from gpt1_jax.data.pipeline import default_cache_dir
from gpt1_jax.data.tfds_text import quiet_tfds
from gpt1_jax.errors import ConfigError, DataError
from gpt1_jax.files import staging_folder

__all__ = [
    "GLUE_TASKS", "GlueTask", "GlueDownloadError", "glue_task", "read_tsv", "load_split", "split_available",
    "compute_metrics", "METRICS",
]

_READER_VERSION = "2"  # bump when the reader's output changes: part of the prepared cache's key


@dataclasses.dataclass(frozen=True)
class GlueTask:
    name: str  # tfds config name: glue/<name>
    dirname: str  # folder in GLUE's distribution
    kind: str  # the head: classification | entailment | similarity
    features: tuple[str, ...]  # text features, in input order
    columns: tuple[str, ...]  # the TSV header name of each text feature
    label_column: str | None
    label_classes: tuple[str, ...] | None  # None: regression (float label)
    metrics: tuple[str, ...]  # the first one picks the best epoch
    files: tuple[tuple[str, str], ...]  # split -> file name
    dev_splits: tuple[str, ...] = ("validation",)
    test_splits: tuple[tuple[str, str], ...] = (("test", ""),)  # split -> submission file stem ("" = dirname)
    headerless_columns: tuple[tuple[str, int], ...] = ()  # CoLA train/dev: column positions, no header
    score_range: tuple[float, float] | None = None  # a regression label's bounds (STS-B's 0..5 similarity)

    @property
    def n_outputs(self) -> int:
        return len(self.label_classes) if self.label_classes else 1

    @property
    def regression(self) -> bool:
        return self.label_classes is None

    def submission_name(self, split: str) -> str:
        return dict(self.test_splits)[split] or self.dirname


_STD_FILES = (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv"))

GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("cola", "CoLA", "classification", ("sentence",), ("sentence",), "is_acceptable",
                 ("unacceptable", "acceptable"), ("matthews_corr", "accuracy"), _STD_FILES,  # accuracy: BabyLM's
                 headerless_columns=(("label", 1), ("sentence", 3))),
        GlueTask("sst2", "SST-2", "classification", ("sentence",), ("sentence",), "label",
                 ("negative", "positive"), ("accuracy",), _STD_FILES),
        GlueTask("mrpc", "MRPC", "similarity", ("sentence1", "sentence2"), ("#1 String", "#2 String"), "Quality",
                 ("not_equivalent", "equivalent"), ("f1", "accuracy"), _STD_FILES),
        GlueTask("qqp", "QQP", "similarity", ("question1", "question2"), ("question1", "question2"), "is_duplicate",
                 ("not_duplicate", "duplicate"), ("f1", "accuracy"), _STD_FILES),
        GlueTask("stsb", "STS-B", "similarity", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "score",
                 None, ("pearson", "spearman"), _STD_FILES, score_range=(0.0, 5.0)),
        GlueTask("mnli", "MNLI", "entailment", ("premise", "hypothesis"), ("sentence1", "sentence2"), "gold_label",
                 ("entailment", "neutral", "contradiction"), ("accuracy",),
                 (("train", "train.tsv"), ("validation_matched", "dev_matched.tsv"),
                  ("validation_mismatched", "dev_mismatched.tsv"), ("test_matched", "test_matched.tsv"),
                  ("test_mismatched", "test_mismatched.tsv")),
                 dev_splits=("validation_matched", "validation_mismatched"),
                 test_splits=(("test_matched", "MNLI-m"), ("test_mismatched", "MNLI-mm"))),
        GlueTask("qnli", "QNLI", "entailment", ("question", "sentence"), ("question", "sentence"), "label",
                 ("entailment", "not_entailment"), ("accuracy",), _STD_FILES),
        GlueTask("rte", "RTE", "entailment", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label",
                 ("entailment", "not_entailment"), ("accuracy",), _STD_FILES),
        GlueTask("wnli", "WNLI", "entailment", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label",
                 ("not_entailment", "entailment"), ("accuracy",), _STD_FILES),
    )
}


class GlueDownloadError(DataError):
    """The real GLUE builder cannot download (offline); the message says to use --data-dir."""


def glue_task(name: str) -> GlueTask:
    key = name.lower().replace("-", "")
    if key not in GLUE_TASKS:
        raise ConfigError(f"unknown GLUE task {name!r}; known: {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[key]


# ---- the TSV reader ---------------------------------------------------------------------------------

def _parse_label(task: GlueTask, raw: str, where: str) -> int | float:
    if task.label_classes is None:
        try:
            score = float(raw)
        except ValueError:
            raise DataError(f"{where}: label {raw!r} is not a number") from None
        # a score off the scale (or nan) trained and was scored silently, where a class index off the classes is refused
        if task.score_range and not task.score_range[0] <= score <= task.score_range[1]:
            lo, hi = task.score_range
            raise DataError(f"{where}: label {raw!r} is not a {task.dirname} score in [{lo:g}, {hi:g}]")
        return score
    if raw in task.label_classes:
        return task.label_classes.index(raw)
    try:
        k = int(raw)  # CoLA, SST-2, MRPC, QQP write the class index
    except ValueError:
        k = -2
    if not 0 <= k < len(task.label_classes):
        raise DataError(f"{where}: label {raw!r} is not one of {list(task.label_classes)} nor 0..{len(task.label_classes) - 1}")
    return k


def read_tsv(path: str | Path, task: GlueTask | str, split: str) -> Iterator[dict[str, Any]]:
    """Examples of one official GLUE file as tfds' glue builder gives them: text features, label, idx."""
    task = glue_task(task) if isinstance(task, str) else task
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: GLUE {task.dirname} {split} file not found")
    # utf-8-sig drops MRPC's byte-order mark; split on "\n" only (splitlines would also break on
    # \x1c, \u2028, ... which are text inside a field).
    try:
        lines = path.read_text(encoding="utf-8-sig").split("\n")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a GLUE TSV file (byte {e.start} is not UTF-8 text)") from None
    if lines and lines[-1] == "":
        lines.pop()
    headerless = bool(task.headerless_columns) and not split.startswith("test")
    if headerless:
        width = max(i for _, i in task.headerless_columns) + 1
        positions = dict(task.headerless_columns)
        text_idx = [positions[f] for f in task.features]
        label_idx = positions["label"]
        n_fields, start = 4, 0
    else:
        if not lines:
            raise DataError(f"{path}:1: empty file, expected a header row")
        header = lines[0].rstrip("\r").split("\t")
        # A train file without its label column trained every example as label -1; a dev file's is left to
        # finetune.check_outputs, which names the likelier cause (a test file in its place).
        wanted = task.columns + ((task.label_column,) if split == "train" and task.label_column else ())
        missing = [c for c in wanted if c not in header]
        if missing:
            raise DataError(f"{path}:1: header lacks column(s) {missing}; got {header}")
        text_idx = [header.index(c) for c in task.columns]
        label_idx = header.index(task.label_column) if task.label_column in header else None
        if split.startswith("test"):
            label_idx = None  # labels of test files are private, whatever a column says
        n_fields, start, width = len(header), 1, len(header)
    for n, line in enumerate(lines[start:]):
        lineno = n + start + 1
        fields = line.rstrip("\r").split("\t")
        if len(fields) != n_fields or len(fields) < width:
            raise DataError(f"{path}:{lineno}: expected {n_fields} tab-separated fields, got {len(fields)}")
        example: dict[str, Any] = {f: fields[i] for f, i in zip(task.features, text_idx)}
        if label_idx is None:
            example["label"] = -1.0 if task.regression else -1
        else:
            example["label"] = _parse_label(task, fields[label_idx].strip(), f"{path}:{lineno}")
        example["idx"] = n
        yield example


# ---- the tfds builder of our own: the same features from a local TSV directory ---------------------

def _features(tfds: Any, task: GlueTask) -> Any:
    feats: dict[str, Any] = {f: tfds.features.Text() for f in task.features}
    feats["label"] = (tfds.features.Scalar(np.float32) if task.regression
                      else tfds.features.ClassLabel(names=list(task.label_classes)))
    feats["idx"] = tfds.features.Scalar(np.int32)
    return tfds.features.FeaturesDict(feats)


_BUILDER_CLASS: Any = None


def _builder_class() -> Any:
    """GlueTsv, defined on first use so importing this module never imports tensorflow-datasets."""
    global _BUILDER_CLASS
    if _BUILDER_CLASS is not None:
        return _BUILDER_CLASS
    tfds = _import_tfds()

    class GlueTsvConfig(tfds.core.BuilderConfig):
        def __init__(self, *, task: GlueTask, **kwargs):
            super().__init__(name=task.name, **kwargs)
            self.task = task

    class GlueTsv(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        """GLUE from its official TSV files in `manual_dir` (`<manual_dir>/<Task>/*.tsv`)."""

        VERSION = tfds.core.Version("1.0.0")
        BUILDER_CONFIGS = [GlueTsvConfig(task=t) for t in GLUE_TASKS.values()]
        MANUAL_DOWNLOAD_INSTRUCTIONS = "GLUE's TSV distribution: <manual_dir>/<Task>/{train,dev,test}.tsv"

        def _info(self):
            return self.dataset_info_from_configs(features=_features(tfds, self.builder_config.task))

        def _split_generators(self, dl_manager):
            task = self.builder_config.task
            folder = Path(dl_manager.manual_dir) / task.dirname
            # Only the files present: QNLI ships here without train.tsv, and a missing split is
            # reported when asked for, by name.
            return {split: self._generate_examples(folder / name, split)
                    for split, name in task.files if (folder / name).is_file()}

        def _generate_examples(self, path, split):
            for ex in read_tsv(path, self.builder_config.task, split):
                yield ex["idx"], ex

        # tfds prints "Downloading and preparing dataset Unknown size ..." and "... downloaded and prepared to ..."
        # on stdout, for a download that is a copy of local files taking seconds: a job's stdout is its own.
        def _log_download_bytes(self):
            pass

        def _log_download_done(self):
            pass

    _BUILDER_CLASS = GlueTsv
    return GlueTsv


def _import_tfds() -> Any:
    try:  # imported here: tensorflow-datasets takes ~0.4 s to import, and reading a TSV needs none of it
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(f"GLUE needs tensorflow-datasets ({e.name} is missing): "
                          "pip install tensorflow-datasets importlib_resources array_record") from None
    return tfds


def default_tfds_dir() -> Path:
    return default_cache_dir().parent / "tfds"


def _fingerprint(folder: Path, task: GlueTask) -> str:
    """Names, sizes and mtimes of the task's files: edited TSVs prepare a fresh dataset."""
    stats = []
    for _, name in task.files:
        p = folder / name
        if p.is_file():
            st = p.stat()
            stats.append([name, st.st_size, st.st_mtime_ns])
    blob = json.dumps([str(folder.resolve()), stats, _READER_VERSION])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def local_builder(task: GlueTask | str, data_dir: str | Path, tfds_dir: str | Path | None = None) -> Any:
    """The GlueTsv builder for `task`, prepared (once) from `data_dir/<Task>/` in array_record."""
    task = glue_task(task) if isinstance(task, str) else task
    tfds = _import_tfds()
    folder = Path(data_dir) / task.dirname
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no GLUE {task.dirname} folder in --data-dir {data_dir}")
    root = Path(tfds_dir) if tfds_dir else default_tfds_dir()
    with quiet_tfds(tfds):
        builder = _builder_class()(config=task.name, data_dir=str(root / f"glue_tsv-{_fingerprint(folder, task)}"),
                                   file_format="array_record")
        if not builder.is_prepared():
            for split, name in task.files:  # tfds would end a split without examples in its own AssertionError
                if (folder / name).is_file() and next(read_tsv(folder / name, task, split), None) is None:
                    raise DataError(f"{folder / name}: no examples in it (an empty file, or only its header)")
            tfds.disable_progress_bar()  # tfds' nested bars would interleave with ours
            builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(data_dir)))
    return builder


# ---- GLUE downloaded: the files tfds' glue builder fetches ----------------------------------------------

def _reachable(url: str, timeout: float) -> bool:
    """Whether the host of `url` accepts a connection on its port (443 for https, 80 for http, unless it names one)."""
    # DNS lookups ignore socket timeouts, so the whole attempt runs in a thread we stop waiting for.
    ok: list[bool] = []
    parts = urlparse(url)
    host, port = parts.hostname or "", parts.port or (80 if parts.scheme == "http" else 443)

    def attempt():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok)


def remote_builder(task: GlueTask | str, tfds_dir: str | Path | None = None, timeout: float = 5.0) -> Any:
    """GLUE from its own host: the files tfds' glue/<task> builder downloads, fetched by tfds' download manager
    (checked against the sums tfds registers, kept under <tfds_dir>/downloads), unpacked here into GLUE's TSV
    layout under <tfds_dir>/glue_files, and prepared by GlueTsv as --data-dir's files are. tfds' own builder
    unpacks its download with TensorFlow (its extractor calls tf.compat.as_text), which gpt1-jax does not install:
    it downloaded, then ended in "ExtractError: ... No module named 'tensorflow'". Offline: one line, at once."""
    task = glue_task(task) if isinstance(task, str) else task
    tfds = _import_tfds()
    import tensorflow_datasets.text.glue as tfds_glue  # GLUE's addresses, and the sums tfds registers for them

    root = Path(tfds_dir) if tfds_dir else default_tfds_dir()
    files = root / "glue_files"
    if not (files / task.dirname).is_dir():
        urls = _glue_urls(tfds_glue, task)
        first = next(iter(urls.values()))
        if not _reachable(first, timeout):
            raise GlueDownloadError(
                f"cannot reach {urlparse(first).hostname} to download GLUE {task.dirname} "
                f"(offline?): use --data-dir DIR with GLUE's TSV files ({task.dirname}/train.tsv, dev.tsv, test.tsv)")
        manager = tfds.download.DownloadManager(download_dir=root / "downloads", url_infos=tfds_glue.Glue.url_infos,
                                                dataset_name="glue")
        with quiet_tfds(tfds):
            downloaded = {k: Path(v) for k, v in manager.download(urls).items()}
        _unpack(task, downloaded, files)
    return local_builder(task, files, root)


def _glue_urls(tfds_glue: Any, task: GlueTask) -> dict[str, str]:
    """What tfds' glue/<task> downloads: GLUE's zip of the task's TSV files; for MRPC, Microsoft's two files and
    GLUE's list of the pairs it moved to dev."""
    if task.name == "mrpc":
        return {"dev_ids": tfds_glue._MRPC_DEV_IDS, "train": tfds_glue._MRPC_TRAIN, "test": tfds_glue._MRPC_TEST}
    return {"zip": next(c for c in tfds_glue.Glue.BUILDER_CONFIGS if c.name == task.name).data_url}


def _unpack(task: GlueTask, downloaded: dict[str, Path], files: Path) -> None:
    """`files/<Task>/` with the task's TSV files as GLUE distributes them, whole or not at all (a killed unpack's
    temporary folder is swept by the next one, as the token cache's are)."""
    with staging_folder(files / task.dirname, dead_quiet_s=10.0) as tmp:
        if task.name == "mrpc":
            _mrpc_files(downloaded, tmp)
        else:
            with zipfile.ZipFile(downloaded["zip"]) as archive:
                names = set(archive.namelist())
                for _, name in task.files:
                    if f"{task.dirname}/{name}" in names:
                        (tmp / name).write_bytes(archive.read(f"{task.dirname}/{name}"))
        try:
            os.rename(tmp, files / task.dirname)
        except OSError:  # another process unpacked it first: the same files
            if not (files / task.dirname).is_dir():
                raise


def _mrpc_files(downloaded: dict[str, Path], out: Path) -> None:
    """GLUE's MRPC train/dev/test.tsv from Microsoft's files, as GLUE's download script writes them: dev is the
    training pairs GLUE lists, train the others (Microsoft's header, byte-order mark and all); test is numbered
    and has no labels."""
    dev_ids = {tuple(line.strip().split("\t"))
               for line in downloaded["dev_ids"].read_text(encoding="utf-8").split("\n") if line.strip()}
    # "\n" only, as read_tsv splits: splitlines would also break a sentence at a form feed or U+2028
    header, *rows = downloaded["train"].read_text(encoding="utf-8").rstrip("\r\n").split("\n")
    header = header.rstrip("\r")
    train, dev = [header], [header]
    for row in filter(str.strip, rows):
        label, id1, id2, s1, s2 = row.strip().split("\t")
        (dev if (id1, id2) in dev_ids else train).append("\t".join((label, id1, id2, s1, s2)))
    _, *tests = downloaded["test"].read_text(encoding="utf-8").split("\n")
    test = ["index\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    for i, row in enumerate(filter(str.strip, tests)):
        _, id1, id2, s1, s2 = row.strip().split("\t")
        test.append("\t".join((str(i), id1, id2, s1, s2)))
    for name, lines in (("train.tsv", train), ("dev.tsv", dev), ("test.tsv", test)):
        (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


# ---- reading -----------------------------------------------------------------------------------------

def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


def load_split(task: GlueTask | str, split: str, data_dir: str | Path | None = None,
               tfds_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """All examples of one split as plain dicts (str text, int/float label, int idx), in file order; read once
    per process (`_READ`).

    `data_dir`: GLUE's TSV distribution (our builder); None: tfds' real glue builder (downloads)."""
    task = glue_task(task) if isinstance(task, str) else task
    builder = local_builder(task, data_dir, tfds_dir) if data_dir is not None else remote_builder(task, tfds_dir)
    if split not in builder.info.splits:
        where = Path(data_dir) / task.dirname / dict(task.files).get(split, "?") if data_dir else f"glue/{task.name}"
        raise FileNotFoundError(f"{where}: GLUE {task.dirname} has no {split} split here")
    key = (str(builder.data_dir), split)
    if key not in _READ:
        source = builder.as_data_source(split=split)
        records = source.__getitems__(list(range(len(source))))
        examples = [{k: _decode(v) for k, v in r.items()} for r in records]
        # array_record keeps shard order, not necessarily file order: idx restores it.
        examples.sort(key=lambda e: e["idx"])
        while len(_READ) >= _READ_MAX:
            _READ.pop(next(iter(_READ)))
        _READ[key] = tuple(examples)
    return list(_READ[key])


# Splits already read by this process (oldest first), by prepared dataset and split: tfds decodes ~5,000
# examples a second, so SST-2's train split costs ~15 s, and a fine-tuning run reads it twice (its BPE, its
# batches) as does every run of a sweep. A prepared dataset never changes (an edited TSV gets a new folder,
# `_fingerprint`). The examples are shared between callers, who only read them.
_READ: dict[tuple[str, str], tuple[dict[str, Any], ...]] = {}
_READ_MAX = 8


def split_available(task: GlueTask | str, split: str, data_dir: str | Path | None) -> bool:
    """Whether a local TSV distribution has the split's file (remote: assume yes)."""
    task = glue_task(task) if isinstance(task, str) else task
    if data_dir is None:
        return True
    name = dict(task.files).get(split)
    return name is not None and (Path(data_dir) / task.dirname / name).is_file()


# ---- the official metrics ----------------------------------------------------------------------------
# GLUE's definitions in NumPy, equal to scikit-learn's and scipy's functions (tests/unit/test_glue.py checks
# them against both): those take ~3.5 s to import, paid by every fine-tuning process at its first score.

def _matthews(labels, preds) -> float:
    """sklearn.metrics.matthews_corrcoef: the covariance form over the confusion matrix, 0 when either side
    is constant."""
    labels, preds = np.asarray(labels), np.asarray(preds)
    classes, both = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    t, p = both[:len(labels)], both[len(labels):]
    confusion = np.zeros((len(classes), len(classes)), np.int64)
    np.add.at(confusion, (t, p), 1)
    t_sum, p_sum = confusion.sum(1).astype(np.float64), confusion.sum(0).astype(np.float64)
    n, correct = float(len(labels)), float(np.trace(confusion))
    cov_tp = correct * n - t_sum @ p_sum
    cov_pp, cov_tt = n * n - p_sum @ p_sum, n * n - t_sum @ t_sum
    return 0.0 if cov_pp * cov_tt == 0 else float(cov_tp / np.sqrt(cov_tt * cov_pp))


def _accuracy(labels, preds) -> float:
    return float(np.mean(np.asarray(labels) == np.asarray(preds)))


def _f1(labels, preds) -> float:
    """Of the positive class (1: equivalent / duplicate), as GLUE; 0 when there is nothing to find."""
    labels, preds = np.asarray(labels) == 1, np.asarray(preds) == 1
    tp = np.sum(labels & preds)
    missed = np.sum(labels ^ preds)
    return 0.0 if tp + missed == 0 else float(2 * tp / (2 * tp + missed))


def _pearson(labels, preds) -> float:
    """scipy.stats.pearsonr's r; NaN when either side is constant."""
    x, y = (np.asarray(v, np.float64) for v in (preds, labels))
    x, y = x - x.mean(), y - y.mean()
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    return float("nan") if nx == 0 or ny == 0 else float(np.clip((x / nx) @ (y / ny), -1.0, 1.0))


def _ranks(x) -> np.ndarray:
    """scipy.stats.rankdata's average ranks (ties share the mean of their positions, from 1)."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    starts = np.r_[True, x[order][1:] != x[order][:-1]]
    first = np.flatnonzero(starts)
    mean_rank = first + (np.diff(np.r_[first, len(x)]) + 1) / 2.0
    ranks = np.empty(len(x))
    ranks[order] = mean_rank[np.cumsum(starts) - 1]
    return ranks


def _spearman(labels, preds) -> float:
    return _pearson(_ranks(labels), _ranks(preds))


METRICS = {"matthews_corr": _matthews, "accuracy": _accuracy, "f1": _f1, "pearson": _pearson, "spearman": _spearman}


def compute_metrics(names: tuple[str, ...] | list[str], labels, preds) -> dict[str, float]:
    """The official metrics as fractions (the paper's tables show them x100)."""
    return {name: METRICS[name](labels, preds) for name in names}
