"""Stages 1-2: pre-training (gpt1_jax.pretrain, resumable by itself) and the release: the final parameters and
tokenizer as a Hugging Face folder (save_pretrained) that `--init` and `load_pretrained` read, with a model card.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from experiments.paper.settings import PAPER_DIR, RELEASE_DTYPES, RELEASE_MAX_BYTES, Paper, shown
from gpt1_jax import pretrain
from gpt1_jax.checkpoint import latest_step
from gpt1_jax.config import PretrainConfig, load_yaml, resolve
from gpt1_jax.data.race import load_race
from gpt1_jax.errors import ConfigError
from gpt1_jax.evaluate import evaluate
from gpt1_jax.files import atomic_write_text
from gpt1_jax.integrity import newest_checkpoint, newest_intact_checkpoint
from gpt1_jax.metrics import read_metrics
from gpt1_jax.tokenizer import find_tokenizer
from gpt1_jax.weights import load_pretrained, save_pretrained


def pretrain_config(paper: Paper) -> PretrainConfig:
    """The pre-training recipe (experiments/paper/pretrain.yaml unless told otherwise) in the budget's shape (--quick:
    tiny), with --corpus as its data."""
    config = paper.budget.pretrain_shape(resolve(PretrainConfig, paper.pretrain_config))
    data = config.data
    if paper.corpus:
        data = dataclasses.replace(data, source=paper.corpus)
    if paper.quick:  # keep the user's token cache free of the quick run's tiny vocabulary
        data = dataclasses.replace(data, cache_dir=str(paper.out / "token-cache"))
    return dataclasses.replace(config, data=data)


def trained_step(workdir: Path) -> int | None:
    """The newest checkpoint's step, or None before the first one."""
    try:
        return latest_step(workdir / "checkpoints")
    except FileNotFoundError:
        return None


def pretraining_finished(paper: Paper) -> bool:
    """Whether the pretrain stage has nothing left to train: its run reached the recipe's steps, or, in a fresh
    clone, the committed release was exported from that step (pretrain_stage's own test, without its side effects)."""
    step = trained_step(paper.pretrain_dir)
    if step is None:
        step = card_step(paper.release_dir)
    return step is not None and step >= pretrain_config(paper).steps


def pretrain_stage(paper: Paper) -> bool | None:
    config = pretrain_config(paper)
    step = trained_step(paper.pretrain_dir)
    if step is None:  # a fresh clone: a finished pipeline's release, or a stopped run's kept copy
        released = card_step(paper.release_dir)
        if released is not None and released >= config.steps:
            print(f"pretrain: {shown(paper.release_dir)} is released from step {released}{unread_corpus(paper)}",
                  file=sys.stderr)
            return False
        step = restore_pretraining(paper)
    if step is not None and step >= config.steps:
        print(f"pretrain: {paper.pretrain_dir} is trained to step {step}{unread_corpus(paper)}", file=sys.stderr)
        return False
    outcome = pretrain.run(config, paper.pretrain_dir)
    if outcome.status == "diverged":
        raise outcome.divergence()
    if outcome.finished:  # the release stage exports it next; the kept copy's last state stays in git's history
        shutil.rmtree(kept_pretraining(paper), ignore_errors=True)
        return True
    keep_pretraining(paper)  # preempted (SIGTERM): the pipeline stops; the same command resumes, in a fresh clone too
    return None


def unread_corpus(paper: Paper) -> str:
    """A --corpus that a finished pre-training will not read (another text than the run's): said, where it was
    dropped without a word."""
    saved = paper.pretrain_dir / "config.yaml"
    source = load_yaml(PretrainConfig, saved).data.source if saved.is_file() else None
    if not paper.corpus or paper.corpus == source:
        return ""
    trained = f"the run trained on {source}" if source else "the release is trained"
    return f" (--corpus {paper.corpus} not read: {trained}; a new --out pre-trains on it)"


KEPT_RUN_FILES = ("config.yaml", "run.json", "data_info.json", "metrics.jsonl", "tokenizer.json")  # + the newest checkpoint


def kept_pretraining(paper: Paper) -> Path:
    """results/pretraining/: a stopped pre-training run, kept beside the results (committed, like the
    fine-tuning runs' records) because a session's workdirs do not outlive it and the run spans sessions."""
    return paper.results_dir / "pretraining"


def keep_pretraining(paper: Paper) -> int | None:
    """Copies the run's newest intact checkpoint (the whole train state: exact resume) and its run files into
    results/pretraining/, replacing the previous copy whole -> the kept step (None: no checkpoint to keep).
    The kept steps for the zero-shot curve are not copied: the zeroshot stage scores them in the session
    that wrote them."""
    checkpoints = paper.pretrain_dir / "checkpoints"
    step = newest_intact_checkpoint(checkpoints)
    if step is None:
        return None
    kept = kept_pretraining(paper)
    fresh, old = kept.with_name(kept.name + ".new"), kept.with_name(kept.name + ".old")
    for leftover in (fresh, old):
        shutil.rmtree(leftover, ignore_errors=True)
    shutil.copytree(checkpoints / str(step), fresh / "checkpoints" / str(step))
    for marker in (fresh / "checkpoints").rglob("commit_success.txt"):  # orbax's marker names the folder's
        marker.write_text("Checkpoint commit was successful\n")  # absolute path: no machine's path is committed
    for name in KEPT_RUN_FILES:
        if (paper.pretrain_dir / name).is_file():
            shutil.copy2(paper.pretrain_dir / name, fresh / name)
    if (fresh / "data_info.json").is_file():  # its "cache" is this machine's token cache, an absolute path
        info = json.loads((fresh / "data_info.json").read_text())
        info.pop("cache", None)
        (fresh / "data_info.json").write_text(json.dumps(info, indent=2) + "\n")  # fresh/ is not kept yet
    if kept.exists():
        kept.rename(old)
    fresh.rename(kept)  # the copy is whole before it replaces the previous one
    shutil.rmtree(old, ignore_errors=True)
    print(f"pretrain: kept step {step} in {shown(kept)}; a fresh clone resumes from it", file=sys.stderr)
    return step


def restore_pretraining(paper: Paper) -> int | None:
    """Puts the kept run back into an empty pre-training workdir -> its step (None: nothing kept)."""
    kept = kept_pretraining(paper)
    step = newest_checkpoint(kept / "checkpoints")
    if step is None:
        return None
    shutil.copytree(kept, paper.pretrain_dir, dirs_exist_ok=True)
    print(f"pretrain: resuming from step {step}, kept in {shown(kept)}", file=sys.stderr)
    return step


def card_step(release: Path) -> int | None:
    """The pre-training step the release was exported from (its model card's front matter)."""
    card = release / "README.md"
    if not card.is_file():
        return None
    front = card.read_text().split("---")
    return yaml.safe_load(front[1]).get("pretrain_step") if len(front) > 2 else None


def release_stage(paper: Paper) -> bool:
    """Exports the pre-training run's last checkpoint, unless the release already is that checkpoint."""
    step = trained_step(paper.pretrain_dir)
    if step is None:
        if (paper.release_dir / "config.json").is_file():
            print(f"release: no pre-training run at {paper.pretrain_dir}; keeping {paper.release_dir}", file=sys.stderr)
            return False
        raise FileNotFoundError(f"{paper.pretrain_dir}: no pre-training checkpoint to release (run the pretrain stage)")
    if card_step(paper.release_dir) == step:
        print(f"release: {paper.release_dir} holds step {step} already", file=sys.stderr)
        return False
    config, params = load_pretrained(paper.pretrain_dir, step=step)
    dtype = release_dtype(paper)
    stored = np.dtype(dtype).itemsize * config.num_params()
    if paper.committed and stored > RELEASE_MAX_BYTES:
        raise ConfigError(f"{paper.release_dir} is committed: {stored / 2**20:.1f} MB of parameters "
                          f"exceed its budget of {RELEASE_MAX_BYTES / 2**20:.0f} MB")
    tokenizer = find_tokenizer(None, paper.pretrain_dir, model_vocab_size=config.vocab_size)
    save_pretrained(config, params, paper.release_dir, overwrite=True, tokenizer=tokenizer, dtype=dtype)
    write_model_card(paper, config, params, step)
    print(f"release: step {step} -> {paper.release_dir} "
          f"({sum(f.stat().st_size for f in paper.release_dir.iterdir()) / 2**20:.1f} MB)", file=sys.stderr)
    return True


def release_dtype(paper: Paper) -> str:
    return RELEASE_DTYPES.get(paper.release_dir.name, "float32") if paper.committed else "float32"


def write_model_card(paper: Paper, config, params, step: int) -> None:
    """The release's README.md, from the pre-training run's files and, with --race, its perplexity on novel text."""
    size = sum(f.stat().st_size for f in paper.release_dir.iterdir() if f.name != "README.md")
    run_config = pretrain_config(paper)
    info = json.loads((paper.pretrain_dir / "data_info.json").read_text())
    val = [r for r in read_metrics(paper.pretrain_dir) if "val_ppl" in r and r["step"] <= step]
    novel = novel_perplexity(paper, dataclasses.replace(run_config, model=config), params) if paper.race else None
    (paper.release_dir / "README.md").write_text(
        model_card(paper, config, run_config, info, step, val[-1] if val else None, size, novel))


def novel_text(paper: Paper) -> tuple[Path, int]:
    """RACE's dev passages (English exam texts, none of them in the pre-training corpus), each once, as a text
    file of documents (OUT/race_dev_passages.txt): text no release has seen, so releases compare on it.
    -> (the file, its passages)."""
    articles = dict.fromkeys(re.sub(r"\n\s*\n+", "\n", q["article"].strip()) for q in load_race(paper.race, "dev"))
    path = paper.out / "race_dev_passages.txt"
    atomic_write_text(path, "\n\n".join(articles) + "\n")  # blank lines part documents (gpt1_jax/data/sources.py)
    return path, len(articles)


def novel_perplexity(paper: Paper, run: PretrainConfig, params) -> dict:
    """`gpt1-jax evaluate --init RELEASE --data OUT/race_dev_passages.txt`: every window of the pre-training's
    length (`run`, with the released model), in the release's tokenizer -> evaluate's dict, plus the passage
    count. Said first: evaluate's bar starts only once the passages are read and tokenized."""
    print("release: measuring the model card's perplexity on novel text (RACE's dev passages)", file=sys.stderr,
          flush=True)
    path, passages = novel_text(paper)
    result = evaluate(run, params, run=None, data=str(path), tokenizer=str(paper.release_dir / "tokenizer.json"),
                      progress=True)
    return {**result, "documents": passages}


# What the shared corpora hold and under which terms (the data folder's README): the model card names them.
CORPUS_SOURCES = {
    "english_mixed.txt.gz": "Project Gutenberg books (public domain in the US) and NLTK's 2008 data release: the Brown "
                            "corpus, Reuters-21578, movie reviews, ABC transcripts, State of the Union and inaugural "
                            "speeches, web text and a WSJ sample (each under its own terms, research use)",
    "default": "CPython's documentation, embedded in the package (Python Software Foundation License)",
}


# What the pipeline itself writes into the checkout (its committed results and releases, the kept pre-training
# it removes when the run ends): a change there is the run's output, not a change to the code that made it.
PIPELINE_OUTPUTS = (":(top,exclude,glob)experiments/paper/results*/**", ":(top,exclude,glob)experiments/paper/release*/**")


def source_commit(where: Path = PAPER_DIR) -> str:
    """The commit of the repository holding `where`, marked when the code differs from it; "unknown" outside a
    git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ":/", *PIPELINE_OUTPUTS).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return "unknown" if head.returncode else head.stdout.strip()[:12] + (" (with uncommitted changes)" if dirty else "")


def novel_row(novel: dict | None) -> str:
    if not novel:
        return ""
    return (f"| novel text | loss {novel['loss']:.3f} nats/token, perplexity {novel['perplexity']:.1f} on RACE's "
            f"{novel['documents']:,} dev passages (English exam texts, not in the corpus; {novel['tokens']:,} tokens in "
            f"{novel['seq_len']}-token windows): `gpt1-jax evaluate --init RELEASE --data FILE` of the passages |\n")


BF16_NOTE = "; read back as float32, so its fine-tuning runs start from these rounded values"


def model_card(paper: Paper, config, run: PretrainConfig, info: dict, step: int, val: dict | None, size: int,
               novel: dict | None = None) -> str:
    tokens_seen = step * run.data.global_batch_size * run.data.seq_len
    dtype = release_dtype(paper)
    stored = f"{dtype} ({size / 2**20:.1f} MB with the tokenizer){BF16_NOTE if dtype == 'bfloat16' else ''}"
    train_tokens = info["tokens"] * info["train_windows"] / max(info["windows"], 1)
    corpus = Path(str(info["source"])).name
    release = shown(paper.release_dir)
    # the stages that make this folder, with what they read: the whole pipeline's command needs --data-dir too
    inputs = [f"--{flag} {shown(value)}" for flag, value in (("corpus", info["source"]), ("race", paper.race),
                                                             ("out", None if paper.committed else paper.out)) if value]
    command = (f"python -m experiments.paper.run --pretrain-config {shown(paper.pretrain_config)} --budget "
               f"{paper.budget_name} {' '.join(inputs)} --stages pretrain,release")
    ppl = (f"validation loss {val['val_loss']:.3f} nats/token, perplexity {val['val_ppl']:.1f} (step {val['step']}, "
           f"{f'{run.eval_batches} batches' if run.eval_batches else 'every window'} of the held-out "
           f"{run.data.val_fraction:.0%} of windows)") if val else "not evaluated"
    return f"""---
pretrain_step: {step}
library_name: gpt1-jax
tags: [gpt1, openai-gpt]
---
# GPT-1, small ({config.num_params() / 1e6:.1f}M parameters)

GPT-1's architecture and pre-training recipe (docs/gpt1.md) at small scale: `{shown(paper.pretrain_config)}` on
`{corpus}`, run by experiments/paper/run.py (results: {shown(paper.results_dir)}/), exported from commit
{source_commit()} by

    {command}

| | |
|---|---|
| shape | {config.n_layers} post-LN blocks, width {config.d_model}, {config.n_heads} heads of {config.head_dim}, MLP {config.d_mlp}, context {config.n_positions}, learned positions, tied LM head |
| vocabulary | {config.vocab_size - 3:,} BPE ids trained on the corpus (lowercased, `</w>` word ends) + the 3 fine-tuning markers |
| parameters | {config.num_params():,}, {stored} |
| data | `{corpus}`: {info['documents']:,} documents, {info['tokens']:,} tokens ({train_tokens:,.0f} for training) |
| sources | {CORPUS_SOURCES.get(corpus, "not recorded")} |
| budget | {step:,} updates of {run.data.global_batch_size} x {run.data.seq_len} tokens = {tokens_seen:,} tokens seen, {tokens_seen / max(train_tokens, 1):.2f} epochs of the {train_tokens:,.0f} training tokens; Adam (`{run.optim.name}`), peak lr {run.optim.lr:g}, {run.optim.warmup_steps} warmup updates then {run.optim.schedule.removeprefix('warmup_')} decay |
| result | {ppl} |
{novel_row(novel)}
Files: `config.json` + `model.safetensors` (Hugging Face's `OpenAIGPTLMHeadModel` layout), `vocab.json` +
`merges.txt` + `tokenizer.json` + `tokenizer_config.json` (our ids; transformers' `OpenAIGPTTokenizer` reads them).

    gpt1-jax sample --init {release} --prompt "the old man"
    gpt1-jax finetune --task sst2 --init {release} --data-dir GLUE_DIR --workdir runs/sst2
    python -m experiments.glue.glue_table --init {release} --data-dir GLUE_DIR --out runs/glue

Limitations: a toy, {config.num_params() / 117e6:.1%} of GPT-1's size, that saw {tokens_seen / 1e6:.1f}M tokens
of `{corpus}` (not BooksCorpus) with a {run.data.seq_len}-token context, so long inputs (RACE passages) are cut.
Its perplexity is on its own tokenizer and held-out text and cannot be compared with the paper's 18.4. It
writes locally fluent but meaningless text and carries the biases of its sources.
"""
