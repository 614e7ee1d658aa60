"""The fine-tuning job: a task head on GPT-1, trained with the auxiliary LM loss (paper §3.3).

SOURCE (`init`) is any folder `load_pretrained` reads (a pre-training or fine-tuning workdir, a HF,
original or gpt1-jax checkpoint), `none` (random init of the config's model: Table 5's "no
pre-training") or `scratch:DIR` (random init with DIR's architecture and tokenizer).

It runs on the same engine as pre-training (gpt1_jax/step.py, gpt1_jax/loop.py): shuffled batches of
one epoch after another, the dev evaluation and best-epoch choice as a hook at each epoch's end, and
checkpoints, so a killed run resumes exactly (same dev metrics, byte-identical prediction files).
Writes DIR/run.json (the folder is this task's, from this init: gpt1_jax/workdir.py), config.yaml, tokenizer.json,
metrics.jsonl, checkpoints/, predictions/<split>.tsv (best epoch),
results.json and, with `predict_test`, GLUE's submission file DIR/<Task>.tsv.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from gpt1_jax import distributed, flops, heads
from gpt1_jax.attention import check_runnable as check_attention
from gpt1_jax.checkpoint import Checkpointer
from gpt1_jax.config import (ConfigError, FinetuneConfig, MeshConfig, ModelConfig, check_storage, load_yaml,
                             profile_window, to_dict)
from gpt1_jax.data.layout import Markers, max_segment_len
from gpt1_jax.data.pipeline import default_cache_dir
from gpt1_jax.data.tasks import (EpochBatches, Encoded, Splits, Task, encode_task, make_task, prediction_batches,
                                  prepare_once, train_rows, write_predictions, write_submission)
from gpt1_jax.data.tokens import bpe_of_texts
from gpt1_jax.errors import DataError, WorkdirError
from gpt1_jax.files import atomic_write_text
from gpt1_jax.integrity import checkpoint_steps, newest_checkpoint
from gpt1_jax.loop import Hook, Outcome, resume_step, start
from gpt1_jax.metrics import json_safe, say, say_plots
from gpt1_jax.optim import eval_params
from gpt1_jax.sharding import make_mesh
from gpt1_jax.step import Trainer, check_batch_size, make_trainer
from gpt1_jax.tokenizer import GPT1Tokenizer, find_tokenizer
from gpt1_jax.tracker import check_tracker
from gpt1_jax.weights import read_model
from gpt1_jax.workdir import (DATA_INFO_FIX, Identity, check_same_settings, hold, init_identity, read_record,
                              recorded_step, training_now)
from gpt1_jax.workdir import check as check_workdir


# ---- where the weights and the tokenizer come from ----------------------------------------------------

@dataclasses.dataclass
class Source:
    described: str
    model_config: ModelConfig | None = None  # None: the config's own model (`none`)
    params: dict | None = None  # transformer params; None: random init
    tokenizer: object = None  # a GPT1Tokenizer; None: trained on the task's text (`none` only)
    step: int | None = None  # the checkpoint of a run the weights come from


def open_source(init: str, config: FinetuneConfig, tokenizer_spec: str | None, step: int | None = None, *,
                weights: bool = True) -> Source:
    """Reads the init source (`step`: a run workdir's checkpoint; None: the one `read_model` picks, a finished
    fine-tuning run's best epoch, else the newest): before any task data, so a wrong path fails at once.
    `weights=False`: a resumed run's own checkpoints hold its weights, only the source's architecture and tokenizer
    are read, and a `step` the source no longer keeps is read at its newest (the run still started from `step`)."""
    if init == "none":
        return Source("none", tokenizer=find_tokenizer(tokenizer_spec, None))
    scratch = init.startswith("scratch:")
    path = Path(init.removeprefix("scratch:"))
    if not path.is_dir():
        raise FileNotFoundError(f"--init {init}: no such directory (a run workdir, a checkpoint folder, or none)")
    gone = (not weights and step is not None and (path / "checkpoints").is_dir()
            and step not in checkpoint_steps(path / "checkpoints"))
    # the files' architecture, the run's run-time fields
    model_config, params, read = read_model(path, config.model, step=None if gone else step)
    tok = find_tokenizer(tokenizer_spec, path, model_vocab_size=model_config.vocab_size)
    if tok is None:
        raise FileNotFoundError(f"--init {init}: no tokenizer in it (tokenizer.json, encoder_bpe_40000.json + "
                                "vocab_40000.bpe, or vocab.json + merges.txt); pass --tokenizer")
    if scratch:  # Table 5's "no pre-training" at the source's own architecture and vocabulary
        return Source(f"scratch ({path})", model_config, None, tok)
    if step is None and read is not None and (holder := training_now(path)) and jax.process_index() == 0:
        # its newest checkpoint changes as it trains: runs (seeds of a sweep) started later would start elsewhere
        say(f"--init {path} is training now ({holder}): this run starts from its checkpoint of step {read}; give "
            f"--step {read} to start other runs from the same one", "gpt1-jax finetune")
    step = read if step is None else step
    return Source(str(path) if step is None else f"{path} step {step}", model_config, params, tok, step)


def with_marker_rows(model_config: ModelConfig, params, tok, seed: int):
    """Appends N(0, init_std) rows for _start_, _delimiter_, _classify_ to a table that lacks them."""
    if model_config.vocab_size == tok.vocab_size:
        return model_config, params
    rows = np.random.default_rng(seed).normal(0.0, model_config.init_std, (3, model_config.d_model))
    table = np.asarray(params["tokens_embed"]["embedding"])
    params = dict(params, tokens_embed={"embedding": np.concatenate([table, rows.astype(table.dtype)])})
    return dataclasses.replace(model_config, vocab_size=tok.vocab_size), params


def check_init_layers(init_layers: int, source: Source) -> None:
    """`transplant` keeps every pre-trained block for any init_layers at or above the model's depth: a larger one
    (a typo, or another model's depth) ran as -1 and said nothing."""
    if source.params is not None and init_layers > source.model_config.n_layers:
        n = source.model_config.n_layers
        raise ConfigError(f"init_layers={init_layers} exceeds the {n} layer{'s' * (n != 1)} of --init "
                          f"{source.described}: give 0 to {n} (-1: all)")


def transplant(fresh, pretrained, model_config: ModelConfig, n_layers: int):
    """Fresh transformer params with the pre-trained embeddings and first `n_layers` blocks (-1: all):
    Figure 2 (left) of the paper."""
    if n_layers < 0 or n_layers >= model_config.n_layers:
        return pretrained
    out = dict(fresh, tokens_embed=pretrained["tokens_embed"], positions_embed=pretrained["positions_embed"])
    if model_config.scan_layers:
        out["h"] = jax.tree.map(lambda f, p: np.concatenate([np.asarray(p)[:n_layers], np.asarray(f)[n_layers:]]),
                                fresh["h"], pretrained["h"])
    else:
        out.update({f"h_{i}": pretrained[f"h_{i}"] for i in range(n_layers)})
    return out


# ---- evaluation ------------------------------------------------------------------------------------------

def predict_split(trainer, params, enc: Encoded, batch_size: int, n_ctx: int, markers, task: Task,
                  on_batch: Callable[[], None] = lambda: None) -> np.ndarray:
    """Predictions for every example of `enc`, in order (its `prediction_batches`, the filler dropped); a causal
    model's outputs at an example's positions do not depend on the padding after them. `on_batch`: after each
    batch (a progress bar's tick)."""
    order, outs = [], []
    for rows, batch in prediction_batches(enc, batch_size, n_ctx, markers):
        order.append(rows)
        outs.append(np.asarray(jax.device_get(trainer.predict(params, trainer.put_batch(batch, train=False))))[: len(rows)])
        on_batch()
    out = np.zeros((0, task.n_outputs), np.float32)
    if outs:
        shortest_first = np.concatenate(outs)
        out = np.empty_like(shortest_first)
        out[np.concatenate(order)] = shortest_first
    return heads.predictions(task.kind, task.regression, out)


def _scores_text(scores: dict[str, float]) -> str:
    """A run's scores as its lines say them: "accuracy 0.8123  f1 0.8650"."""
    return "  ".join(f"{k} {v:.4f}" for k, v in scores.items())


class DevEvaluation:
    """The epoch-end hook: score every dev split (and the held-out slice, when there is one), keep the best epoch
    by the task's first metric on the held-out slice (else on dev), and write that epoch's dev predictions (and
    test submissions); `keep(step)` hears of each new best epoch's step (its checkpoint is kept). Its history
    and `seconds` (its share of the run's wall time: compiling the predictions, scoring, writing them; None
    for a run resumed from a checkpoint that did not keep them) are part of every checkpoint."""

    def __init__(self, task: Task, splits: Splits, trainer, eval_batch: int, markers, workdir: Path, steps_per_epoch: int,
                 keep: Callable[[int], None] = lambda step: None):
        self.task, self.splits, self.trainer, self.eval_batch, self.markers = task, splits, trainer, eval_batch, markers
        self.workdir, self.steps_per_epoch, self.keep = workdir, steps_per_epoch, keep
        self.writes = jax.process_index() == 0
        self.main_metric = f"{task.dev_splits[0]}/{task.metrics[0]}" if len(task.dev_splits) > 1 else task.metrics[0]
        self.selected_on = "holdout" if splits.holdout is not None else "dev"
        self.history: list[dict] = []
        self.best: dict | None = None
        self.seconds: float | None = 0.0

    def _score(self, enc: Encoded, preds: np.ndarray) -> dict[str, float]:
        labelled = [i for i, ex in enumerate(enc.examples) if ex["label"] != -1]
        return self.task.score([enc.examples[i] for i in labelled], preds[labelled]) if labelled else {}

    def __call__(self, step: int, state, train_loss: float, say: Callable[[str], None] = lambda line: None) -> dict:
        """Scores the epoch that ends at `step`; `say`: where its line goes (the run's bar)."""
        with self._timed():
            return self._evaluate(step, state, train_loss, say)

    @contextlib.contextmanager
    def _timed(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.seconds is not None:
                self.seconds += time.perf_counter() - t0

    def _evaluate(self, step: int, state, train_loss: float, say: Callable[[str], None]) -> dict:
        params = eval_params(state.opt_state, state.params)  # schedule-free: evaluated at x
        predict = lambda enc: predict_split(self.trainer, params, enc, self.eval_batch, self.splits.n_ctx, self.markers, self.task)
        scores, preds = {}, {}
        for split, enc in self.splits.dev.items():
            preds[split] = predict(enc)
            scores.update({(f"{split}/{k}" if len(self.splits.dev) > 1 else k): v
                           for k, v in self._score(enc, preds[split]).items()})
        held = {} if self.splits.holdout is None else self._score(self.splits.holdout, predict(self.splits.holdout))
        epoch = math.ceil(step / self.steps_per_epoch)
        self.history.append({"epoch": epoch, "train_loss": train_loss, **scores,
                             **{f"holdout/{k}": v for k, v in held.items()}})
        value = held.get(self.task.metrics[0], float("nan")) if held else scores.get(self.main_metric, float("nan"))
        if self.best is None or (math.isfinite(value) and not value <= self.best["value"]):
            self.best = {"epoch": epoch, "step": step, "value": value, "scores": scores,
                         **({"holdout": held} if held else {})}
            self.keep(step)
            self._write_best(preds, predict)
        shown = _scores_text({**scores, **{f"holdout/{k}": v for k, v in held.items()}})
        say(f"epoch {epoch} (step {step}): train_loss {train_loss:.4f}  {shown}"
            + ("  (best)" if self.best["step"] == step else f"  (best: epoch {self.best['epoch']})"))
        return {f"dev/{k}": v for k, v in scores.items()} | {f"holdout/{k}": v for k, v in held.items()}

    def prepare(self, state) -> None:
        """Compiles the prediction program for every batch shape it meets (a few lengths), without running it."""
        with self._timed():
            self._compile(state)

    def _compile(self, state) -> None:
        params, compiled = eval_params(state.opt_state, state.params), set()
        held = [self.splits.holdout] if self.splits.holdout is not None else []
        for enc in [*self.splits.dev.values(), *held, *self.splits.test.values()]:
            for _, batch in prediction_batches(enc, self.eval_batch, self.splits.n_ctx, self.markers):
                if batch["tokens"].shape not in compiled:
                    compiled.add(batch["tokens"].shape)
                    self.trainer.compile_eval(params, self.trainer.put_batch(batch, train=False), predict=True)

    def _write_best(self, preds, predict) -> None:
        tests = {split: predict(enc) for split, enc in self.splits.test.items()}  # every process joins
        if not self.writes:
            return
        for split, p in preds.items():
            write_predictions(self.workdir / "predictions" / f"{split}.tsv", self.task, self.splits.dev[split], p)
        for split, p in tests.items():
            write_submission(self.workdir / submission_file(self.task, split), self.task, self.splits.test[split], p)

    def state(self) -> dict:
        return {"history": self.history, "best": self.best, "seconds": self.seconds}

    def restore(self, state: dict) -> None:
        self.history, self.best, self.seconds = state["history"], state["best"], state.get("seconds")
        if self.best is not None:  # checkpoints from before the step was kept: the epoch's end
            self.best.setdefault("step", self.best["epoch"] * self.steps_per_epoch)
            self.keep(self.best["step"])


# ---- the run -----------------------------------------------------------------------------------------------

def prepare(config: FinetuneConfig, workdir: Path, *, init: str, data_dir, tokenizer, predict_test: bool, tfds_dir,
            init_step: int | None = None, progress: bool = False, resumed: bool = False):
    """-> (task, source, the resolved config, encoded splits): everything before the model is built. `progress`:
    bars of reading RACE's archive, training a BPE of the task's text and encoding the splits. `resumed`: the
    run's own checkpoints hold its weights (`open_source`)."""
    source = open_source(init, config, tokenizer, init_step, weights=not resumed)
    check_init_layers(config.init_layers, source)
    model = source.model_config or config.model  # a pre-trained model's head size, not the preset's
    check_attention(model.attention, model.attn_dropout, True, model.head_dim)
    check_storage(model, config.optim)
    task = make_task(config, data_dir, tfds_dir, progress=progress)
    prepare_once(task, ("train", *task.dev_splits, *(task.test_splits if predict_test else ())))
    tok = source.tokenizer
    resuming = (workdir / "tokenizer.json").is_file() and (workdir / "checkpoints").is_dir()
    if tok is None and resuming:
        tok = GPT1Tokenizer.load(workdir / "tokenizer.json")  # resuming: the BPE this run already trained
    elif tok is not None and resuming and not tok.same_as(GPT1Tokenizer.load(workdir / "tokenizer.json")):
        # Of the same size, another BPE would go through every other check and train on other ids.
        raise WorkdirError(f"{workdir} holds a fine-tuning run trained with another tokenizer than "
                           f"{'--tokenizer ' + str(tokenizer) if tokenizer else 'its --init source'} gives (its "
                           "checkpoints use the ids of its own tokenizer.json): repeat the run's own --tokenizer, or "
                           "choose another --workdir")
    train = None
    if tok is None:  # no pre-training, no vocabulary to inherit: a BPE from the task's own training text
        train = task.load("train")
        texts = [t for i in train_rows(len(train), config)[0] for t in task.texts(train[i])]
        tok = bpe_of_texts(texts, config.model.vocab_size - 3, default_cache_dir(), f"{task.name} training text",
                           progress=progress)
    model_config = source.model_config or dataclasses.replace(config.model, vocab_size=tok.vocab_size)
    if source.params is not None:
        model_config, source.params = with_marker_rows(model_config, source.params, tok, config.seed)
    else:
        model_config = dataclasses.replace(model_config, vocab_size=tok.vocab_size)
    source.tokenizer = tok
    n_ctx = config.n_ctx or model_config.n_positions
    if n_ctx > model_config.n_positions:
        raise ConfigError(f"n_ctx={n_ctx} exceeds the model's n_positions={model_config.n_positions}")
    splits = encode_task(task, config, tok, n_ctx, predict_test, progress=progress, train_examples=train)
    steps_per_epoch = math.ceil(len(splits.train.seqs) / config.batch_size)
    total = steps_per_epoch * config.epochs
    if (window := profile_window(config.profile)) and window[1] > total:  # found before the run folder is written
        raise ConfigError(f"profile {config.profile} ends after the run's last step ({total} = {config.epochs} "
                          f"epoch{'s' if config.epochs > 1 else ''} x {steps_per_epoch} steps)")
    optim = dataclasses.replace(config.optim, total_steps=total, warmup_steps=int(round(config.warmup_fraction * total)))
    config = dataclasses.replace(config, model=flops.fit_compute_dtype(model_config), optim=optim, n_ctx=n_ctx)
    return task, source, config, splits


def run(config: FinetuneConfig, workdir: Path, *, init: str, data_dir: str | None = None, tokenizer: str | None = None,
        predict_test: bool = False, progress: bool = True, tfds_dir: str | None = None,
        init_step: int | None = None) -> Outcome:
    """Fine-tunes `config.task` from `init` (`init_step`: that run's checkpoint; None: the one its run.json records,
    else the one `read_model` picks, recorded) in `workdir` (resuming what is there) -> how it ended; a finished
    run's outcome carries its results.json as `results` (a rerun of a finished run rewrites them)."""
    workdir = Path(workdir)
    distributed.check_same_job("finetune", workdir, config, init=init, init_step=init_step, predict_test=predict_test)
    if init_step is not None and (init == "none" or init.startswith("scratch:")):
        raise ConfigError(f"--step picks a checkpoint of the --init run, and --init {init} reads no weights")
    job = Identity("finetune", config.task, init_identity(init, init_step))
    held = check_workdir(workdir, job, "finetune", init_path=None if init == "none" else init.removeprefix("scratch:"))
    # One step for the whole run, resolved when it began: a source training now saves newer checkpoints meanwhile
    init_step = recorded_step(held.init) if init_step is None and held is not None else init_step
    check_batches(config)  # what needs no data, before the task's files are read and encoded
    if jax.process_index() == 0:  # the process that logs
        check_tracker(config.tracker)
    with hold(workdir, "finetune", enabled=jax.process_index() == 0):  # one job at a time in a run folder
        trained = newest_checkpoint(workdir / "checkpoints") is not None
        task, source, config, splits = prepare(config, workdir, init=init, init_step=init_step, data_dir=data_dir,
                                               tokenizer=tokenizer, predict_test=predict_test, tfds_dir=tfds_dir,
                                               progress=progress, resumed=trained)
        if source.step is not None:  # run.json records the step read (a new run), or the one it records already
            job = dataclasses.replace(job, init=init_identity(init, source.step))
        # A run that stopped before its first checkpoint (out of memory at its first step) has nothing to resume:
        # it was refused with its own settings, and the folder had to be deleted by hand. As pre-training does.
        if held is not None and (workdir / "config.yaml").is_file() and trained:
            check_same_settings(workdir, config, load_yaml(FinetuneConfig, workdir / "config.yaml"))
        check_outputs(workdir, task, splits, predict_test)
        trained_on = check_same_examples(workdir, splits)
        trainer = task_trainer(config, task, config.mesh)
        ckpt = Checkpointer(workdir / "checkpoints", keep=config.keep_checkpoints, save_every=config.checkpoint_every)
        try:  # until the loop takes the checkpointer over: an error or Ctrl-C must not leave orbax's threads running
            outcome, dev, seconds = _train(config, workdir, job, task, source, splits, trainer, ckpt, progress,
                                           trained_on)
        finally:
            ckpt.close()
        if not outcome.finished:
            return outcome
        results = summary(task, source, config, splits, dev, train_seconds=seconds)
        if results["step"] not in checkpoint_steps(workdir / "checkpoints"):  # rotated out by a run older than pinning
            results["step"] = None
        if gone := [f for f in results["predictions"].values() if not (workdir / f).is_file()]:
            # written at the best epoch while the run trained: a rerun of the finished run cannot make them again
            results["predictions"] = {s: f for s, f in results["predictions"].items() if f not in gone}
            if jax.process_index() == 0:
                print(f"gpt1-jax finetune: {', '.join(gone)} in {workdir} is gone: it was written at the best epoch "
                      "while the run trained; fine-tune again in another --workdir to have it", file=sys.stderr)
        if jax.process_index() == 0:
            atomic_write_text(workdir / "results.json", json.dumps(json_safe(results), indent=2, default=str) + "\n")
            # a result, not progress: a batch job's log (--no-progress) has it too
            print(f"best epoch {dev.best['epoch']}: {_scores_text(dev.best['scores'])}  -> {workdir / 'results.json'}",
                  file=sys.stderr)
            say_plots(workdir)  # as pre-training's, with or without a bar
        return dataclasses.replace(outcome, results=results)


DATA_INFO = "data_info.json"  # what the run trains on (`check_same_examples`)


def check_same_examples(workdir: Path, splits: Splits) -> dict:
    """-> the training examples' digest, for data_info.json; a run resumed (or rerun) on other examples than its
    checkpoints trained on (another --data-dir, edited files) is refused in one line: neither the config nor
    the folder's path says which files those were."""
    trained_on = {"n_train": len(splits.train.seqs), "train_sha256": splits.train.digest()}
    info = workdir / DATA_INFO
    if info.is_file() and newest_checkpoint(workdir / "checkpoints") is not None:
        before = read_record(info, DATA_INFO_FIX)
        if before.get("train_sha256", trained_on["train_sha256"]) != trained_on["train_sha256"]:
            raise WorkdirError(f"{workdir} holds a fine-tuning run trained on other examples ({before.get('n_train')} "
                               f"there, {trained_on['n_train']} now, or other tokens or labels: another --data-dir, or "
                               "edited files): repeat the run's own --data-dir, or choose another --workdir")
    return trained_on


def write_run_files(workdir: Path, source: Source, trained_on: dict) -> None:
    """The tokenizer (the workdir alone is the model) and what the run trains on."""
    source.tokenizer.save(workdir / "tokenizer.json")
    atomic_write_text(workdir / DATA_INFO, json.dumps(trained_on, indent=1) + "\n")


def submission_file(task: Task, split: str) -> str:
    """The file a test split's predictions go to in the workdir: GLUE's submission name (CoLA.tsv, ...)."""
    return f"{task.submission(split) if task.submission else f'{task.name}_{split}'}.tsv"


def check_outputs(workdir: Path, task: Task, splits: Splits, predict_test: bool) -> None:
    """Refuses a run that could not give what it is asked for: scores from a dev split without labels (a test
    file in its place), or test predictions from a run that finished without them (they are made at the best
    epoch, while it trains)."""
    for split, enc in splits.dev.items():
        if enc.examples and all(ex["label"] == -1 for ex in enc.examples):
            raise DataError(f"{task.name}'s {split} split has no labels (a test file in place of the dev file?): "
                            "there is nothing to score the run on")
    files = [workdir / submission_file(task, s) for s in splits.test]
    if predict_test and (workdir / "results.json").is_file() and not all(f.is_file() for f in files):
        raise WorkdirError(f"{workdir} holds a run that finished without --predict-test: test predictions are made at "
                           "the best epoch while it trains; run it with --predict-test in another --workdir")


def _train(config: FinetuneConfig, workdir: Path, job: Identity, task: Task, source: Source, splits: Splits, trainer,
           ckpt, progress: bool, trained_on: dict) -> tuple[Outcome, DevEvaluation, float]:
    """The loop, resumed or new -> (its outcome, the dev evaluation hook, training seconds)."""
    markers = Markers.of(source.tokenizer)
    batches = EpochBatches(splits.train, config.batch_size, config.seed, splits.n_ctx, markers, config.group_by_length)
    dev = DevEvaluation(task, splits, trainer, config.eval_batch_size or config.batch_size, markers, workdir,
                        batches.steps_per_epoch, keep=ckpt.pin)
    begin = resume_step(ckpt, config.model)
    loop, state = start(workdir, job, config, trainer, ckpt, batches, begin, steps=config.optim.total_steps,
                        init_state=lambda: initial_state(trainer, source, config.model, config),
                        hooks=lambda bar: [Hook("dev", functools.partial(dev, say=bar.write), every=batches.steps_per_epoch,
                                                state=dev.state, restore=dev.restore, saves=True, prepare=dev.prepare,
                                                doing="evaluating dev")],
                        desc=f"finetune {task.name}", write_files=lambda: write_run_files(workdir, source, trained_on),
                        progress=progress)
    loop.progress.write(
        f"finetune {task.name}: init {source.described}; {config.model.num_params() / 1e6:.2f}M params; "
        f"{len(splits.train.seqs)} train examples"
        f"{f' (+{len(splits.holdout.seqs)} held out to choose the epoch)' if splits.holdout is not None else ''}, "
        f"{', '.join(f'{len(e.seqs)} {s}' for s, e in splits.dev.items())}; "
        f"{config.optim.total_steps} steps{f', resuming at {begin}' if begin else ''}; mesh {dict(trainer.mesh.shape)}")
    for line in data_warnings(task, config, splits):
        loop.progress.warn(f"finetune {task.name}: {line}")
    if cut_tests := [s for s, enc in splits.test.items() if len(enc.seqs) < enc.of]:
        refused = ", which GLUE's server does not take" if task.submission else ""
        loop.progress.warn(f"finetune {task.name}: --max-eval-examples {config.max_eval_examples} cuts the test "
                            f"split{'s' if len(cut_tests) > 1 else ''} too ({', '.join(cut_tests)}): predictions for "
                            f"part of a split{refused}")
    t0 = time.perf_counter()
    outcome = loop.run(state, batches)  # a finished run (rerun) only closes, then rewrites its results
    # Every session's time (the checkpoints carry it); this session's where an older checkpoint did not.
    seconds = time.perf_counter() - t0 if outcome.seconds is None else outcome.seconds
    if begin >= config.optim.total_steps and (workdir / "results.json").is_file():  # a rerun: the run's own seconds
        try:
            seconds = json.loads((workdir / "results.json").read_text()).get("train_seconds", seconds)
        except (ValueError, AttributeError):  # damaged (or not ours): the rerun writes it again whole
            pass
    return outcome, dev, seconds


def check_batches(config: FinetuneConfig) -> None:
    """Both batch sizes against `config.mesh` over this process's devices (`check_batch_size`, one ConfigError): a
    run checks them before it reads data, a sweep of runs of one batch size before its first run."""
    mesh = make_mesh(config.mesh)
    check_batch_size(mesh, config.batch_size, config.accum_steps, "batch_size")
    check_batch_size(mesh, config.eval_batch_size or config.batch_size, 1, "eval_batch_size")


def task_trainer(config: FinetuneConfig, task: Task, mesh: MeshConfig) -> Trainer:
    """A Trainer of `config`'s model with `task`'s head and loss (the auxiliary LM term included), over `mesh`: the
    run's own to train, the devices here to predict (gpt1_jax/predict.py)."""
    init_fn, loss_fn, predict_fn = heads.finetune_functions(config.model, task.kind, task.n_outputs, task.regression,
                                                            config.clf_dropout, config.lm_coef,
                                                            2 if task.kind == "similarity" else 1)
    return make_trainer(init_fn, loss_fn, config.optim, mesh, accum_steps=config.accum_steps, seed=config.seed,
                        predict_fn=predict_fn)


def data_warnings(task: Task, config: FinetuneConfig, splits: Splits) -> list[str]:
    """What the run's data does that no flag said: examples cut to a segment, in every split (the paper's layout
    keeps n_ctx // 2 - 2 tokens a segment; a short n_ctx cuts many, and RACE's dev passages were scored cut
    without a word), and a batch larger than the training set (its rows beyond the data are filler)."""
    lines = []
    held = {"holdout": splits.holdout} if splits.holdout is not None else {}
    cuts = [f"{enc.cut} of {len(enc.seqs)} {split}" for split, enc in
            {"training": splits.train, **held, **splits.dev, **splits.test}.items() if enc.cut]
    if cuts:
        lines.append(f"{', '.join(cuts)} examples have a text longer than a segment's {max_segment_len(splits.n_ctx)} "
                     f"tokens (n_ctx {splits.n_ctx}): cut to it")
    if config.batch_size > (n := len(splits.train.seqs)):
        lines.append(f"--batch-size {config.batch_size} is larger than the {n} training example{'s' * (n != 1)}: each "
                     f"epoch is one step whose other {config.batch_size - n} rows are filler (weight 0)")
    return lines


def initial_state(trainer, source: Source, model_config: ModelConfig, config: FinetuneConfig):
    """Fresh transformer + head from `config.seed`, with the source's pre-trained weights in place."""
    fresh = jax.device_get(trainer.init(config.seed).params)
    if source.params is None:
        return trainer.state_from_params(fresh)
    transformer = transplant(fresh["transformer"], jax.device_get(source.params), model_config, config.init_layers)
    return trainer.state_from_params(dict(fresh, transformer=transformer))


def summary(task: Task, source: Source, config: FinetuneConfig, splits: Splits, dev: DevEvaluation, train_seconds: float) -> dict:
    return {
        "task": task.name,
        "init": source.described,
        "seed": config.seed,
        "epoch": dev.best["epoch"],
        "step": dev.best["step"],  # the best epoch's checkpoint (kept whatever keep_checkpoints says; else None: run)
        "selected_on": dev.selected_on,  # what chose the epoch: the held-out slice of the training set, or dev
        "main_metric": dev.main_metric,
        "metric_names": list(dev.best["scores"]),
        "metrics": dev.best["scores"],
        **({"holdout": dev.best["holdout"], "n_holdout": len(splits.holdout.seqs)} if splits.holdout is not None else {}),
        "history": dev.history,
        "n_train": len(splits.train.seqs),
        "n_dev": {s: len(e.seqs) for s, e in splits.dev.items()},
        "steps": config.optim.total_steps,
        # the run's wall time over every session (steps, compiling, dev evaluation, saves), as it always was;
        # dev_seconds: the dev evaluation's share of it (compiling the predictions included)
        "train_seconds": round(train_seconds, 2),
        "dev_seconds": None if dev.seconds is None else round(dev.seconds, 2),
        "predictions": {s: f"predictions/{s}.tsv" for s in splits.dev},
        "submission": {s: submission_file(task, s) for s in splits.test},
        "config": to_dict(config),
    }

