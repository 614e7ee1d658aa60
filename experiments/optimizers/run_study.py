"""Optimizer comparison (issue 14): the same model, initialisation, data order, tokenizer and token budget for
each optimizer; a learning-rate sweep per optimizer, extended until its best rate is bracketed; three seeds at
each one's best rate; cost columns; then fine-tuning of the released model with the best four.

    # pre-training: the paper-at-laptop-scale recipe (experiments/paper/pretrain.yaml) at 800 of its 2,400
    # updates (3.28M tokens), on the corpus it was trained on; --quick: `tiny`, minutes
    python -m experiments.optimizers.run_study pretrain --out runs/opt-study --corpus CORPUS [--quick]
    # the cost columns: each optimizer's step at the study's shape and at the 117M `gpt1` shape (quiet machine)
    python -m experiments.optimizers.run_study bench --out runs/opt-study
    # fine-tuning the released laptop-scale model (experiments/paper/release) on SST-2 and MRPC with the best
    # four optimizers of the pre-training study plus gpt1_adam
    python -m experiments.optimizers.run_study finetune --out runs/opt-study --data-dir GLUE_DIR
    # any of them with --tables: the outputs again from the finished runs' records alone, training nothing
    # any of them with --set KEY=VALUE (repeatable): a config field of every run, e.g. model.n_layers=2

This file makes the runs (pre-training, bench, fine-tuning) and holds the command line; sweep.py beside it
is the lr ladder, the records and the loop, tables.py the outputs read off the records.

Outputs under `<out>/<study>/` (fine-tuning: `<out>/finetune/<task>/`): results.json (every run), results.md
(one row per optimizer) and PNGs (validation loss vs tokens and vs training seconds at each optimizer's best
lr; final loss vs lr with the bracket). Each (optimizer, lr, seed) has its own run dir
`runs/<optimizer>/lr<lr>_s<seed>/` whose `record.json` marks it finished; `--records DIR` also keeps every
record there (committed with the results), so a study spanning sessions resumes without its run dirs. A
diverged run (NaN loss: DivergenceError) is recorded as diverged and counts as worse than any finite loss.

Same seed => same init and same data order: `seed` drives the parameter init and the dropout masks,
`data.seed` the window order; the sweep uses the first seed, the extra seeds repeat the best lr.

Schedule-free AdamW trains at y (TrainState.params) but is evaluated at x (`gpt1_jax.optim.eval_params`):
pre-training's validation hook, fine-tuning's dev hook and `load_pretrained` (a workdir as `--init`) all
use x, so this runner reports what the runs log.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("run_study.py: error: run it from the repository root as: "
          "python -m experiments.optimizers.run_study ...", file=sys.stderr)
    sys.exit(2)

import argparse
import dataclasses
import functools
import json
import shutil
import time
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax

from experiments import harness
from experiments.lr_grid import lr_grid
from experiments.optimizers.sweep import finite, median, run_name, study_loop
from experiments.optimizers.tables import REFERENCE, UNIGRAM, load_bench, load_unigram, write_outputs
from experiments.paper.settings import shown
from gpt1_jax import bench, compile_cache
from gpt1_jax.arguments import at_least, number_at_least
from gpt1_jax.config import FinetuneConfig, PretrainConfig, apply_overrides, load_yaml, preset, resolve
from gpt1_jax.data.pipeline import build_pipeline, unigram_loss
from gpt1_jax.data.sources import open_source
from gpt1_jax.data.tokens import tokenizer_for
from gpt1_jax.errors import ConfigError
from gpt1_jax.files import atomic_write_text
from gpt1_jax.flops import cpu_flags
from gpt1_jax.loop import Outcome
from gpt1_jax.metrics import read_metrics
from gpt1_jax.model import init_params
from gpt1_jax.optim import OPTIMIZERS, optimizer_state_bytes, uses_eval_params
from gpt1_jax.tokenizer import GPT1Tokenizer
from gpt1_jax.weights import load_pretrained

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "experiments" / "paper" / "pretrain.yaml"  # the paper-at-laptop-scale pre-training recipe
RELEASE = ROOT / "experiments" / "paper" / "release"  # the model that recipe produced, with its tokenizer

# Per optimizer: centre lr of the pre-training sweep and of the fine-tuning grid, and the config overrides
# that make it itself (its own hyper-parameters; the rest are OptimConfig defaults). The pre-training sweep
# grows past either end of its grid until the best lr is bracketed, so a centre only decides where it starts.
SPECS: dict[str, dict[str, Any]] = {
    "gpt1_adam": dict(pretrain_lr=1e-3, finetune_lr=3e-4, overrides={}),
    "adamw": dict(pretrain_lr=1e-3, finetune_lr=3e-4, overrides={"b2": 0.95}),
    "adafactor": dict(pretrain_lr=3e-2, finetune_lr=3e-3, overrides={}),
    "lion": dict(pretrain_lr=3e-4, finetune_lr=3e-5, overrides={"b1": 0.9, "b2": 0.99, "weight_decay": 0.1}),
    "sgd_nesterov": dict(pretrain_lr=0.3, finetune_lr=3e-2, overrides={"momentum": 0.9}),
    "muon": dict(pretrain_lr=3e-3, finetune_lr=3e-4, overrides={}),
    "schedule_free_adamw": dict(pretrain_lr=1e-3, finetune_lr=3e-4, overrides={"schedule": "warmup_constant"}),
    "lamb": dict(pretrain_lr=1e-2, finetune_lr=1e-3, overrides={"eps": 1e-6}),
}

# Budgets. Full pre-training: the recipe's model, tokenizer, batch (16 x 256) and schedule shape (warmup, then
# cosine to 0) at 800 of its 2,400 updates = 3.28M tokens, above both of the floors (2.5M tokens; 25%
# of the recipe's 9.8M). The warmup is 300 updates, not the recipe's 1/6 share: ramped over 1/6 of 800 (133
# updates) Adam reaches 1e-3 fast enough to sit on the unigram plateau (docs/gpt1.md) and the study would
# rank plateau escapes; a 300-update ramp to 1e-3 is measured to escape it. ~21 min per run on
# 2 cores at the recipe's ~2,400 tokens/s.
PRETRAIN = {
    "full": dict(config=str(RECIPE), steps=800, warmup_share=300 / 800, eval_every=100, eval_batches=0,
                 data={}),
    # benched as the full budget is (BENCH_STEPS after BENCH_WARMUP): the time columns are scaled by the bench step,
    # and the single cold step --quick once timed took ~10x a warm one (tokens/s 5x below what the runs measured)
    "quick": dict(config="tiny", steps=24, eval_every=8, eval_batches=4,
                  bench_shapes={"study": None, "tiny_1x64": ("tiny", 1, 64)},
                  data=dict(global_batch_size=8, seq_len=64)),
}
# Fine-tuning: the paper's recipe (batch 32, 3 epochs, linear decay after 0.2% warmup, lambda 0.5) on 1,000
# training examples per task (a fixed subset per seed) and the whole dev set.
FINETUNE = {
    "full": dict(tasks=("sst2", "mrpc"), epochs=3, batch=32, max_train=1000, max_eval=0, n_ctx=128),
    "quick": dict(tasks=("sst2",), epochs=1, batch=16, max_train=64, max_eval=64, n_ctx=64),
}
# The bench columns' shapes: the study's own, and GPT-1's 117M model at batch 2 x 512 (a CPU-sized batch of its
# context). --quick benches a tiny preset shape in its place (compiling the 117M step would be most of a test's
# time): its tables' 117M column reads "-".
BENCH_SHAPES = {"study": None, "gpt1_117M": ("gpt1", 2, 512)}
BENCH_STEPS, BENCH_WARMUP = 5, 2  # each bench column: the median of 5 steps after 2 untimed ones, in either budget


def step_times(records: list[dict], tokens_per_step: int) -> dict[int, float]:
    """step -> seconds of that training step, as logged (`step_s`; records from before it: from the tokens/s, then
    the step's own; the loop restarts its clock after evaluating, so evaluation is not in it). A step slower than
    5x the median (the process paused, or the machine briefly shared) counts as the median, and so does step 1
    where an older record timed it (its compilation; the loop logs no rate for it now): the study compares the
    optimizers' training cost, not the machine's interruptions."""
    out = {r["step"]: r["step_s"] if finite(r.get("step_s")) else tokens_per_step / r["tokens_per_s"]
           for r in records if finite(r.get("tokens_per_s"))}
    if len(out) > 1:
        typical = median(v for k, v in out.items() if k != 1)
        out = {k: typical if k == 1 or v > 5 * typical else v for k, v in out.items()}
    return out


def curve_with_time(val: list[tuple[int, float]], times: dict[int, float]) -> list[dict]:
    """[(step, loss)] -> [{step, val_loss, train_seconds}] with the cumulative training time at each step."""
    out, total, steps = [], 0.0, sorted(times)
    i = 0
    for step, loss in val:
        while i < len(steps) and steps[i] <= step:
            total += times[steps[i]]
            i += 1
        out.append({"step": step, "val_loss": loss, "train_seconds": round(total, 3)})
    return out


# ---- pre-training -------------------------------------------------------------------------------------

def base_config(budget: dict) -> PretrainConfig:
    """The budget's config before the study sets anything per run: the recipe or a preset, at the budget's data
    shape, with the user's --set (`budget["sets"]`)."""
    base = resolve(PretrainConfig, budget["config"])
    base = dataclasses.replace(base, data=dataclasses.replace(base.data, **budget["data"]))
    return apply_overrides(base, budget.get("sets", ()))


def pretrain_config(budget: dict, name: str, lr: float, seed: int, tokenizer: str, cache_dir: str | None):
    """The budget's base config (the recipe, or a preset) cut to `budget["steps"]` updates with the same
    schedule shape; the warmup is `warmup_share` of the run (default: the base config's share)."""
    b, base, r = budget, base_config(budget), dataclasses.replace
    warmup = max(1, round(b["steps"] * b.get("warmup_share", base.optim.warmup_steps / base.steps)))
    data = r(base.data, source=b["source"], tokenizer=tokenizer, seed=seed, cache_dir=cache_dir or base.data.cache_dir)
    optim = r(base.optim, name=name, lr=lr, warmup_steps=warmup, total_steps=b["steps"], **SPECS[name]["overrides"])
    return r(base, data=data, optim=optim, steps=b["steps"], seed=seed, eval_every=b["eval_every"],
             eval_batches=b["eval_batches"], checkpoint_every=b["eval_every"], log_every=1, keep_checkpoints=1,
             keep_steps=(), stats_every=b["eval_every"])


def prepare_tokenizer(study: Path, budget: dict, tokenizer: str | None) -> str:
    """One tokenizer for every run (the token cache, keyed by it, is then shared): `tokenizer` if given; for the
    full budget the recipe's own, from the release; otherwise a BPE trained once on the corpus."""
    if tokenizer:
        return str(Path(tokenizer).absolute()) if Path(tokenizer).exists() else tokenizer
    if budget["config"] == str(RECIPE) and (RELEASE / "tokenizer.json").is_file():
        return str(RELEASE / "tokenizer.json")
    vocab = base_config(budget).data.vocab_size
    tokdir = study / "tokenizer"
    tokenizer_for(open_source(budget["source"]), tokdir, vocab_size=vocab, tokenizer="train")
    return str((tokdir / "tokenizer.json").absolute())


def pretrain_run(study: Path, budget: dict, name: str, lr: float, seed: int, tokenizer: str,
                 cache_dir: str | None, records: Path | None = None) -> dict | None:
    """The run's record (made now, or found); None when the run stopped at a checkpoint before its last step
    (SIGTERM), which the next invocation resumes; a run that failed is the study's error (harness.record_of)."""
    run = harness.Run(pretrain_config(budget, name, lr, seed, tokenizer, cache_dir), study / "runs" / name / run_name(lr, seed))
    same = {"steps": budget["steps"], "sets": list(budget.get("sets", ()))}
    summarize = functools.partial(pretrain_record, study=study, name=name, lr=lr, seed=seed, tokenizer=tokenizer,
                                  same=same)
    done = harness.make(run, harness.Records(study, records), summarize, same,
                        announce=f"== {name} lr={lr:.3g} seed={seed} -> {run.workdir}")
    return harness.record_of(done)


def pretrain_record(run: harness.Run, outcome: Outcome, wall: float, *, study: Path, name: str, lr: float, seed: int,
                    tokenizer: str, same: dict) -> dict:
    """A pre-training run's record: its validation curve and costs; a diverged run is recorded as diverged (the
    study goes on)."""
    config, workdir = run.config, run.workdir
    diverged = outcome.status == "diverged"
    if Path(tokenizer).is_file() and not (workdir / "tokenizer.json").exists():  # finetune --init reads it there
        shutil.copy(tokenizer, workdir / "tokenizer.json")
    metrics = read_metrics(workdir)
    val = [(r["step"], r["val_loss"]) for r in metrics if finite(r.get("val_loss"))]
    tokens_per_step = config.data.global_batch_size * config.data.seq_len
    times = step_times(metrics, tokens_per_step)
    saved = workdir / "config.yaml"  # run() writes it with the tokenizer's real vocabulary size
    model = load_yaml(PretrainConfig, saved).model if saved.is_file() else config.model
    finals = [l for _, l in val]
    _prune_checkpoints(workdir)
    return {
        "study": "pretrain", "optimizer": name, "lr": lr, "seed": seed, "workdir": str(workdir.relative_to(study)),
        "steps": config.steps, "tokens": config.steps * tokens_per_step, "tokens_per_step": tokens_per_step,
        "schedule": f"{config.optim.schedule}, warmup {config.optim.warmup_steps} of {config.optim.total_steps}",
        "vocab_size": model.vocab_size,
        "final_val_loss": finals[-1] if finals and not diverged and val[-1][0] == config.steps else None,
        "best_val_loss": min(finals) if finals and not diverged else None,
        "val_curve": curve_with_time(val, times),
        "eval_at": "x (schedule_free_eval_params)" if uses_eval_params(name) else "params",
        "tokens_per_s": median(r.get("tokens_per_s") for r in metrics if r.get("step", 0) > 1),
        # ms, as the curve's: a quick run trains in ~0.3 s, which 0.01 s steps cut into ties
        "train_seconds": round(sum(times.values()), 3), "wall_seconds": round(wall, 2),
        "optimizer_state_bytes": optimizer_state_bytes(config.optim, _abstract_params(model)),
        "diverged": diverged, "error": f"DivergenceError: {outcome.message}" if diverged else None,
        "cpu_flags": " ".join(cpu_flags()),  # a study spanning sessions may span CPU kinds: its seconds differ
        "update_ratio": update_ratios(metrics), **same,
    }


def update_ratios(metrics: list[dict]) -> dict[str, list[list[float]]]:
    """Parameter group -> [[step, |update| / |params|], ...], from the per-layer statistics the run logged
    (stats_every, gpt1_jax/layer_stats.py)."""
    out: dict[str, list[list[float]]] = {}
    for row in metrics:
        for key, value in row.items():
            if key.startswith("stats/") and key.endswith("/update_ratio"):
                out.setdefault(key.removeprefix("stats/").removesuffix("/update_ratio"), []).append([row["step"], value])
    return out


def _abstract_params(model):
    return nn.meta.unbox(jax.eval_shape(functools.partial(init_params, model), jax.random.key(0)))


def _prune_checkpoints(workdir: Path) -> None:
    """Keep only the last checkpoint (the one fine-tuning may start from)."""
    ckdir = workdir / "checkpoints"
    steps = sorted(int(p.name) for p in ckdir.iterdir() if p.name.isdigit()) if ckdir.is_dir() else []
    for s in steps[:-1]:
        shutil.rmtree(ckdir / str(s), ignore_errors=True)


# ---- bench: the cost columns ------------------------------------------------------------------------------

def bench_optimizer(study: Path, budget: dict, name: str, tokenizer_vocab: int, records: Path | None = None) -> dict:
    """Median step time of `name`'s train step (forward + backward + update, `gpt1_jax.bench`) at the study's
    shape and at the 117M shape; written to <study>/bench/<name>.json (and kept under `records`, like a run's
    record) and merged into the table."""
    if (done := load_bench(study, records).get(name)) is not None:
        check_same_sets(done, budget, study / "bench" / f"{name}.json")
        return done
    result = {}
    shapes = budget.get("bench_shapes", BENCH_SHAPES)
    for shape, spec in shapes.items():
        if spec is None:  # the study's own config, its vocabulary as the tokenizer makes it
            config = pretrain_config(budget, name, SPECS[name]["pretrain_lr"], 0, "train", None)
            config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=tokenizer_vocab))
        else:
            preset_name, batch, seq = spec
            config = preset(PretrainConfig, preset_name)
            config = dataclasses.replace(
                config, data=dataclasses.replace(config.data, global_batch_size=batch, seq_len=seq),
                optim=dataclasses.replace(config.optim, name=name, **SPECS[name]["overrides"]))
        print(f"== bench {name} at {shape}", file=sys.stderr, flush=True)
        r = bench.run(config, steps=BENCH_STEPS, warmup=BENCH_WARMUP)
        B, T = config.data.global_batch_size, config.data.seq_len
        result[shape] = {"batch": B, "seq": T, "step_s": r["step_s_median"], "tokens_per_s": r["tokens_per_s"],
                         "mfu": r["mfu"], "compile_s": r.get("compile_s")}
    result["cpu_flags"], result["sets"] = r["cpu_flags"], list(budget.get("sets", ()))
    keep_json(result, study, records, f"bench/{name}.json")
    return result


def check_same_sets(found: dict, budget: dict, path: Path) -> None:
    """Refuses (ConfigError, one line) a measurement this study kept under other --set than this invocation's (a
    bench step or the unigram loss of another model or data shape would fill its columns)."""
    theirs, ours = found.get("sets", harness.ABSENT_MEANS["sets"]), list(budget.get("sets", ()))
    if theirs != ours:
        raise ConfigError(f"{path}: measured with --set {', '.join(theirs) or '(none)'}, and this study's is "
                          f"{', '.join(ours) or '(none)'}: give this study its own --out (and records)")


def keep_json(result: dict, study: Path, records: Path | None, name: str) -> None:
    """A measurement the tables read, written whole to <study>/NAME and kept as <records>/NAME (a fresh clone's)."""
    for path in [study / name] + ([records / name] if records is not None else []):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(result, indent=2) + "\n")


# ---- fine-tuning --------------------------------------------------------------------------------------

def best_pretrain_workdir(init: Path) -> Path:
    """A pre-training study dir -> the workdir of its lowest final validation loss; any other dir (a release
    folder, a run workdir) is taken as is."""
    results = init / "results.json"
    if not results.is_file():
        return init
    runs = [r for r in json.loads(results.read_text())["runs"] if finite(r.get("final_val_loss"))]
    if not runs:
        raise SystemExit(f"{results}: no finished pre-training run to start from")
    best = min(runs, key=lambda r: r["final_val_loss"])
    return init / best["workdir"] if not Path(best["workdir"]).is_absolute() else Path(best["workdir"])


def _classes_predicted(workdir: Path, results: dict | None) -> int | None:
    """How many distinct labels the best epoch predicted on dev (1: the head sat on one class, and the score
    is that class's, e.g. MRPC's F1 of 81 for 'equivalent' everywhere)."""
    if not results or not results.get("predictions"):
        return None
    path = workdir / next(iter(results["predictions"].values()))
    if not path.is_file():
        return None
    rows = path.read_text().splitlines()[1:]
    return len({r.split("\t")[1] for r in rows if r})


def finetune_run(study: Path, budget: dict, task: str, name: str, lr: float, seed: int, init: Path, model,
                 data_dir: str | None, records: Path | None = None) -> dict | None:
    """As pretrain_run. `model`: the ModelConfig of `init` (read once per study; run() reads the weights
    itself)."""
    b = budget
    same = {k: b[k] for k in ("epochs", "batch", "max_train", "max_eval", "n_ctx")} | {"init": shown(init)}
    same["sets"] = list(b.get("sets", ()))
    base = apply_overrides(FinetuneConfig(model=model), b.get("sets", ()))
    config = dataclasses.replace(
        base, task=task, epochs=b["epochs"], batch_size=b["batch"], seed=seed, max_train_examples=b["max_train"],
        max_eval_examples=b["max_eval"], n_ctx=b["n_ctx"],
        optim=dataclasses.replace(base.optim, name=name, lr=lr, **SPECS[name]["overrides"]))
    run = harness.Run(config, study / "runs" / name / run_name(lr, seed), str(init), data_dir)
    summarize = functools.partial(finetune_record, study=study, name=name, lr=lr, seed=seed, same=same)
    done = harness.make(run, harness.Records(study, records), summarize, same,
                        announce=f"== finetune {task} {name} lr={lr:.3g} seed={seed} -> {run.workdir}")
    return harness.record_of(done)


def finetune_record(run: harness.Run, outcome: Outcome, wall: float, *, study: Path, name: str, lr: float, seed: int,
                    same: dict) -> dict:
    config, workdir = run.config, run.workdir
    diverged = outcome.status == "diverged"
    results = outcome.results
    metric = results["main_metric"] if results else None
    history = results["history"] if results else []
    return {
        "study": "finetune", "optimizer": name, "lr": lr, "seed": seed, "workdir": str(workdir.relative_to(study)),
        "task": config.task, "metric": metric, "final_val_loss": None, "best_val_loss": None,  # one schema; see dev_*
        "dev_final": history[-1].get(metric) if history else None,
        "dev_best": results["metrics"][metric] if results else None,
        "dev_metrics": results["metrics"] if results else None,
        "dev_classes_predicted": _classes_predicted(workdir, results),
        "val_curve": [{"step": h["epoch"], "dev": h.get(metric), "train_loss": h["train_loss"]} for h in history],
        "eval_at": "x (schedule_free_eval_params)" if uses_eval_params(name) else "params",
        "schedule": f"{config.optim.schedule}, warmup {config.warmup_fraction:g} of the updates",
        "tokens_per_s": None, "train_seconds": results["train_seconds"] if results else None,
        "wall_seconds": round(wall, 2),
        "optimizer_state_bytes": optimizer_state_bytes(config.optim, _abstract_params(config.model)),
        "diverged": diverged, "error": f"DivergenceError: {outcome.message}" if diverged else None,
        "cpu_flags": " ".join(cpu_flags()), **same,
    }


# ---- command line -------------------------------------------------------------------------------------

def missing_data(args) -> str | None:
    """What is wrong with the data flags of this study, or None."""
    if args.study in ("pretrain", "bench"):
        try:
            open_source(args.corpus)  # parses the spec and checks the files exist; reads nothing
        except (OSError, ValueError) as e:
            return f"--corpus: {e}"
        return None
    if not Path(args.init).exists():
        return f"--init {args.init}: no such directory (pre-train first, or pass a model folder)"
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        return f"--data-dir {args.data_dir}: no such directory"
    return None


def finetune_optimizers(args) -> list[str]:
    """--optimizers, or the best four of the pre-training study in --out plus gpt1_adam."""
    if args.optimizers is not None:
        return args.optimizers
    results = Path(args.out) / "pretrain" / "results.json"
    if not results.is_file():
        raise SystemExit(f"{results}: no pre-training study to take the best four optimizers from; pass --optimizers")
    ranked = [r["optimizer"] for r in json.loads(results.read_text())["summary"] if r["mean"] is not None]
    return ranked[:4] + ([REFERENCE] if REFERENCE not in ranked[:4] else [])


def parser() -> argparse.ArgumentParser:
    p = harness.parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("study", choices=["pretrain", "bench", "finetune"])
    p.add_argument("--out", required=True, help="study root; outputs go to <out>/<study>/")
    p.add_argument("--quick", action="store_true", help="minutes: tiny model, a short pre-training / a small GLUE subset")
    p.add_argument("--optimizers", type=harness.name_list("optimizer"), default=None,
                   help=f"comma-separated subset of {','.join(SPECS)} (finetune's default: the pre-training study's "
                   "best four plus gpt1_adam)")
    p.add_argument("--seeds", type=harness.seed_list, default=[0, 1, 2], help="first: the lr sweep; others: repeats at the best lr")
    # a whole number here, its floor (3; --quick's 2) after the parse, where --quick is known: a floor here said
    # ">= 1", then ">= 3" for 1
    p.add_argument("--lr-points", type=int, default=3, help="initial lrs per optimizer (the 1-3-10 log ladder; "
                   "at least 3, --quick: 2)")
    p.add_argument("--lr-scale", type=number_at_least(0.0, above=True), default=1.0, help="multiplies every centre lr")
    p.add_argument("--max-extensions", type=at_least(0), default=None,
                   help="lrs added per optimizer to bracket its best (default: 4 for pretrain, 2 for finetune)")
    p.add_argument("--steps", type=at_least(1), default=None, help="pre-training steps (overrides the budget)")
    p.add_argument("--tokenizer", default=None, help="pretrain: a tokenizer .json (default: the recipe's, from "
                   "experiments/paper/release, or one trained on --corpus)")
    p.add_argument("--records", default=None, help="also keep each run's record here (commit it: a study "
                   "spanning sessions resumes from it)")
    p.add_argument("--results", default=None, help="also write the results (json, md, plots) to "
                   "<results>/pretrain/ or <results>/finetune/<task>/, e.g. experiments/optimizers/results")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config field of every run, repeatable (pretrain and bench: PretrainConfig, e.g. "
                        "model.n_layers=2; finetune: FinetuneConfig); the bench's 117M column stays GPT-1's shape. "
                        "What the study sets per run or per optimizer (lr, seed, steps, SPECS) is refused")
    p.add_argument("--tables", action="store_true", help="only write the results (json, md, plots) again from "
                   "the finished runs (their run dirs under --out and --records): trains and benches nothing")
    p.add_argument("--cache-dir", default=None, help="token cache (default: the machine's)")
    p.add_argument("--compile-cache", default=None, help="JAX persistent compilation cache root (default: gpt1_jax/compile_cache.py's, per CPU; "
                   "'none' disables): the init and eval programs are the same for every lr, and a resumed study "
                   "recompiles nothing")
    p.add_argument("--corpus", default="default", help="pretrain: a gpt1-jax text source (file, folder, glob or "
                   "tfds:NAME; default: the demo corpus embedded in Python)")
    p.add_argument("--init", default=None, help="finetune: a model folder, run workdir or pre-training study dir "
                   "(its best run); default: experiments/paper/release (--quick: <out>/pretrain)")
    p.add_argument("--data-dir", default=None, help="finetune: GLUE's official TSV distribution "
                   "(<dir>/<Task>/{train,dev}.tsv; default: tensorflow-datasets downloads GLUE)")
    p.add_argument("--tasks", type=harness.name_list("task"), default=None,
                   help="finetune: GLUE tasks (default sst2,mrpc)")
    return p


def optimizers_problem(names: list[str]) -> str | None:
    """Why the study cannot compare `names`, or None. A name gpt1-jax trains with (gpt1_jax.optim.OPTIMIZERS: sgd)
    but that has no SPECS entry is no typo: it lacks the centre lrs and hyper-parameters the study chose for each
    of its optimizers (a default centre would start plain SGD's bracket far from its optimum), and is said so."""
    if unknown := [n for n in names if n not in OPTIMIZERS]:
        return f"unknown optimizer(s) {', '.join(unknown)}; the study's: {', '.join(SPECS)}"
    if unlisted := [n for n in names if n not in SPECS]:
        return (f"{', '.join(unlisted)} {'is' if len(unlisted) == 1 else 'are'} not in the study's specs "
                f"({', '.join(SPECS)}): each has its centre lrs and own hyper-parameters in "
                "experiments/optimizers/run_study.py SPECS; add an entry there to study another")
    return None


def parse_args(argv) -> tuple[argparse.Namespace, list[str]]:
    """The checked flags, with the defaults that depend on the study filled in, and the optimizers to compare."""
    p = parser()
    args = p.parse_args(argv)
    if args.lr_points < (low := 2 if args.quick else 3):
        why = "--quick's floor, for tests" if args.quick else "a log grid of at least 3 values; --quick allows 2"
        p.error(f"argument --lr-points: must be >= {low} ({why}), got {args.lr_points}")
    if args.max_extensions is None:
        args.max_extensions = 2 if args.study == "finetune" else 4
    if args.study == "finetune" and args.init is None:
        args.init = str(Path(args.out) / "pretrain") if args.quick else str(RELEASE)
    missing = None if args.tables else missing_data(args)  # --tables reads no data: the tables only name it
    if missing:  # one line, before any compilation; not a usage error, so no usage text
        p.exit(2, f"{p.prog}: error: {missing}\n")
    try:
        # `--tasks sst3` left an empty <out>/finetune/sst3 behind: checked with the flags
        args.tasks = harness.task_names(args.tasks) if args.tasks is not None else None
    except ConfigError as e:
        p.exit(2, f"{p.prog}: error: --tasks: {e}\n")
    names = finetune_optimizers(args) if args.study == "finetune" else args.optimizers or list(SPECS)
    if problem := optimizers_problem(names):
        p.exit(2, f"{p.prog}: error: {problem}\n")
    if problem := sets_problem(args.study, args.set):
        p.exit(2, f"{p.prog}: error: --set: {problem}\n")
    args.corpus_shown, args.init_shown = shown(args.corpus), shown(args.init) if args.init else None
    return args, names


# What the study sets in each run itself: a --set of one would be replaced without a word.
_OWNED = {
    "pretrain": {"optim.name": "the optimizer", "optim.lr": "the lr sweep", "seed": "--seeds", "data.seed": "--seeds",
                 "steps": "the budget (--steps)", "optim.total_steps": "the budget (--steps)",
                 "optim.warmup_steps": "the budget's warmup share", "data.source": "--corpus",
                 "data.tokenizer": "--tokenizer", "data.cache_dir": "--cache-dir",
                 **{k: "the budget" for k in ("eval_every", "eval_batches", "checkpoint_every", "log_every",
                                                   "keep_checkpoints", "keep_steps", "stats_every")}},
    "finetune": {"task": "--tasks", "optim.name": "the optimizer", "optim.lr": "the lr sweep", "seed": "--seeds",
                 **{k: "the budget" for k in ("epochs", "batch_size", "max_train_examples", "max_eval_examples",
                                              "n_ctx")}},
}


def sets_problem(study: str, sets: list[str]) -> str | None:
    """Why the --set list cannot apply to every run of `study` (a key the study sets itself, per run or per optimizer
    in SPECS; a field or value the config does not have), or None."""
    if not sets:
        return None
    kind = "finetune" if study == "finetune" else "pretrain"
    per_optimizer = {f"optim.{k}": "SPECS, per optimizer" for spec in SPECS.values() for k in spec["overrides"]}
    try:
        harness.check_sets(sets, {**_OWNED[kind], **per_optimizer})
        apply_overrides(FinetuneConfig() if kind == "finetune" else PretrainConfig(), sets)
    except ConfigError as e:
        return str(e)
    return None


def _budget_name(args) -> str:
    return "quick" if args.quick else "full"


def study_tables(args) -> list[tuple[Path, str, str]]:
    """(study dir, kind, title) of each table the invocation writes: the pre-training study's (bench adds its
    cost columns), or one per fine-tuning task, in <out>/finetune/<task>."""
    if args.study != "finetune":
        return [(Path(args.out) / "pretrain", "pretrain", "Optimizer study: pre-training")]
    tasks = args.tasks or FINETUNE[_budget_name(args)]["tasks"]
    return [(Path(args.out) / "finetune" / t, "finetune", f"Optimizer study: fine-tuning {t}") for t in tasks]


def kept_records(args, study: Path) -> Path | None:
    """The study's folder under --records, which mirrors --out."""
    return Path(args.records).absolute() / study.relative_to(Path(args.out)) if args.records else None


def table_scope(names: list[str], seeds: list[int], finished: list[dict]) -> tuple[list[dict], list[str], list[int]]:
    """(the finished runs of optimizers other than `names`, the optimizers and the seeds the tables show): a study
    run again for a subset (--optimizers adamw, --seeds 0) keeps the rest of its finished runs in its tables,
    instead of rewriting them (and their committed copy) with the subset alone."""
    others = [r for r in finished if r["optimizer"] not in names]
    shown = names + [n for n in SPECS if n not in names and any(r["optimizer"] == n for r in others)]
    return others, shown, seeds + sorted({r["seed"] for r in finished} - set(seeds))


def run_sweep(args, table: tuple[Path, str, str], names: list[str], seeds: list[int], run_one) -> tuple[list[dict], bool]:
    """One study's loop (`study_loop`) from each optimizer's centre lr, its tables rewritten after every new run."""
    study, kind, title = table
    grids = {n: lr_grid(SPECS[n][f"{kind}_lr"] * args.lr_scale, args.lr_points) for n in names}
    finished = harness.Records(study, kept_records(args, study)).finished("runs")
    others, shown, shown_seeds = table_scope(names, seeds, finished)
    return study_loop(study, names, seeds, grids, run_one, args.max_extensions,
                      lambda runs, plots: write_outputs(study, kind, others + runs, shown, shown_seeds, args, title, plots),
                      finished)


def rewrite_tables(args, names: list[str], seeds: list[int]) -> None:
    """Each study's results from its finished runs alone (a fresh clone has them all under --records)."""
    for study, kind, title in study_tables(args):
        finished = harness.Records(study, kept_records(args, study)).finished("runs")
        others, shown, shown_seeds = table_scope(names, seeds, finished)
        runs = [r for r in finished if r["optimizer"] in names] + others
        if runs:
            study.mkdir(parents=True, exist_ok=True)
            write_outputs(study, kind, runs, shown, shown_seeds, args, title)


def pretrain_setup(args, study: Path) -> tuple[dict, str]:
    """The pre-training budget (--steps shortens it) and the one tokenizer every run and bench uses."""
    budget = dict(PRETRAIN[_budget_name(args)], source=args.corpus, sets=tuple(args.set))
    if args.steps:
        budget.update(steps=args.steps, eval_every=max(1, min(budget["eval_every"], args.steps // 2)))
    study.mkdir(parents=True, exist_ok=True)
    return budget, prepare_tokenizer(study, budget, args.tokenizer)


def measure_unigram(study: Path, budget: dict, tokenizer: str, cache_dir: str | None, records: Path | None) -> float:
    """The study's unigram loss (`gpt1_jax.data.pipeline.unigram_loss`: what a model that ignores its context
    reaches on the study's validation windows), measured once and kept beside the records like a bench."""
    if (known := load_unigram(study, records)) is not None:
        check_same_sets(known, budget, study / UNIGRAM)
        return known["unigram_loss"]
    config = pretrain_config(budget, REFERENCE, SPECS[REFERENCE]["pretrain_lr"], 0, tokenizer, cache_dir)
    result = {"unigram_loss": unigram_loss(build_pipeline(config.data, study)), "sets": list(budget.get("sets", ()))}
    keep_json(result, study, records, UNIGRAM)
    return result["unigram_loss"]


def pretrain_study(args, names: list[str], seeds: list[int]) -> tuple[list[dict], bool]:
    table = study_tables(args)[0]
    study, kept = table[0], kept_records(args, table[0])
    budget, tokenizer = pretrain_setup(args, study)
    measure_unigram(study, budget, tokenizer, args.cache_dir, kept)
    return run_sweep(args, table, names, seeds,
                     lambda st, n, lr, s: pretrain_run(st, budget, n, lr, s, tokenizer, args.cache_dir, kept))


def bench_study(args, names: list[str], seeds: list[int]) -> None:
    """Each optimizer's bench step, then the pre-training results again with their cost columns; their rows:
    every optimizer that has runs, benched now or not."""
    study, _, _ = study_tables(args)[0]
    budget, tokenizer = pretrain_setup(args, study)
    vocab = GPT1Tokenizer.from_path(tokenizer).vocab_size
    for n in names:
        bench_optimizer(study, budget, n, vocab, kept_records(args, study))
    rewrite_tables(args, list(SPECS), seeds)


def finetune_study(args, names: list[str], seeds: list[int]) -> tuple[list[dict], bool]:
    """One study per task, in turn; a run stopped at a checkpoint stops them all."""
    budget = dict(FINETUNE[_budget_name(args)], sets=tuple(args.set))
    init = best_pretrain_workdir(Path(args.init))
    model = load_pretrained(init)[0]  # the architecture, for the state bytes

    def task_study(table):
        study, kept = table[0], kept_records(args, table[0])
        return run_sweep(args, table, names, seeds, lambda st, n, lr, s: finetune_run(
            st, budget, study.name, n, lr, s, init, model, args.data_dir, kept))  # study.name: the task

    runs = []
    for table in study_tables(args):
        task_runs, complete = task_study(table)
        runs += task_runs
        if not complete:
            return runs, False
    return runs, True


def main(argv=None) -> int:
    args, names = parse_args(argv)
    with harness.one_sweep(Path(args.out), PROG, init=args.init, under=args.study):
        return execute(args, names)


def execute(args: argparse.Namespace, names: list[str]) -> int:
    """The study `args` ask for (or its tables alone) -> exit status."""
    seeds = args.seeds
    if args.tables:
        rewrite_tables(args, names, seeds)
        return 0
    if args.compile_cache != "none":
        compile_cache.enable(args.compile_cache)
    if args.study == "bench":
        bench_study(args, names, seeds)
        return 0
    t0 = time.perf_counter()
    runs, complete = (pretrain_study if args.study == "pretrain" else finetune_study)(args, names, seeds)
    if not complete:  # a run was stopped (SIGTERM) at a checkpoint
        print(f"{PROG}: interrupted; the same command resumes", file=sys.stderr)
        return 130
    print(f"{args.study} study: {len(runs)} runs in {time.perf_counter() - t0:.0f} s -> {Path(args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    harness.leave(harness.main(main, PROG, trains=True))
