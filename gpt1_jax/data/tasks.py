"""Fine-tuning tasks (GLUE's and RACE) behind one interface, and their examples as padded batches.

A `Task` knows how to load a split, which strings of an example to tokenise, how those tokens become the
head's input layout (gpt1_jax/data/layout.py), and how predictions are scored with the official metrics.
`encode_split` tokenises a split once; `make_batch` pads rows of it to fixed shapes; `EpochBatches` serves
them epoch after epoch, resumably, in `epoch_order`; `write_predictions` / `write_submission` write GLUE's
file formats.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from gpt1_jax.config import ConfigError, FinetuneConfig, task_key
from gpt1_jax.data import glue
from gpt1_jax.data.layout import Markers, layout, max_segment_len, pad_sequences
from gpt1_jax.data.race import SPLITS as RACE_SPLITS, parse_levels, race_reader
from gpt1_jax.files import atomic_write_text
from gpt1_jax.metrics import Bar


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    kind: str  # one of gpt1_jax.data.layout.KINDS
    n_outputs: int
    regression: bool
    metrics: tuple[str, ...]  # the first picks the best epoch
    dev_splits: tuple[str, ...]
    test_splits: tuple[str, ...]
    label_names: tuple[str, ...] | None
    load: Callable[[str], list[dict]]  # split -> examples (text fields, label, idx)
    texts: Callable[[dict], list[str]]  # the strings of one example, to tokenise
    segments: Callable[[list[list[int]], int], tuple]  # their tokens, segment length -> layout()'s segments
    score: Callable[[list[dict], np.ndarray], dict[str, float]]  # examples, predictions -> metrics
    submission: Callable[[str], str] | None = None  # test split -> GLUE file stem
    submit_names: bool = False  # the GLUE server wants label names (MNLI, QNLI, RTE), not indices


def make_task(config: FinetuneConfig, data_dir: str | None, tfds_dir: str | None = None,
              progress: bool = False) -> Task:
    """`progress`: a bar of the reading of RACE's archive (seconds per split), on process 0."""
    key = task_key(config.task)
    if key == "race":
        return _race_task(config, data_dir, progress and jax.process_index() == 0)
    g = glue.glue_task(key)

    def score(examples, preds):
        labels = np.asarray([e["label"] for e in examples])
        return glue.compute_metrics(g.metrics, labels, preds)

    return Task(
        name=g.name, kind=g.kind, n_outputs=g.n_outputs, regression=g.regression, metrics=g.metrics,
        dev_splits=g.dev_splits, test_splits=tuple(s for s, _ in g.test_splits), label_names=g.label_classes,
        load=lambda split: glue.load_split(g, split, data_dir, tfds_dir),
        texts=lambda ex: [ex[f] for f in g.features],
        segments=lambda toks, keep: tuple(toks),
        score=score, submission=g.submission_name, submit_names=g.name in ("mnli", "qnli", "rte"),
    )


def _race_task(config: FinetuneConfig, data_dir: str | None, progress: bool = False) -> Task:
    if not data_dir:
        raise ConfigError("task race reads RACE from a local race.tar.gz: pass --data-dir PATH")
    path = Path(data_dir)
    levels = parse_levels(config.race_levels)  # refused now, before the passages are read

    def segments(toks, keep):
        # Context = article then question ([z; q] in the paper); the article gives way so the
        # question survives the n_ctx//2 - 2 cut. Answers are the options.
        article, question, *options = toks
        question = question[:keep]
        return article[: keep - len(question)] + question, options

    def score(examples, preds):
        labels = np.asarray([e["label"] for e in examples])
        out = {"accuracy": float(np.mean(labels == preds))}
        for level in levels:
            sel = np.asarray([e["level"] == level for e in examples])
            if sel.any() and len(levels) > 1:
                out[f"accuracy_{level}"] = float(np.mean(labels[sel] == preds[sel]))
        return out

    return Task(
        name="race", kind="multiple_choice", n_outputs=1, regression=False, metrics=("accuracy",),
        dev_splits=("validation",), test_splits=("test",), label_names=None,
        load=race_reader(path, tuple(RACE_SPLITS), levels, progress),  # one reading for every split the run reads
        texts=lambda ex: [ex["article"], ex["question"], *ex["options"]],
        segments=segments, score=score,
    )


@dataclasses.dataclass
class Encoded:
    """One split ready for batching: each example's N token sequences, labels, original examples."""

    seqs: list[list[list[int]]]
    labels: np.ndarray
    examples: list[dict]
    cut: int = 0  # examples the layout truncated (a text longer than its segment keeps: max_segment_len)
    of: int = 0  # the examples of the whole split (more than len(seqs) where a subset was drawn)

    def digest(self) -> str:
        """sha256 of the token sequences and labels, in order: what a run trained on, whatever files it came from."""
        h = hashlib.sha256(json.dumps(self.seqs, separators=(",", ":")).encode())
        h.update(np.ascontiguousarray(self.labels).tobytes())
        return h.hexdigest()


ENCODE_EXAMPLES = 1024  # examples per encode_batch call: a bar's step, enough texts to keep the Rust threads busy


def encode_split(task: Task, examples: list[dict], tok, n_ctx: int, of: int = 0, *, progress: bool = False,
                 split: str = "") -> Encoded:
    """`examples` of `split` tokenised and laid out; `progress`: a bar of them on stderr (RACE's training split
    takes minutes)."""
    markers = Markers.of(tok)
    keep = max_segment_len(n_ctx)
    seqs, cut = [], 0
    with Bar(total=len(examples), desc=f"encoding {task.name} {split}".rstrip(), unit="example",
             disable=not progress) as bar:
        for first in range(0, len(examples), ENCODE_EXAMPLES):
            texts = [task.texts(ex) for ex in examples[first: first + ENCODE_EXAMPLES]]
            flat = [t for ts in texts for t in ts]
            ids = tok.encode_batch(flat) if flat else []
            i = 0
            for ts in texts:
                toks = ids[i: i + len(ts)]
                i += len(ts)
                seqs.append(layout(task.kind, task.segments(toks, keep), markers, n_ctx))
                # against the same layout uncut (RACE's article gives way to its question: no single text says so)
                whole = layout(task.kind, task.segments(toks, sum(map(len, toks))), markers,
                               4 * sum(map(len, toks)) + 8)
                cut += sum(map(len, seqs[-1])) < sum(map(len, whole))
            bar.update(len(texts))
    dtype = np.float32 if task.regression else np.int32
    labels = np.asarray([ex["label"] for ex in examples], dtype)
    return Encoded(seqs, labels, examples, cut, of or len(examples))


def bucket_len(n: int, n_ctx: int) -> int:
    """The padded length of a batch whose longest sequence has n tokens, capped at n_ctx: the next power of two
    up to 32 (at least 16), then the next multiple of 16. A shape compiles once, so few shapes; but padding
    to powers of two above 32 wasted a fifth of a fine-tuning sweep's compute: 16-token steps there cut the
    padded tokens of a full-size Table 5 run by 22% (RTE 39%, STS-B 28%, SST-2 17%: experiments/paper/cost.py)
    for at most 14 shapes up to 256."""
    if n <= 32:
        return min(n_ctx, max(16, 1 << (max(n, 1) - 1).bit_length()))
    return min(n_ctx, -(-n // 16) * 16)


def make_batch(enc: Encoded, rows: np.ndarray, batch_size: int, n_ctx: int, markers: Markers) -> dict[str, np.ndarray]:
    """Rows of `enc` padded to `batch_size` with weight-0 filler examples (shapes stay fixed)."""
    seqs = [enc.seqs[r] for r in rows]
    n_seq = len(seqs[0])
    filler = [[markers.start, markers.classify]] * n_seq
    seqs = seqs + [filler] * (batch_size - len(seqs))
    length = bucket_len(max(len(s) for ex in seqs for s in ex), n_ctx)
    tokens, mask, clf_pos = pad_sequences(seqs, length)
    labels = np.zeros((batch_size,), enc.labels.dtype)
    labels[: len(rows)] = enc.labels[rows]
    labels = np.where(labels < 0, 0, labels) if labels.dtype != np.float32 else labels  # test rows: -1
    weights = np.zeros((batch_size,), np.float32)
    weights[: len(rows)] = 1.0
    return {"tokens": tokens, "mask": mask, "clf_pos": clf_pos, "labels": labels, "weights": weights}


def subset(n: int, k: int, seed: int) -> np.ndarray:
    """A fixed random subset of k of n indices, in order (all of them when k is 0 or >= n)."""
    if not k or k >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:k])


HOLDOUT_SEED = 20180611  # the held-out slice is drawn with its own seed: the same examples for every run's seed


def train_rows(n: int, config: FinetuneConfig) -> tuple[np.ndarray, np.ndarray]:
    """(the run's training indices, the held-out ones) of a training split of n examples: round(n ·
    holdout_fraction) held out, the same for every seed and arm; the training subset (max_train_examples, drawn
    with the run's seed) comes from the rest, so no held-out example is ever trained on."""
    k = int(round(n * config.holdout_fraction))
    order = np.random.default_rng(HOLDOUT_SEED).permutation(n) if k else np.arange(n)
    rest, held = np.sort(order[k:]), np.sort(order[:k])
    return rest[subset(len(rest), config.max_train_examples, config.seed)], held


@dataclasses.dataclass
class Splits:
    train: Encoded
    dev: dict[str, Encoded]
    test: dict[str, Encoded]
    n_ctx: int
    holdout: Encoded | None = None  # the slice of the training split the best epoch is chosen on (holdout_fraction)


def encode_task(task: Task, config: FinetuneConfig, tok, n_ctx: int, predict_test: bool,
                progress: bool = False, train_examples: list | None = None) -> Splits:
    """`progress`: a bar of each split's encoding, on process 0. `train_examples`: the train split as `task.load`
    gave it, where the caller read it already (a run from scratch trains its BPE on it)."""
    shown = progress and jax.process_index() == 0

    def load(split, k, seed):
        examples = task.load(split)
        return encode_split(task, [examples[i] for i in subset(len(examples), k, seed)], tok, n_ctx, len(examples),
                            progress=shown, split=split)

    examples = task.load("train") if train_examples is None else train_examples
    rows, held = train_rows(len(examples), config)
    train = encode_split(task, [examples[i] for i in rows], tok, n_ctx, progress=shown, split="train")
    if not train.seqs:
        raise ConfigError(f"task {task.name}: the train split is empty")
    if config.holdout_fraction and not held.size:
        raise ConfigError(f"task {task.name}: holdout_fraction={config.holdout_fraction} of {len(examples)} training "
                          "examples holds none out; raise it")
    holdout = encode_split(task, [examples[i] for i in held], tok, n_ctx, progress=shown,
                           split="held-out train") if held.size else None
    dev = {s: load(s, config.max_eval_examples, 0) for s in task.dev_splits}
    test = {s: load(s, config.max_eval_examples, 0) for s in task.test_splits} if predict_test else {}
    return Splits(train, dev, test, n_ctx, holdout)


def prepare_once(task: Task, splits) -> None:
    """Multi-process: process 0 prepares the splits (tensorflow-datasets writes them once) before the
    others read them."""
    if jax.process_count() == 1:
        return
    if jax.process_index() == 0:
        for split in splits:
            task.load(split)
    multihost_utils.sync_global_devices("finetune: task data prepared")


def process_rows(global_batch: int) -> slice:
    """This process's rows of a global batch (every process builds the same global batch)."""
    n = global_batch // jax.process_count()
    return slice(jax.process_index() * n, (jax.process_index() + 1) * n)


GROUP_BATCHES = 50  # batches per length-sorted group of `group_by_length` (HF Trainer's megabatch)


def example_lengths(enc: Encoded) -> np.ndarray:
    """Each example's longest sequence in tokens: what a batch holding it is padded to (at least)."""
    return np.fromiter((max(len(s) for s in ex) for ex in enc.seqs), np.int64, len(enc.seqs))


def epoch_order(lengths: np.ndarray, batch_size: int, seed: int, epoch: int, group_by_length: bool) -> np.ndarray:
    """The training examples of `epoch` (from 1) in visiting order, batch after batch: a (seed, epoch)-seeded
    permutation. With `group_by_length`, that permutation is cut into groups of GROUP_BATCHES batches, each
    group sorted by length and cut into batches, and the whole batches shuffled (the short last one stays
    last): every batch still holds a random draw of examples, but of near-equal lengths, so a batch pads
    little (a full-size Table 5 run computes over about half the tokens: experiments/paper/README.md)."""
    order = np.random.default_rng([seed, epoch]).permutation(len(lengths))
    if not group_by_length:
        return order
    size = GROUP_BATCHES * batch_size
    groups = [order[i: i + size] for i in range(0, len(order), size)]
    grouped = np.concatenate([g[np.argsort(-lengths[g], kind="stable")] for g in groups])
    whole = len(order) // batch_size * batch_size
    batches = grouped[:whole].reshape(-1, batch_size)
    batches = batches[np.random.default_rng([seed, epoch, 1]).permutation(len(batches))]
    return np.concatenate([batches.ravel(), grouped[whole:]])


def eval_order(enc: Encoded) -> np.ndarray:
    """The examples shortest first: the order evaluation batches them in, so each batch pads little."""
    return np.argsort(example_lengths(enc), kind="stable")


def prediction_batches(enc: Encoded, batch_size: int, n_ctx: int, markers: Markers):
    """(rows, this process's rows of their batch) for each prediction batch of `enc`: the examples in `eval_order`,
    shortest first, so each pads little (Table 5's dev sets and held-out slices: 27-55% fewer tokens than in file
    order), the last batch padded with filler."""
    by_length = eval_order(enc)
    for first in range(0, len(enc.seqs), batch_size):
        rows = by_length[first: first + batch_size]
        batch = make_batch(enc, rows, batch_size, n_ctx, markers)
        yield rows, {k: v[process_rows(batch_size)] for k, v in batch.items()}


class EpochBatches:
    """One epoch after another, each in its `epoch_order`; the last batch of an epoch is padded with weight-0
    rows. Its position is the step alone. Yields this process's rows of each global batch."""

    def __init__(self, enc: Encoded, batch_size: int, seed: int, n_ctx: int, markers: Markers,
                 group_by_length: bool = False):
        self.enc, self.batch_size, self.seed, self.n_ctx, self.markers = enc, batch_size, seed, n_ctx, markers
        self.group_by_length = group_by_length
        self.lengths = example_lengths(enc)
        self.steps_per_epoch = math.ceil(len(enc.seqs) / batch_size)
        self.step = 0
        self.rows = process_rows(batch_size)
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its order): one sort per epoch, not per step

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch + 1

    def __next__(self) -> dict:
        epoch, b = divmod(self.step, self.steps_per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = epoch, epoch_order(self.lengths, self.batch_size, self.seed, epoch + 1, self.group_by_length)
        order = self._order[1]
        self.step += 1
        batch = make_batch(self.enc, order[b * self.batch_size: (b + 1) * self.batch_size], self.batch_size,
                           self.n_ctx, self.markers)
        return {k: v[self.rows] for k, v in batch.items()}

    def state(self) -> dict:
        return {"step": self.step}

    def restore(self, state: dict) -> None:
        self.step = int(state["step"])


# ---- outputs in GLUE's formats ----------------------------------------------------------------------

def format_label(task: Task, value, names: bool) -> str:
    if task.regression:
        return f"{float(value):.6g}"
    if names and task.label_names:
        return task.label_names[int(value)]
    return str(int(value))


def write_predictions(path: Path, task: Task, enc: Encoded, preds: np.ndarray) -> None:
    lines = ["index\tprediction\tlabel"]
    for ex, p in zip(enc.examples, preds):
        label = format_label(task, ex["label"], True) if ex["label"] != -1 else ""
        lines.append(f"{ex['idx']}\t{format_label(task, p, True)}\t{label}")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")


def write_submission(path: Path, task: Task, enc: Encoded, preds: np.ndarray) -> None:
    """GLUE's server format: `index<TAB>prediction`, labels as indices or (MNLI, QNLI, RTE) names."""
    lines = ["index\tprediction"] + [f"{ex['idx']}\t{format_label(task, p, task.submit_names)}"
                                     for ex, p in zip(enc.examples, preds)]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")
