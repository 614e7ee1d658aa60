"""Stage 3: Figure 2 (right), the zero-shot behaviour of the language model at every kept pre-training
checkpoint, with the paper's heuristics (docs/gpt1.md, "Analysis"):

  SST-2  append " very" and compare the probabilities of "positive" and "negative" as what comes next
  CoLA   the sentence's average token log-probability, thresholded; the threshold is the one that maximises
         Matthews correlation on (a subset of) train, the score is Matthews correlation on dev
  RACE   the answer with the highest average token log-probability given the passage and the question (the
         four answers share the passage's last n_ctx - M tokens, M their longest: option_logprobs)

Every text starts after the corpus' document separator (gpt1_jax.data.tokens.eod_id), as a document did in
pre-training; a sequence longer than the context loses the start of its context. Results are saved after
each checkpoint (results/zeroshot.json), so a stopped stage resumes at the next one.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments.paper.release import pretrain_config, pretraining_finished
from experiments.paper.settings import Paper, shown
from experiments.paper.stats import constant_baseline
from gpt1_jax.data.glue import METRICS, load_split
from gpt1_jax.data.race import load_race
from gpt1_jax.data.tasks import bucket_len, subset
from gpt1_jax.data.tokens import eod_id
from gpt1_jax.files import pyplot, save_figure
from gpt1_jax.generate import init_cache
from gpt1_jax.metrics import Bar
from gpt1_jax.model import GPT1
from gpt1_jax.tokenizer import find_tokenizer
from gpt1_jax.weights import load_pretrained


matthews = METRICS["matthews_corr"]  # GLUE's CoLA metric

CHANCE = {"sst2": 50.0, "cola": 0.0, "race": 25.0}  # a coin, a constant guess, one of four
TOKENS_PER_BATCH = 8192  # rows x padded length per forward pass


# ---- scoring continuations ---------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnums=0)
def _target_logprobs(config, params, tokens_BT, positions_BK, targets_BK):
    """log p(targets[b, k] | tokens[b, :positions[b, k] + 1]): the LM head only at the K scored positions."""
    model = GPT1(config)
    h_BTD = model.apply({"params": params}, tokens_BT)
    h_BKD = jnp.take_along_axis(h_BTD, positions_BK[..., None], axis=1)
    logits_BKV = model.apply({"params": params}, h_BKD, method=GPT1.logits)
    logp_BKV = jax.nn.log_softmax(logits_BKV.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp_BKV, targets_BK[..., None], axis=-1)[..., 0]


def continuation_logprobs(config, params, pairs: list[tuple[list[int], list[int]]]) -> np.ndarray:
    """[(context ids, continuation ids)] -> [n, 2]: each continuation's summed log-probability and its length.

    Sequences are sorted by length and padded to a few bucketed shapes (powers of two), so a whole set
    costs a handful of compilations."""
    n_ctx = config.n_positions
    seqs = []
    for context, continuation in pairs:
        continuation = continuation[-(n_ctx - 1):]
        seqs.append(((context + continuation)[-(n_ctx + 1):], len(continuation)))
    out = np.zeros((len(pairs), 2), np.float64)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    start = 0
    while start < len(order):
        length = bucket_len(len(seqs[order[start]][0]) - 1, n_ctx)
        batch = [i for i in order[start:start + max(1, TOKENS_PER_BATCH // length)] if len(seqs[i][0]) - 1 <= length]
        start += len(batch)
        rows = 1 << (len(batch) - 1).bit_length()  # a power of two: few shapes, little padding in a last batch
        k = bucket_len(max(seqs[i][1] for i in batch), n_ctx)
        tokens = np.zeros((rows, length), np.int32)
        positions = np.zeros((rows, k), np.int32)
        targets = np.zeros((rows, k), np.int32)
        for row, i in enumerate(batch):
            seq, c = seqs[i]
            tokens[row, : len(seq) - 1] = seq[:-1]
            positions[row, :c] = np.arange(len(seq) - 1 - c, len(seq) - 1)  # the inputs that predict the continuation
            targets[row, :c] = seq[len(seq) - c:]
        logp = np.asarray(_target_logprobs(config, params, tokens, positions, targets))
        for row, i in enumerate(batch):
            c = seqs[i][1]
            out[i] = logp[row, :c].sum(), c
    return out


@functools.partial(jax.jit, static_argnums=0)
def _option_logprobs(config, params, context_BL, options_BNM):
    """log p(option token j | context, option tokens < j) for the N options of each of B contexts that fill
    positions 0..L-1: each context runs once, then its options continue from its keys and values."""
    model = GPT1(config)
    (B, L), (N, M) = context_BL.shape, options_BNM.shape[1:]
    h_BLD, variables = model.apply({"params": params, "cache": init_cache(config, B)}, context_BL, decode=True,
                                   start=0, mutable=["cache"])
    # batch is the 4th axis from the end of each cached key/value ([layers,] B, positions, heads, head dim)
    cache = jax.tree.map(lambda c: jnp.repeat(c, N, axis=c.ndim - 4), variables["cache"])
    options_RM = options_BNM.reshape(B * N, M)
    h_RMD, _ = model.apply({"params": params, "cache": cache}, options_RM[:, :-1], decode=True, start=L,
                           mutable=["cache"])
    h_RMD = jnp.concatenate([jnp.repeat(h_BLD[:, -1:], N, axis=0), h_RMD], axis=1)  # position L-1+j predicts token j
    logits_RMV = model.apply({"params": params}, h_RMD, method=GPT1.logits)
    logp_RMV = jax.nn.log_softmax(logits_RMV.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp_RMV, options_RM[..., None], axis=-1)[..., 0].reshape(B, N, M)


def option_logprobs(config, params, questions: list[tuple[list[int], list[list[int]]]]) -> np.ndarray:
    """[(context ids, [option ids] * N)] -> [n, N, 2] (N the same for every question): each option's summed
    log-probability given the context, and its length. A context that fills the window with its options runs once for all of them: its last
    n_ctx - M tokens (M: the options' longest, padded to a bucket) are the options' shared context, so every
    option of a question sees the same text. RACE's ~4 options of ~10 tokens after a ~350-token passage cost a
    quarter of what four separate sequences do. A shorter context is scored with its options one by one
    (continuation_logprobs), whole."""
    n_ctx, per_batch = config.n_positions, max(1, TOKENS_PER_BATCH // config.n_positions)
    n = len(questions[0][1]) if questions else 0
    out = np.zeros((len(questions), n, 2), np.float64)
    shared, alone = {}, []  # shared: {M: the questions whose options share a context of n_ctx - M tokens}
    for i, (context, options) in enumerate(questions):
        m = max(2, bucket_len(max(len(o) for o in options), n_ctx - 1))
        fills = len(context) >= n_ctx - m and m <= n_ctx // 2
        (shared.setdefault(m, []) if fills else alone).append(i)
    if alone:
        pairs = [(questions[i][0], option) for i in alone for option in questions[i][1]]
        out[alone] = continuation_logprobs(config, params, pairs).reshape(len(alone), n, 2)
    for m, members in sorted(shared.items()):
        for start in range(0, len(members), per_batch):
            batch = members[start:start + per_batch]
            rows = 1 << (len(batch) - 1).bit_length()
            context = np.zeros((rows, n_ctx - m), np.int32)
            options = np.zeros((rows, n, m), np.int32)
            for row, i in enumerate(batch):
                context[row] = questions[i][0][-(n_ctx - m):]
                for k, option in enumerate(questions[i][1]):
                    options[row, k, :len(option)] = option
            logp = np.asarray(_option_logprobs(config, params, context, options))
            for row, i in enumerate(batch):
                for k, option in enumerate(questions[i][1]):
                    out[i, k] = logp[row, k, :len(option)].sum(), len(option)
    return out


# ---- the three tasks ----------------------------------------------------------------------------------

def sst2_accuracy(config, params, tok, examples: list[dict]) -> float:
    start = [_eod(tok)]
    words = [tok.encode(" positive"), tok.encode(" negative")]  # labels 1 and 0
    pairs = [(start + tok.encode(ex["sentence"].strip() + " very"), w) for ex in examples for w in words]
    logp = continuation_logprobs(config, params, pairs)[:, 0].reshape(-1, 2)
    preds = np.where(logp[:, 0] > logp[:, 1], 1, 0)
    return 100.0 * float(np.mean(preds == np.asarray([ex["label"] for ex in examples])))


def sentence_scores(config, params, tok, examples: list[dict]) -> np.ndarray:
    """Average token log-probability of each CoLA sentence."""
    pairs = [([_eod(tok)], tok.encode(ex["sentence"])) for ex in examples]
    logp = continuation_logprobs(config, params, pairs)
    return logp[:, 0] / np.maximum(logp[:, 1], 1)


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The cut (predict acceptable above it) with the highest Matthews correlation on these examples."""
    values = np.unique(scores)
    cuts = np.concatenate([[values[0] - 1.0], (values[:-1] + values[1:]) / 2]) if len(values) > 1 else values - 1.0
    return float(max(cuts, key=lambda t: matthews(labels, scores > t)))


def cola_mcc(config, params, tok, train: list[dict], dev: list[dict]) -> float:
    cut = best_threshold(sentence_scores(config, params, tok, train), np.asarray([ex["label"] for ex in train]))
    dev_scores = sentence_scores(config, params, tok, dev)
    return 100.0 * float(matthews([ex["label"] for ex in dev], dev_scores > cut))


def race_accuracy(config, params, tok, examples: list[dict]) -> float:
    questions = [([_eod(tok)] + tok.encode(ex["article"] + " " + ex["question"]), [tok.encode(o) for o in ex["options"]])
                 for ex in examples]
    logp = option_logprobs(config, params, questions)
    average = logp[..., 0] / np.maximum(logp[..., 1], 1)
    return 100.0 * float(np.mean(average.argmax(axis=1) == np.asarray([ex["label"] for ex in examples])))


def _eod(tok) -> int:
    return eod_id(tok)


# ---- the stage ------------------------------------------------------------------------------------------

def load_sets(paper: Paper) -> dict[str, list[dict]]:
    """The evaluation sets, each a fixed subset (the same at every checkpoint)."""
    n = paper.budget.zeroshot_examples
    glue = lambda task, split: load_split(task, split, paper.data_dir, paper.tfds_dir)
    sets = {"sst2": glue("sst2", "validation"), "cola_train": glue("cola", "train"), "cola": glue("cola", "validation"),
            "race": load_race(paper.race, "validation")}
    return {name: [examples[i] for i in subset(len(examples), n[name], 0)] for name, examples in sets.items()}


CURVES = ("sst2", "cola", "race")  # zeroshot.json's scores of each step, in the order they are scored


def score_step(config, params, tok, sets: dict[str, list[dict]], bar: Bar) -> dict[str, float]:
    """One checkpoint's score on each curve's set, shown on `bar` as each one finishes."""
    scorers = {"sst2": lambda: sst2_accuracy(config, params, tok, sets["sst2"]),
               "cola": lambda: cola_mcc(config, params, tok, sets["cola_train"], sets["cola"]),
               "race": lambda: race_accuracy(config, params, tok, sets["race"])}
    scores = {}
    for name in CURVES:
        bar.set_postfix_str(scores_text(scores, scoring=name))
        scores[name] = scorers[name]()
        bar.update()
    bar.set_postfix_str(scores_text(scores))
    return scores


def scores_text(scores: dict[str, float], scoring: str | None = None) -> str:
    """The scores as "sst2 51.2  cola 3.0", then "race ..." while `scoring` is that set."""
    shown = [f"{name} {value:.1f}" for name, value in scores.items()]
    return "  ".join(shown + ([f"{scoring} ..."] if scoring else []))


def kept_steps(paper: Paper) -> list[int]:
    """The run's checkpoints of the curve: the recipe's keep_steps and its last step (orbax names each folder by its
    step; unfinished saves carry a suffix). The newest periodic checkpoints, there only until the next ones, are
    not scored: a run that spans sessions would leave a different few on the curve at each stop."""
    config = pretrain_config(paper)
    curve = set(config.keep_steps) | {config.steps}
    return sorted(s for p in (paper.pretrain_dir / "checkpoints").iterdir() if p.name.isdigit() and (s := int(p.name)) in curve)


def baselines(sets: dict[str, list[dict]]) -> dict[str, float]:
    """What a model that ignores its input scores on each curve's set (stats.constant_baseline): the majority
    label's share (SST-2), the majority answer letter's (RACE), and 0 for CoLA's MCC."""
    metric = {"sst2": "accuracy", "cola": "matthews_corr", "race": "accuracy"}
    return {name: constant_baseline(m, [ex["label"] for ex in sets[name]]) for name, m in metric.items()}


def standard_error(key: str, value: float, n: int) -> float:
    """One standard error of a score on n examples, in its points: binomial for accuracy, (1 - r^2) / sqrt(n - 1)
    for a correlation (CoLA's MCC is the phi coefficient)."""
    if key == "cola":
        r = value / 100.0
        return 100.0 * (1 - r * r) / np.sqrt(max(n - 1, 1))
    p = value / 100.0
    return 100.0 * float(np.sqrt(p * (1 - p) / max(n, 1)))


def above_baseline(zs: dict, key: str) -> list[int]:
    """The steps whose score is more than 2 standard errors above the set's baseline (about 95% one-sided)."""
    base, n = zs["baseline"][key], zs["n"][key]  # each curve is scored on the set of its name
    return [int(step) for step in sorted(zs["steps"], key=int)
            if (value := zs["steps"][step][key]) - base > 2 * standard_error(key, value, n)]


def scored_without_checkpoints(paper: Paper) -> bool:
    """Whether the curve needs none of the run's checkpoints: pre-training is finished and zeroshot.json scores every
    step of the curve on the budget's sets. A fresh clone of a finished pipeline holds those results, not the
    checkpoints, and the README's command stopped there: 'run the pretrain stage first', which has nothing to do."""
    if (paper.pretrain_dir / "checkpoints").is_dir() or not pretraining_finished(paper):
        return False
    saved, config = paper.load_json("zeroshot.json", {}), pretrain_config(paper)
    scored = {int(step) for step in saved.get("steps", {})}
    curve = set(config.keep_steps) | {config.steps}
    return saved.get("examples") == dict(paper.budget.zeroshot_examples) and curve <= scored


def zeroshot_stage(paper: Paper) -> bool:
    if scored_without_checkpoints(paper):
        print(f"zeroshot: every step of the curve is scored ({shown(paper.results_dir / 'zeroshot.json')})",
              file=sys.stderr)
        return False
    if not (paper.pretrain_dir / "checkpoints").is_dir():
        raise FileNotFoundError(f"{paper.pretrain_dir}: no pre-training checkpoints (run the pretrain stage first)")
    counts = {name: paper.budget.zeroshot_examples[name] for name in paper.budget.zeroshot_examples}
    saved = paper.load_json("zeroshot.json", {})
    steps = saved.get("steps", {}) if saved.get("examples") == counts else {}
    reference = {k: saved[k] for k in ("n", "baseline") if k in saved and steps}

    def save():
        paper.save_json("zeroshot.json", {"examples": counts, "chance": CHANCE, **reference, "steps": steps})

    todo = [step for step in kept_steps(paper) if str(step) not in steps]
    if todo or (steps and not reference):
        sets = load_sets(paper)
        if not reference:  # the sets' sizes and baselines, kept once (also for steps scored before they were)
            reference = {"n": {k: len(v) for k, v in sets.items()}, "baseline": baselines(sets)}
            if steps:
                save()
    # ~45 s a checkpoint at the laptop budget: a bar over every set of every checkpoint, each score shown as it comes
    with Bar(total=len(CURVES) * len(todo), desc="zeroshot", unit="set", file=sys.stderr, dynamic_ncols=True,
             disable=not todo or jax.process_index() != 0) as bar:
        for step in todo:
            bar.set_postfix_str("", refresh=False)  # the last step's scores are not this one's
            bar.set_description(f"zeroshot step {step}")
            config, params = load_pretrained(paper.pretrain_dir, step=step)
            tok = find_tokenizer(None, paper.pretrain_dir, model_vocab_size=config.vocab_size)
            steps[str(step)] = score_step(config, params, tok, sets, bar)
            bar.write(f"zeroshot: step {step}: " + scores_text(steps[str(step)]), file=sys.stderr)
            save()
    if not steps:
        raise FileNotFoundError(f"{paper.pretrain_dir}/checkpoints: no checkpoint to evaluate")
    plot(paper.load_json("zeroshot.json"), paper.results_dir / "zeroshot.png")
    return bool(todo)


def tick_labels(xs: list[str], min_ratio: float = 1.25) -> list[str]:
    """Each step's label, blank where it would sit on the last one shown (on a log axis, closer than
    `min_ratio`); the last step is always shown, displacing a too-close neighbour instead."""
    labels, last = [""] * len(xs), None
    for i, x in enumerate(xs):
        if last is None or int(x) >= min_ratio * int(xs[last]):
            labels[i], last = x, i
    if not labels[-1]:
        labels[last], labels[-1] = "", xs[-1]
    return labels


def plot(zs: dict, out: Path) -> None:
    """The three curves with one-standard-error bands, each set's chance and (where it differs) its majority
    baseline; the y-axis spans at least 5 points either side of the baseline, so noise does not look like a trend."""
    plt = pyplot()

    steps = zs["steps"]
    xs = sorted(steps, key=int)
    titles = {"sst2": "SST-2 accuracy", "cola": "CoLA Matthews corr.", "race": "RACE accuracy"}
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=110)
    for ax, (key, title) in zip(axes, titles.items()):
        x = [int(s) for s in xs]
        y = np.asarray([steps[s][key] for s in xs])
        ax.plot(x, y, "o-", color="tab:blue", label="zero-shot")
        ax.axhline(CHANCE[key], color="gray", ls="--", label="chance")
        span = [float(y.min()), float(y.max()), CHANCE[key]]
        if "n" in zs:  # kept since 2026-11-26: sizes and baselines, so the noise can be drawn
            base, n = zs["baseline"][key], zs["n"][key]
            se = np.asarray([standard_error(key, v, n) for v in y])
            ax.fill_between(x, y - se, y + se, color="tab:blue", alpha=0.2, label="± 1 standard error")
            if abs(base - CHANCE[key]) > 1e-9:
                ax.axhline(base, color="tab:red", ls=":", label="majority")
            span += [base - 5, base + 5, float((y - se).min()), float((y + se).max())]
        ax.set_ylim(min(span) - 0.5, max(span) + 0.5)
        ax.set_xscale("log")
        ax.set_xticks(x, tick_labels(xs), fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("pre-training updates")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Zero-shot performance over pre-training (paper Figure 2, right)")
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)
