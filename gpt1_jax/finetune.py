"""`gpt1-jax finetune`: a task head on GPT-1, trained with the auxiliary LM loss (paper §3.3).

    gpt1-jax finetune --task cola --init SOURCE --workdir DIR [--data-dir ../shared/data/glue]

SOURCE is a pre-training workdir (config.yaml + tokenizer.json + checkpoints/), a HF / original /
gpt1-jax checkpoint directory (`load_pretrained`), `none` (random init of `--config`'s model: Table 5's
"no pre-training"), or `scratch:DIR` (random init with DIR's architecture and tokenizer).
The loop: for each epoch, shuffled batches -> sharded train step; then predict dev, score with the
official metrics, keep the best epoch. Writes DIR/config.yaml, DIR/results.json, DIR/metrics.jsonl,
DIR/predictions/<split>.tsv (best epoch) and, with --predict-test, GLUE's submission file DIR/<Task>.tsv.

Defaults are the paper's: lr 6.25e-5, batch 32, 3 epochs, warmup 0.2% then linear decay to 0,
lm_coef 0.5, dropout 0.1 (classifier too), decoupled weight decay 0.01, clipping at 1.0.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from gpt1_jax.config import ConfigError, FinetuneConfig, ModelConfig, OptimConfig, save_yaml, task_key, to_dict

# ---- tasks: GLUE's and RACE behind one interface ----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    kind: str  # a gpt1_jax.heads kind
    n_outputs: int
    regression: bool
    metrics: tuple[str, ...]  # the first picks the best epoch
    dev_splits: tuple[str, ...]
    test_splits: tuple[str, ...]
    label_names: tuple[str, ...] | None
    load: Callable[[str], list[dict]]  # split -> examples (text fields, label, idx)
    texts: Callable[[dict], list[str]]  # the strings of one example, to tokenise
    segments: Callable[[list[list[int]], int], tuple]  # their tokens, segment length -> heads.layout input
    score: Callable[[list[dict], np.ndarray], dict[str, float]]  # examples, predictions -> metrics
    submission: Callable[[str], str] | None = None  # test split -> GLUE file stem
    submit_names: bool = False  # the GLUE server wants label names (MNLI, QNLI, RTE), not indices


def make_task(config: FinetuneConfig, data_dir: str | None, tfds_dir: str | None = None) -> Task:
    from gpt1_jax.data import glue

    key = task_key(config.task)
    if key == "race":
        return _race_task(config, data_dir)
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


def _race_task(config: FinetuneConfig, data_dir: str | None) -> Task:
    from gpt1_jax.data.race import load_race

    if not data_dir:
        raise ConfigError("task race reads RACE from a local race.tar.gz: pass --data-dir PATH")
    path = Path(data_dir)
    levels = tuple(config.race_levels.split(","))

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
        load=lambda split: load_race(path, split, levels),
        texts=lambda ex: [ex["article"], ex["question"], *ex["options"]],
        segments=segments, score=score,
    )


# ---- init sources --------------------------------------------------------------------------------

_RUNTIME = ("dtype", "param_dtype", "attention", "remat", "embd_dropout", "attn_dropout", "resid_dropout")


def find_tokenizer(spec: str | None, source: Path | None):
    """A GPT1Tokenizer from --tokenizer or, failing that, from the SOURCE folder itself; None when
    neither has one (see GPT1Tokenizer.from_path for what a folder may hold)."""
    from gpt1_jax.tokenizer import GPT1Tokenizer

    if spec:
        tok = GPT1Tokenizer.from_path(spec)
        if tok is None:
            raise FileNotFoundError(f"--tokenizer {spec}: not a tokenizer .json nor a folder with encoder_bpe_40000.json + "
                                    "vocab_40000.bpe or vocab.json + merges.txt")
        return tok
    return GPT1Tokenizer.from_path(source) if source is not None else None


def is_pretrain_workdir(path: Path) -> bool:
    return (path / "config.yaml").is_file() and (path / "checkpoints").is_dir()


def load_init(source: str, config: FinetuneConfig, tokenizer_spec: str | None, train_texts: Callable[[], list[str]]):
    """-> (model config, transformer params or None for `none`/`scratch:`, tokenizer, description of the source).

    The tokenizer always carries the 3 markers; a pre-trained table without them (HF, original) gets
    3 rows appended later (`with_marker_rows`)."""
    from gpt1_jax.checkpoint import restore_params
    from gpt1_jax.tokenizer import GPT1Tokenizer
    from gpt1_jax.weights import load_pretrained

    runtime = {n: getattr(config.model, n) for n in _RUNTIME}
    if source.startswith("scratch:"):
        # Table 5's "no pre-training" at the source's own architecture and vocabulary: its weights unused.
        model_config, _, tok, described = load_init(source.removeprefix("scratch:"), config, tokenizer_spec, train_texts)
        return dataclasses.replace(model_config, vocab_size=tok.vocab_size), None, tok, f"scratch ({described})"
    if source == "none":
        tok = find_tokenizer(tokenizer_spec, None)
        if tok is None:
            # No pre-training, no vocabulary to inherit: a BPE from the task's own training text.
            tok = GPT1Tokenizer.train([train_texts()], vocab_size=config.model.vocab_size - 3)
        return dataclasses.replace(config.model, vocab_size=tok.vocab_size), None, tok, "none"
    path = Path(source)
    if not path.is_dir():
        raise FileNotFoundError(f"--init {source}: no such directory (a pre-training workdir, a checkpoint folder, or none)")
    if is_pretrain_workdir(path):
        import yaml

        raw = yaml.safe_load((path / "config.yaml").read_text()) or {}
        if not isinstance(raw.get("model"), dict):
            raise ConfigError(f"{path}/config.yaml has no `model` section: not a pre-training workdir")
        from gpt1_jax.config import from_dict

        model_config = dataclasses.replace(from_dict(ModelConfig, raw["model"]), **runtime)
        params, step = restore_params(path / "checkpoints", model_config)
        tok = find_tokenizer(tokenizer_spec, path)
        described = f"{path} (pre-training step {step})"
    else:
        model_config, params = load_pretrained(path)
        model_config = dataclasses.replace(model_config, **runtime)
        tok = find_tokenizer(tokenizer_spec, path)
        described = str(path)
    if tok is None:
        raise FileNotFoundError(f"--init {source}: no tokenizer in it (tokenizer.json, encoder_bpe_40000.json + "
                                "vocab_40000.bpe, or vocab.json + merges.txt); pass --tokenizer")
    if model_config.vocab_size not in (tok.vocab_size, tok.base_vocab_size):
        raise ConfigError(f"--init {source}: the model's vocabulary has {model_config.vocab_size} rows but the "
                          f"tokenizer {tok.base_vocab_size} (+3 markers); pass the matching --tokenizer")
    return model_config, params, tok, described


def with_marker_rows(model_config: ModelConfig, params, tok, seed: int):
    """Appends N(0, init_std) rows for _start_, _delimiter_, _classify_ to a table that lacks them."""
    if model_config.vocab_size == tok.vocab_size:
        return model_config, params
    rows = np.random.default_rng(seed).normal(0.0, model_config.init_std, (3, model_config.d_model))
    table = np.asarray(params["tokens_embed"]["embedding"])
    params = dict(params, tokens_embed={"embedding": np.concatenate([table, rows.astype(table.dtype)])})
    return dataclasses.replace(model_config, vocab_size=tok.vocab_size), params


# ---- encoding and batching ------------------------------------------------------------------------

@dataclasses.dataclass
class Encoded:
    """One split ready for batching: each example's N token sequences, labels, original examples."""

    seqs: list[list[list[int]]]
    labels: np.ndarray
    examples: list[dict]


def encode_split(task: Task, examples: list[dict], tok, n_ctx: int) -> Encoded:
    from gpt1_jax import heads

    markers = heads.Markers.of(tok)
    keep = heads.max_segment_len(n_ctx)
    texts = [task.texts(ex) for ex in examples]
    flat = [t for ts in texts for t in ts]
    ids = tok.encode_batch(flat) if flat else []
    seqs, i = [], 0
    for ts in texts:
        toks = ids[i: i + len(ts)]
        i += len(ts)
        seqs.append(heads.layout(task.kind, task.segments(toks, keep), markers, n_ctx))
    dtype = np.float32 if task.regression else np.int32
    labels = np.asarray([ex["label"] for ex in examples], dtype)
    return Encoded(seqs, labels, examples)


def bucket_len(n: int, n_ctx: int) -> int:
    """Next power of two (>= 16), capped at n_ctx: few distinct shapes, so few compilations."""
    return min(n_ctx, max(16, 1 << (max(n, 1) - 1).bit_length()))


def make_batch(enc: Encoded, rows: np.ndarray, batch_size: int, n_ctx: int, markers) -> dict[str, np.ndarray]:
    """Rows of `enc` padded to `batch_size` with weight-0 filler examples (shapes stay fixed)."""
    from gpt1_jax import heads

    seqs = [enc.seqs[r] for r in rows]
    n_seq = len(seqs[0])
    filler = [[markers.start, markers.classify]] * n_seq
    seqs = seqs + [filler] * (batch_size - len(seqs))
    length = bucket_len(max(len(s) for ex in seqs for s in ex), n_ctx)
    tokens, mask, clf_pos = heads.pad_sequences(seqs, length)
    labels = np.zeros((batch_size,), enc.labels.dtype)
    labels[: len(rows)] = enc.labels[rows]
    labels = np.where(labels < 0, 0, labels) if labels.dtype != np.float32 else labels  # test rows: -1
    weights = np.zeros((batch_size,), np.float32)
    weights[: len(rows)] = 1.0
    return {"tokens": tokens, "mask": mask, "clf_pos": clf_pos, "labels": labels, "weights": weights}


# ---- the compiled programs -------------------------------------------------------------------------

class Programs:
    """The model, its shardings on the mesh, and the jitted train and predict steps."""

    def __init__(self, model_config: ModelConfig, task: Task, config: FinetuneConfig, optim: OptimConfig, mesh, rules):
        import flax.linen as nn
        import jax
        import jax.numpy as jnp
        import optax

        from gpt1_jax import heads
        from gpt1_jax import sharding as shd
        from gpt1_jax.optim import make_optimizer, make_schedule
        from gpt1_jax.step import TrainState

        self.mesh, self.rules = mesh, tuple(rules)
        n_seq = 2 if task.kind == "similarity" else 1
        self.model = heads.FinetuneModel(model_config, task.kind, task.n_outputs, config.clf_dropout)
        self._init = functools.partial(heads.init_finetune_params, self.model, n_seq=n_seq)
        with nn.logical_axis_rules(self.rules):
            boxed = jax.eval_shape(self._init, jax.random.key(0))
        self.param_shardings = shd.logical_shardings(boxed, mesh, self.rules)
        abstract_params = self.abstract_params = nn.meta.unbox(boxed)
        self.tx = make_optimizer(optim, abstract_params)
        self.schedule = make_schedule(optim)
        abstract_opt = jax.eval_shape(self.tx.init, abstract_params)
        opt_shardings = shd.like_params_shardings(abstract_opt, abstract_params, self.param_shardings, mesh)
        self.state_shardings = TrainState(step=shd.replicated(mesh), params=self.param_shardings, opt_state=opt_shardings)
        self.replicated = shd.replicated(mesh)
        model, tx, schedule, lm_coef, seed, rules_ = self.model, self.tx, self.schedule, config.lm_coef, config.seed, self.rules
        kind, regression = task.kind, task.regression

        def loss_fn(params, batch, rng):
            tokens_BNT = batch["tokens"]
            B, N, T = tokens_BNT.shape
            out, logits_STV = model.apply({"params": params}, tokens_BNT, batch["clf_pos"], deterministic=False,
                                          with_lm=lm_coef > 0, rngs={"dropout": rng})
            l_task = heads.task_loss(kind, regression, out, batch["labels"], batch["weights"])
            if lm_coef > 0:
                l_lm = heads.lm_loss(logits_STV, tokens_BNT.reshape(B * N, T), batch["mask"].reshape(B * N, T),
                                     jnp.repeat(batch["weights"], N))
            else:
                l_lm = jnp.zeros((), jnp.float32)
            return l_task + lm_coef * l_lm, (l_task, l_lm)

        def train_step(state, batch):
            with nn.logical_axis_rules(rules_):
                rng = jax.random.fold_in(jax.random.key(seed), state.step)
                (loss, (l_task, l_lm)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, rng)
                updates, opt_state = tx.update(grads, state.opt_state, state.params)
                params = optax.apply_updates(state.params, updates)
            metrics = {"loss": loss, "task_loss": l_task, "lm_loss": l_lm, "grad_norm": optax.tree.norm(grads),
                       "lr": jnp.asarray(schedule(state.step), jnp.float32)}
            return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

        def predict(params, batch):
            with nn.logical_axis_rules(rules_):
                out, _ = model.apply({"params": params}, batch["tokens"], batch["clf_pos"], deterministic=True,
                                     with_lm=False)
            return out

        def init_state(params):
            return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

        self._batch_shardings = lambda batch: {k: shd.batch_sharding(mesh, v.ndim) for k, v in batch.items()}
        self._train_step = jax.jit(train_step, out_shardings=(self.state_shardings, self.replicated), donate_argnums=(0,))
        self._predict = jax.jit(predict, out_shardings=self.replicated)
        self._init_state = jax.jit(init_state, out_shardings=self.state_shardings)

    def _context(self):
        import contextlib

        import flax.linen as nn
        import jax

        stack = contextlib.ExitStack()
        stack.enter_context(jax.set_mesh(self.mesh))
        stack.enter_context(nn.logical_axis_rules(self.rules))
        return stack

    def fresh_params(self, seed: int):
        """Random transformer + head, created already sharded."""
        import flax.linen as nn
        import jax

        with self._context():
            return jax.jit(lambda r: nn.meta.unbox(self._init(r)), out_shardings=self.param_shardings)(
                jax.random.key(seed))

    def state(self, params):
        import jax

        params = jax.tree.map(lambda x, a: jax.numpy.asarray(x, a.dtype), params, self.abstract_params)
        params = jax.device_put(params, self.param_shardings)
        with self._context():
            return self._init_state(params)

    def put(self, batch):
        import jax

        return {k: jax.device_put(v, s) for (k, v), s in zip(batch.items(), self._batch_shardings(batch).values())}

    def train_step(self, state, batch):
        with self._context():
            return self._train_step(state, self.put(batch))

    def predict(self, params, batch):
        with self._context():
            return self._predict(params, self.put(batch))


# ---- the run ----------------------------------------------------------------------------------------

def _subset(n: int, k: int, seed: int) -> np.ndarray:
    if not k or k >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:k])


def predict_split(programs: Programs, params, enc: Encoded, batch_size: int, n_ctx: int, markers, task: Task) -> np.ndarray:
    """Predictions for every example of `enc`, in order (the last batch padded, its filler dropped)."""
    import jax

    from gpt1_jax import heads

    outs = []
    for start in range(0, len(enc.seqs), batch_size):
        rows = np.arange(start, min(start + batch_size, len(enc.seqs)))
        out = jax.device_get(programs.predict(params, make_batch(enc, rows, batch_size, n_ctx, markers)))
        outs.append(np.asarray(out)[: len(rows)])
    out = np.concatenate(outs) if outs else np.zeros((0, task.n_outputs), np.float32)
    return heads.predictions(task.kind, task.regression, out)


def _format_label(task: Task, value, names: bool) -> str:
    if task.regression:
        return f"{float(value):.6g}"
    if names and task.label_names:
        return task.label_names[int(value)]
    return str(int(value))


def write_predictions(path: Path, task: Task, enc: Encoded, preds: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["index\tprediction\tlabel"]
    for ex, p in zip(enc.examples, preds):
        label = _format_label(task, ex["label"], True) if ex["label"] != -1 else ""
        lines.append(f"{ex['idx']}\t{_format_label(task, p, True)}\t{label}")
    path.write_text("\n".join(lines) + "\n")


def write_submission(path: Path, task: Task, enc: Encoded, preds: np.ndarray) -> None:
    """GLUE's server format: `index<TAB>prediction`, labels as indices or (MNLI, QNLI, RTE) names."""
    lines = ["index\tprediction"] + [f"{ex['idx']}\t{_format_label(task, p, task.submit_names)}"
                                     for ex, p in zip(enc.examples, preds)]
    path.write_text("\n".join(lines) + "\n")


def run(config: FinetuneConfig, workdir: Path, *, init: str, data_dir: str | None = None, tokenizer: str | None = None,
        predict_test: bool = False, progress: bool = True, tfds_dir: str | None = None) -> dict:
    import jax

    from gpt1_jax import heads
    from gpt1_jax.metrics import MetricsWriter, Progress
    from gpt1_jax.sharding import batch_divisor, logical_rules, make_mesh

    workdir.mkdir(parents=True, exist_ok=True)
    say = (lambda m: print(m, file=sys.stderr)) if progress else (lambda m: None)
    task = make_task(config, data_dir, tfds_dir)

    # --- data --------------------------------------------------------------------------------------
    train_all = task.load("train")
    train_rows = _subset(len(train_all), config.max_train_examples, config.seed)
    train_examples = [train_all[i] for i in train_rows]
    model_config, transformer_params, tok, described = load_init(
        init, config, tokenizer, lambda: [t for ex in train_examples for t in task.texts(ex)])
    if transformer_params is not None:
        model_config, transformer_params = with_marker_rows(model_config, transformer_params, tok, config.seed)
    n_ctx = config.n_ctx or model_config.n_positions
    if n_ctx > model_config.n_positions:
        raise ConfigError(f"n_ctx={n_ctx} exceeds the model's n_positions={model_config.n_positions}")
    markers = heads.Markers.of(tok)
    train = encode_split(task, train_examples, tok, n_ctx)
    dev = {}
    for split in task.dev_splits:
        exs = task.load(split)
        dev[split] = encode_split(task, [exs[i] for i in _subset(len(exs), config.max_eval_examples, 0)], tok, n_ctx)
    test = {}
    if predict_test:
        for split in task.test_splits:
            exs = task.load(split)
            test[split] = encode_split(task, [exs[i] for i in _subset(len(exs), config.max_eval_examples, 0)], tok, n_ctx)
    if not train.seqs:
        raise ValueError(f"task {task.name}: the train split is empty")

    # --- model, optimizer, mesh --------------------------------------------------------------------
    mesh = make_mesh(config.mesh)
    eval_bs = config.eval_batch_size or config.batch_size
    for name, bs in (("batch_size", config.batch_size), ("eval_batch_size", eval_bs)):
        if bs % batch_divisor(mesh):
            raise ConfigError(f"{name}={bs} is not divisible by the mesh's data x fsdp = {batch_divisor(mesh)} devices")
    steps_per_epoch = math.ceil(len(train.seqs) / config.batch_size)
    total = steps_per_epoch * config.epochs
    optim = dataclasses.replace(config.optim, total_steps=total, warmup_steps=int(round(config.warmup_fraction * total)))
    config = dataclasses.replace(config, model=model_config, optim=optim, n_ctx=n_ctx)
    save_yaml(config, workdir / "config.yaml")
    tok.save(workdir / "tokenizer.json")
    programs = Programs(model_config, task, config, optim, mesh, logical_rules(config.mesh.rules))
    params = programs.fresh_params(config.seed)
    if transformer_params is not None:
        params = dict(params, transformer=transformer_params)
    state = programs.state(params)
    say(f"finetune {task.name}: init {described}; {model_config.num_params() / 1e6:.2f}M params; "
        f"{len(train.seqs)} train examples, {', '.join(f'{len(e.seqs)} {s}' for s, e in dev.items())}; "
        f"{total} steps; mesh {dict(mesh.shape)}")

    # --- train, evaluate every epoch, keep the best ------------------------------------------------
    metrics_log = MetricsWriter(workdir, tensorboard=False)
    bar = Progress(total, 0, enabled=progress, desc=f"finetune {task.name}")
    history, best, best_preds, best_params = [], None, {}, None
    main_key = f"{task.dev_splits[0]}/{task.metrics[0]}" if len(task.dev_splits) > 1 else task.metrics[0]
    t0 = time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        order = np.random.default_rng([config.seed, epoch]).permutation(len(train.seqs))
        losses = []
        for b in range(steps_per_epoch):
            rows = order[b * config.batch_size: (b + 1) * config.batch_size]
            state, m = programs.train_step(state, make_batch(train, rows, config.batch_size, n_ctx, markers))
            m = {k: float(v) for k, v in jax.device_get(m).items()}
            if not math.isfinite(m["loss"]):
                raise ValueError(f"loss is {m['loss']} at step {int(state.step)}: lower optim.lr")
            losses.append(m["loss"])
            metrics_log.write(int(state.step), epoch=epoch, **m)
            bar.update(1, epoch=epoch, loss=m["loss"])
        scores: dict[str, float] = {}
        preds_by_split = {}
        for split, enc in dev.items():
            preds = predict_split(programs, state.params, enc, eval_bs, n_ctx, markers, task)
            preds_by_split[split] = preds
            labelled = [i for i, ex in enumerate(enc.examples) if ex["label"] != -1]
            s = task.score([enc.examples[i] for i in labelled], preds[labelled]) if labelled else {}
            scores.update({(f"{split}/{k}" if len(dev) > 1 else k): v for k, v in s.items()})
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), **scores})
        metrics_log.write(int(state.step), epoch=epoch, **{f"dev/{k}": v for k, v in scores.items()})
        bar.write(f"epoch {epoch}: train_loss {np.mean(losses):.4f}  " + "  ".join(f"{k} {v:.4f}" for k, v in scores.items()))
        value = scores.get(main_key, float("nan"))
        if best is None or (math.isfinite(value) and not value <= best["value"]):
            best = {"epoch": epoch, "value": value, "scores": scores}
            best_preds = preds_by_split
            if predict_test:
                best_params = jax.device_get(state.params)  # host copy: the next epoch donates the state
    bar.close()
    metrics_log.close()
    train_seconds = time.perf_counter() - t0

    # --- outputs -------------------------------------------------------------------------------------
    pred_files = {}
    for split, preds in best_preds.items():
        path = workdir / "predictions" / f"{split}.tsv"
        write_predictions(path, task, dev[split], preds)
        pred_files[split] = str(path.relative_to(workdir))
    submission_files = {}
    if predict_test:
        params = jax.device_put(best_params, programs.param_shardings)
        for split, enc in test.items():
            preds = predict_split(programs, params, enc, eval_bs, n_ctx, markers, task)
            stem = task.submission(split) if task.submission else f"{task.name}_{split}"
            path = workdir / f"{stem}.tsv"
            write_submission(path, task, enc, preds)
            submission_files[split] = path.name
    results = {
        "task": task.name,
        "init": described,
        "seed": config.seed,
        "epoch": best["epoch"],
        "main_metric": main_key,
        "metric_names": list(best["scores"]),
        "metrics": best["scores"],
        "history": history,
        "n_train": len(train.seqs),
        "n_dev": {s: len(e.seqs) for s, e in dev.items()},
        "steps": total,
        "train_seconds": round(train_seconds, 2),
        "predictions": pred_files,
        "submission": submission_files,
        "config": to_dict(config),
    }
    (workdir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    say(f"best epoch {best['epoch']}: " + "  ".join(f"{k} {v:.4f}" for k, v in best["scores"].items())
        + f"  -> {workdir / 'results.json'}")
    return results
