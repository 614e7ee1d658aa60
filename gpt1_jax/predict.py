"""A finished fine-tuning run's classifier on new inputs: `gpt1-jax predict --workdir RUN INPUT`.

The run folder is the whole model: config.yaml says the task, n_ctx and the architecture, tokenizer.json the
ids, results.json the best epoch's step, whose checkpoint the run keeps whatever keep_checkpoints says. Inputs
are encoded as the run encoded its dev split (gpt1_jax/data/tasks.py `encode_split`: the same markers and
segment cut) and scored as its dev evaluation scored them (gpt1_jax/finetune.py `predict_split`: batches of the
run's eval batch size, shortest first, so a few padded lengths compile, not one program per input). So the
run's own dev file gives back exactly its predictions/<split>.tsv.

INPUT is a TSV whose header names the task's text columns as GLUE's dev/test files do (RTE: sentence1,
sentence2; SST-2: sentence; MRPC: #1 String, #2 String), in any order, others ignored (a label, say); its
`index` column, when there is one, names each row in the output (else its position, from 0). CoLA's header-less
dev/train layout is read too. For one-text tasks (CoLA, SST-2) plain text also goes, one input per line:
`auto` takes a file for a TSV when its first line holds a tab or is the column's name, else for plain text.
The output is GLUE's submission layout, `index<TAB>prediction`: label names, as predictions/<split>.tsv
writes them, or STS-B's score.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path

import jax
import numpy as np

from gpt1_jax.config import FinetuneConfig, MeshConfig, load_yaml
from gpt1_jax.data import glue
from gpt1_jax.data.layout import Markers, max_segment_len
from gpt1_jax.data.tasks import Task, format_label, encode_split, make_task
from gpt1_jax.errors import ConfigError, DataError, WorkdirError
from gpt1_jax.files import atomic_write_text, check_new_file
from gpt1_jax.finetune import predict_split, task_trainer
from gpt1_jax.integrity import checkpoint_steps, newest_checkpoint
from gpt1_jax.metrics import Bar, say
from gpt1_jax.tokenizer import GPT1Tokenizer
from gpt1_jax.weights import scored_params
from gpt1_jax.workdir import read as read_identity
from gpt1_jax.workdir import read_record

FORMATS = ("auto", "tsv", "text")


# ---- the run ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class FinishedRun:
    workdir: Path
    config: FinetuneConfig  # as the run resolved it: its model, n_ctx, eval batch size
    task: Task
    glue: glue.GlueTask  # the TSV columns of the task's files
    tokenizer: GPT1Tokenizer
    epoch: int  # the best one
    step: int  # its checkpoint


def open_run(workdir: str | Path) -> FinishedRun:
    """Reads what a finished fine-tuning run recorded; WorkdirError (one line) for any other folder."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise WorkdirError(f"--workdir {workdir}: no such folder (give a finished `gpt1-jax finetune` run's --workdir)")
    held = read_identity(workdir)
    if held is None or held.kind != "finetune":
        what = "no gpt1-jax run" if held is None else held.describe()
        raise WorkdirError(f"{workdir} holds {what}, not a fine-tuning run: predict reads the classifier of a "
                           "finished `gpt1-jax finetune --workdir` folder")
    config = load_yaml(FinetuneConfig, workdir / "config.yaml")
    if not (workdir / "results.json").is_file():
        done = newest_checkpoint(workdir / "checkpoints")
        raise WorkdirError(f"{workdir} holds a fine-tuning run of {held.task} that has not finished (no results.json; "
                           f"{'no checkpoint yet' if done is None else f'step {done}'} of {config.optim.total_steps}): "
                           "run its finetune command again to finish it, then predict")
    if held.task == "race":
        # An article runs over several lines, so no TSV row holds one; RACE's own files are its archive.
        raise ConfigError(f"{workdir} holds a RACE run: predict reads TSV rows, which cannot hold RACE's articles of "
                          f"several paragraphs; its dev predictions are in {workdir / 'predictions'}")
    results = read_record(workdir / "results.json", "fine-tune again in another --workdir")
    step = results.get("step")
    if step not in checkpoint_steps(workdir / "checkpoints"):
        raise WorkdirError(f"{workdir}: the best epoch's checkpoint ({f'step {step}' if step else 'its step'}) is gone "
                           "(a run older than gpt1-jax keeping it, or deleted): fine-tune again in another --workdir")
    return FinishedRun(workdir, config, make_task(config, None), glue.glue_task(config.task),
                       GPT1Tokenizer.load(workdir / "tokenizer.json"), results.get("epoch"), step)


def run_params(run: FinishedRun):
    """The params (transformer and head) of the best epoch's checkpoint as the run scored them: schedule-free runs
    at their x sequence, as finetune.DevEvaluation does."""
    return scored_params(run.workdir, run.config, run.step)[0]


# ---- the inputs -------------------------------------------------------------------------------------

def read_inputs(g: glue.GlueTask, text: str, where: str, fmt: str = "auto") -> list[dict]:
    """The examples of an input file's `text` (named `where` in errors), as `Task.texts` reads them, `idx` being
    each one's name in the output."""
    if fmt not in FORMATS:
        raise ConfigError(f"input format {fmt!r}; known: {', '.join(FORMATS)}")
    lines = text.split("\n")  # "\n" only, as glue.read_tsv: \x1c, \u2028, ... are text inside a field
    if lines[-1] == "":
        lines.pop()
    lines = [line.removesuffix("\r") for line in lines]
    if not any(line.strip() for line in lines):
        raise DataError(f"{where}: no inputs in it (an empty file)")
    pairs = (f"{g.dirname} takes {len(g.columns)} texts an input: give a TSV with the columns {', '.join(g.columns)} "
             "(plain text, one input per line, is for CoLA and SST-2)")
    if fmt == "auto" and len(g.columns) > 1 and "\t" not in lines[0]:
        raise DataError(f"{where}:1: no tab in it: {pairs}")
    if fmt == "auto":
        fmt = "tsv" if "\t" in lines[0] or lines[0] in g.columns else "text"
    if fmt == "text":
        if len(g.columns) > 1:
            raise ConfigError(f"--format text: {pairs}")
        return [_example(g, [line], i) for i, line in enumerate(lines)]
    return _tsv_examples(g, lines, where)


def _example(g: glue.GlueTask, texts: list[str], idx) -> dict:
    return {**dict(zip(g.features, texts)), "label": -1.0 if g.regression else -1, "idx": idx}


def _tsv_examples(g: glue.GlueTask, lines: list[str], where: str) -> list[dict]:
    header = lines[0].split("\t")
    positions = dict(g.headerless_columns)
    if positions and len(header) == 4 and header[positions["label"]] in ("0", "1"):  # CoLA's dev/train layout
        columns, index, rows, first = [positions[f] for f in g.features], None, lines, 1
    else:
        if missing := [c for c in g.columns if c not in header]:
            text = " (plain text, one input per line: --format text)" if len(g.columns) == 1 else ""
            raise DataError(f"{where}:1: the header lacks the column{'s' * (len(missing) > 1)} {g.dirname} needs: "
                            f"{', '.join(missing)}; found {', '.join(header)}{text}")
        columns, rows, first = [header.index(c) for c in g.columns], lines[1:], 2
        index = header.index("index") if "index" in header else None
    if not rows:
        raise DataError(f"{where}: no inputs in it (only its header)")
    examples = []
    for n, line in enumerate(rows):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataError(f"{where}:{n + first}: expected {len(header)} tab-separated fields, as the "
                            f"{'header' if first == 2 else 'first line'} has, got {len(fields)}")
        examples.append(_example(g, [fields[c] for c in columns], n if index is None else fields[index]))
    return examples


def load_inputs(g: glue.GlueTask, inputs, fmt: str = "auto") -> list[dict]:
    """`inputs`: a file (`-`: standard input) or, from Python, texts (one-text tasks) or tuples of the task's texts."""
    if not isinstance(inputs, (str, os.PathLike)):
        rows = [[x] if isinstance(x, str) else list(x) for x in inputs]
        if not rows:
            raise DataError("no inputs to predict")
        if bad := next((r for r in rows if len(r) != len(g.features)), None):
            raise DataError(f"{g.dirname} takes {len(g.features)} text{'s' * (len(g.features) > 1)} an input "
                            f"({', '.join(g.features)}), got {len(bad)}: {bad!r:.80}")
        return [_example(g, row, i) for i, row in enumerate(rows)]
    where = "<stdin>" if str(inputs) == "-" else str(inputs)
    raw = sys.stdin.buffer.read() if where == "<stdin>" else Path(inputs).read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # -sig: a byte-order mark (MRPC's files have one) is not text
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 text (byte {e.start})") from None
    return read_inputs(g, text, where, fmt)


# ---- predictions ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Predictions:
    run: FinishedRun
    index: list  # each input's name: its `index` column, else its position
    values: np.ndarray  # class index per input, or the score (STS-B)
    cut: int  # inputs with a text longer than a segment keeps (cut to it, as the run cut its own)

    def labels(self) -> list[str]:
        """As predictions/<split>.tsv writes them: label names, or the score."""
        return [format_label(self.run.task, v, True) for v in self.values]

    def tsv(self) -> str:
        return "".join(["index\tprediction\n", *(f"{i}\t{p}\n" for i, p in zip(self.index, self.labels()))])


def predict(workdir: str | Path, inputs, *, fmt: str = "auto", batch_size: int | None = None,
            progress: bool = False) -> Predictions:
    """The classifier of the finished fine-tuning run in `workdir` on `inputs` (`load_inputs`), batched by
    `batch_size` (None: the run's eval batch size) over all devices; `progress`: a bar of the batches."""
    run = open_run(workdir)
    examples = load_inputs(run.glue, inputs, fmt)
    config, task = run.config, run.task
    n_ctx = config.n_ctx or config.model.n_positions
    enc = encode_split(task, examples, run.tokenizer, n_ctx)
    if enc.cut and jax.process_index() == 0:  # a warning: said with or without a bar
        say(f"{enc.cut} of {len(examples)} inputs have a text longer than a segment's {max_segment_len(n_ctx)} tokens "
            f"(n_ctx {n_ctx}): cut to it, as the run cut its own", who=f"predict {task.name}")
    # The run's mesh may name more devices than this machine has: data-parallel over the ones here.
    trainer = task_trainer(config, task, MeshConfig())
    batch = batch_size or config.eval_batch_size or config.batch_size
    trainer.check_batch_size(batch, "--batch-size", train=False)
    params = trainer.place_params(run_params(run))
    batches = math.ceil(len(examples) / batch)
    with Bar(total=batches, desc=f"predict {task.name}", unit="batch", file=sys.stderr, dynamic_ncols=True,
             disable=not progress or batches < 2 or jax.process_index() != 0, mininterval=0.5) as bar:
        values = predict_split(trainer, params, enc, batch, n_ctx, Markers.of(run.tokenizer), task,
                               on_batch=lambda: bar.update(1))
    return Predictions(run, [ex["idx"] for ex in examples], values, enc.cut)


def write_tsv(predictions: Predictions, out: str | Path, overwrite: bool = False) -> Path:
    """The predictions as a whole file at `out` (never half of one); an existing file only with `overwrite`."""
    out = Path(out)
    check_new_file(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, predictions.tsv())
    return out
