"""Optimizer comparison (issue 14): the same model, initialisation, data order, tokenizer and token budget for
each optimizer; a learning-rate sweep per optimizer, extended until its best rate is bracketed; three seeds at
each one's best rate; cost columns; then fine-tuning of the released model with the best four.

    # pre-training: the paper-at-laptop-scale recipe (experiments/paper/pretrain.yaml) at 800 of its 2,400
    # updates (3.28M tokens), on the corpus it was trained on; --quick: `tiny`, minutes
    python experiments/optimizers/run_study.py pretrain --out runs/opt-study --corpus CORPUS [--quick]
    # the cost columns: each optimizer's step at the study's shape and at the 117M `gpt1` shape (quiet machine)
    python experiments/optimizers/run_study.py bench --out runs/opt-study
    # fine-tuning the released laptop-scale model (experiments/paper/release) on SST-2 and MRPC with the best
    # four optimizers of the pre-training study plus gpt1_adam
    python experiments/optimizers/run_study.py finetune --out runs/opt-study --data-dir GLUE_DIR

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

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gpt1_jax.flops import cpu_flags

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
REFERENCE = "gpt1_adam"  # state memory is reported relative to this one; always in the fine-tuning study

# Budgets. Full pre-training: the recipe's model, tokenizer, batch (16 x 256) and schedule shape (warmup, then
# cosine to 0) at 800 of its 2,400 updates = 3.28M tokens, above both of the floors (2.5M tokens; 25%
# of the recipe's 9.8M). The warmup is 300 updates, not the recipe's 1/6 share: ramped over 1/6 of 800 (133
# updates) Adam reaches 1e-3 fast enough to sit on the unigram plateau (docs/gpt1.md) and the study would
# rank plateau escapes; a 300-update ramp to 1e-3 is measured to escape it. ~21 min per run on
# 2 cores at the recipe's ~2,400 tokens/s.
PRETRAIN = {
    "full": dict(config=str(RECIPE), steps=800, warmup_share=300 / 800, eval_every=100, eval_batches=0,
                 overrides=()),
    "quick": dict(config="tiny", steps=24, eval_every=8, eval_batches=4, bench_steps=1, bench_warmup=0,
                  bench_shapes={"gpt1_117M": ("gpt1", 1, 64)},
                  overrides=("data.global_batch_size=8", "data.seq_len=64")),
}
# Fine-tuning: the paper's recipe (batch 32, 3 epochs, linear decay after 0.2% warmup, lambda 0.5) on 1,000
# training examples per task (a fixed subset per seed) and the whole dev set.
FINETUNE = {
    "full": dict(tasks=("sst2", "mrpc"), epochs=3, batch=32, max_train=1000, max_eval=0, n_ctx=128),
    "quick": dict(tasks=("sst2",), epochs=1, batch=16, max_train=64, max_eval=64, n_ctx=64),
}
# The 117M shape of the bench columns: GPT-1's model at batch 2 x 512 (a CPU-sized batch of its context).
BENCH_SHAPES = {"study": None, "gpt1_117M": ("gpt1", 2, 512)}  # --quick: 117M at 1 x 64 (a test's minute)


# ---- the grid ----------------------------------------------------------------------------------------

def _ladder(j: int) -> float:
    """The 1-3-10 log ladder: j=0 -> 1, 1 -> 3, 2 -> 10, -1 -> 0.3, ..."""
    return float(f"{10.0 ** (j // 2) * (3 if j % 2 else 1):.3g}")


def lr_grid(centre: float, points: int = 3) -> list[float]:
    """`points` lrs of the 1-3-10 ladder (a log grid, ~half a decade apart) centred on the rung nearest
    `centre`: 3e-3 -> [1e-3, 3e-3, 1e-2]."""
    j0 = min(range(-40, 40), key=lambda j: abs(math.log(_ladder(j) / centre)))
    lo = j0 - (points - 1) // 2
    return [_ladder(j) for j in range(lo, lo + points)]


def next_rung(lr: float, up: bool) -> float:
    j = min(range(-40, 40), key=lambda j: abs(math.log(_ladder(j) / lr)))
    return _ladder(j + 1 if up else j - 1)


def run_name(lr: float, seed: int) -> str:
    return f"lr{lr:.3g}_s{seed}"


# ---- records ------------------------------------------------------------------------------------------

def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _median(xs):
    xs = [x for x in xs if _finite(x)]
    return statistics.median(xs) if xs else None


def step_times(records: list[dict], tokens_per_step: int) -> dict[int, float]:
    """step -> seconds of that training step, from the logged tokens/s (pretrain.py restarts the clock after
    evaluating, so evaluation is not in it). Step 1 (compilation) and any step slower than 5x the median
    (the process paused, or the machine briefly shared) count as the median: the study compares the
    optimizers' training cost, not the machine's interruptions."""
    out = {r["step"]: tokens_per_step / r["tokens_per_s"] for r in records if _finite(r.get("tokens_per_s"))}
    if len(out) > 1:
        median = statistics.median(v for k, v in out.items() if k != 1)
        out = {k: median if k == 1 or v > 5 * median else v for k, v in out.items()}
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


# ---- finished runs on disk -------------------------------------------------------------------------------

def _kept(workdir: Path, records: Path, study: Path) -> Path:
    return records / f"{workdir.relative_to(study)}.json"  # not with_suffix: "lr0.001_s0" has a dot


def _load_record(workdir: Path, records: Path | None, study: Path, budget: dict) -> dict | None:
    """A finished run's record: its run dir's record.json, or the kept copy under `records` (put back). A
    record made under another budget (`budget`: the record fields that must match) stops the study with one
    line: its score is not comparable with this study's."""
    done = workdir / "record.json"
    if not done.is_file() and records is not None:
        kept = _kept(workdir, records, study)
        if kept.is_file():
            done.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(kept, done)
    if not done.is_file():
        return None
    rec = json.loads(done.read_text())
    other = {k: rec.get(k) for k, v in budget.items() if rec.get(k) != v}
    if other:
        raise SystemExit(f"{workdir}: finished under another budget ({', '.join(f'{k}={v}' for k, v in other.items())}; "
                         f"this study: {', '.join(f'{k}={budget[k]}' for k in other)}); give it its own --out and --records")
    return rec


def finished_runs(study: Path, records: Path | None) -> list[dict]:
    """Every finished run of `study`: its run dirs' records and the kept ones (all a fresh clone has)."""
    kept = sorted((records / "runs").glob("*/*.json")) if records is not None else []
    found = {(r["optimizer"], r["lr"], r["seed"]): r for r in
             (json.loads(p.read_text()) for p in kept + sorted(study.glob("runs/*/*/record.json")))}
    return list(found.values())


def _save_record(rec: dict, workdir: Path, records: Path | None, study: Path) -> None:
    """Whole files or none: a half-written record would stop the resumed study on a JSON error."""
    from gpt1_jax.data.tokens import atomic_write_text

    atomic_write_text(workdir / "record.json", json.dumps(rec, indent=2) + "\n")
    if records is not None:  # the kept copy names no machine path: the run dir is relative to the study
        kept = _kept(workdir, records, study)
        kept.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(kept, json.dumps(dict(rec, workdir=str(workdir.relative_to(study))), indent=2) + "\n")


# ---- pre-training -------------------------------------------------------------------------------------

def pretrain_config(budget: dict, name: str, lr: float, seed: int, tokenizer: str, cache_dir: str | None):
    """The budget's base config (the recipe, or a preset) cut to `budget["steps"]` updates with the same
    schedule shape; the warmup is `warmup_share` of the run (default: the base config's share)."""
    from gpt1_jax.config import PretrainConfig, apply_overrides, resolve

    b = budget
    base = resolve(PretrainConfig, b["config"], overrides=b["overrides"])
    warmup = max(1, round(b["steps"] * b.get("warmup_share", base.optim.warmup_steps / base.steps)))
    sets = [
        f"data.source={b['source']}", f"data.tokenizer={tokenizer}", f"steps={b['steps']}", f"seed={seed}",
        f"data.seed={seed}", f"eval_every={b['eval_every']}", f"eval_batches={b['eval_batches']}",
        f"checkpoint_every={b['eval_every']}", "log_every=1", "keep_checkpoints=1", "keep_steps=[]",
        f"optim.name={name}", f"optim.lr={lr}", f"optim.warmup_steps={warmup}", f"optim.total_steps={b['steps']}",
    ]
    if cache_dir:
        sets.append(f"data.cache_dir={cache_dir}")
    sets += [f"optim.{k}={v}" for k, v in SPECS[name]["overrides"].items()]
    return apply_overrides(base, sets)


def prepare_tokenizer(study: Path, budget: dict, tokenizer: str | None) -> str:
    """One tokenizer for every run (the token cache, keyed by it, is then shared): `tokenizer` if given; for the
    full budget the recipe's own, from the release; otherwise a BPE trained once on the corpus."""
    from gpt1_jax.config import PretrainConfig, resolve
    from gpt1_jax.data.sources import open_source
    from gpt1_jax.data.tokens import tokenizer_for

    if tokenizer:
        return str(Path(tokenizer).absolute()) if Path(tokenizer).exists() else tokenizer
    if budget["config"] == str(RECIPE) and (RELEASE / "tokenizer.json").is_file():
        return str(RELEASE / "tokenizer.json")
    vocab = resolve(PretrainConfig, budget["config"], overrides=budget["overrides"]).data.vocab_size
    tokdir = study / "tokenizer"
    tokenizer_for(open_source(budget["source"]), tokdir, vocab_size=vocab, tokenizer="train")
    return str((tokdir / "tokenizer.json").absolute())


def pretrain_run(study: Path, budget: dict, name: str, lr: float, seed: int, tokenizer: str,
                 cache_dir: str | None, records: Path | None = None) -> dict:
    from gpt1_jax.config import PretrainConfig, load_yaml
    from gpt1_jax.errors import DivergenceError
    from gpt1_jax.metrics import read_metrics
    from gpt1_jax.optim import optimizer_state_bytes, uses_eval_params
    from gpt1_jax.pretrain import run

    workdir = study / "runs" / name / run_name(lr, seed)
    if (rec := _load_record(workdir, records, study, {"steps": budget["steps"]})) is not None:
        return rec
    config = pretrain_config(budget, name, lr, seed, tokenizer, cache_dir)
    print(f"== {name} lr={lr:.3g} seed={seed} -> {workdir}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        status, error = run(config, workdir), None
    except DivergenceError as e:  # a diverged run is recorded; the study goes on
        status, error = 1, f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t0
    if Path(tokenizer).is_file() and not (workdir / "tokenizer.json").exists():  # finetune --init reads it there
        shutil.copy(tokenizer, workdir / "tokenizer.json")
    metrics = read_metrics(workdir)
    last_step = max((r["step"] for r in metrics if "loss" in r), default=0)
    diverged = status != 0 or any(isinstance(r.get("loss"), str) for r in metrics)
    if not diverged and last_step < config.steps:
        raise KeyboardInterrupt(f"{workdir} stopped at step {last_step} of {config.steps} (interrupted)")
    val = [(r["step"], r["val_loss"]) for r in metrics if _finite(r.get("val_loss"))]
    tokens_per_step = config.data.global_batch_size * config.data.seq_len
    times = step_times(metrics, tokens_per_step)
    saved = workdir / "config.yaml"  # run() writes it with the tokenizer's real vocabulary size
    model = load_yaml(PretrainConfig, saved).model if saved.is_file() else config.model
    finals = [l for _, l in val]
    rec = {
        "study": "pretrain", "optimizer": name, "lr": lr, "seed": seed, "workdir": str(workdir),
        "steps": config.steps, "tokens": config.steps * tokens_per_step, "tokens_per_step": tokens_per_step,
        "schedule": f"{config.optim.schedule}, warmup {config.optim.warmup_steps} of {config.optim.total_steps}",
        "vocab_size": model.vocab_size,
        "final_val_loss": finals[-1] if finals and not diverged and val[-1][0] == config.steps else None,
        "best_val_loss": min(finals) if finals and not diverged else None,
        "val_curve": curve_with_time(val, times),
        "eval_at": "x (schedule_free_eval_params)" if uses_eval_params(name) else "params",
        "tokens_per_s": _median(r.get("tokens_per_s") for r in metrics if r.get("step", 0) > 1),
        "train_seconds": round(sum(times.values()), 2), "wall_seconds": round(wall, 2),
        "optimizer_state_bytes": optimizer_state_bytes(config.optim, _abstract_params(model)),
        "diverged": diverged, "error": error,
        "cpu_flags": " ".join(cpu_flags()),  # a study spanning sessions may span CPU kinds: its seconds differ
    }
    _prune_checkpoints(workdir)
    _save_record(rec, workdir, records, study)
    return rec


def _abstract_params(model):
    import functools

    import flax.linen as nn
    import jax

    from gpt1_jax.model import init_params

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
    from gpt1_jax import bench
    from gpt1_jax.config import PretrainConfig, apply_overrides, preset

    out = study / "bench" / f"{name}.json"
    if (done := load_bench(study, records).get(name)) is not None:
        return done
    result = {}
    shapes = dict(BENCH_SHAPES, **budget.get("bench_shapes", {}))
    for shape, spec in shapes.items():
        if spec is None:  # the study's own config, its vocabulary as the tokenizer makes it
            config = apply_overrides(pretrain_config(budget, name, SPECS[name]["pretrain_lr"], 0, "train", None),
                                     [f"model.vocab_size={tokenizer_vocab}"])
        else:
            preset_name, batch, seq = spec
            config = apply_overrides(preset(PretrainConfig, preset_name), [
                f"data.global_batch_size={batch}", f"data.seq_len={seq}", f"optim.name={name}",
                *(f"optim.{k}={v}" for k, v in SPECS[name]["overrides"].items())])
        print(f"== bench {name} at {shape}", file=sys.stderr, flush=True)
        r = bench.run(config, steps=budget.get("bench_steps", 5), warmup=budget.get("bench_warmup", 2))
        B, T = config.data.global_batch_size, config.data.seq_len
        result[shape] = {"batch": B, "seq": T, "step_s": r["step_s_median"], "tokens_per_s": r["tokens_per_s"],
                         "mfu": r["mfu"], "compile_s": r.get("compile_s")}
    result["cpu_flags"] = r["cpu_flags"]
    for path in [out] + ([records / "bench" / out.name] if records is not None else []):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def load_bench(study: Path, records: Path | None) -> dict[str, dict]:
    """Optimizer -> its bench result: <study>/bench/, or the copies kept under `records` (a fresh clone)."""
    found = {}
    for folder in ([records / "bench"] if records is not None else []) + [study / "bench"]:
        found.update({p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))})
    return found


# ---- fine-tuning --------------------------------------------------------------------------------------

def best_pretrain_workdir(init: Path) -> Path:
    """A pre-training study dir -> the workdir of its lowest final validation loss; any other dir (a release
    folder, a run workdir) is taken as is."""
    results = init / "results.json"
    if not results.is_file():
        return init
    runs = [r for r in json.loads(results.read_text())["runs"] if _finite(r.get("final_val_loss"))]
    if not runs:
        raise SystemExit(f"{results}: no finished pre-training run to start from")
    best = min(runs, key=lambda r: r["final_val_loss"])
    return init / best["workdir"] if not Path(best["workdir"]).is_absolute() else Path(best["workdir"])


def finetune_run(study: Path, budget: dict, task: str, name: str, lr: float, seed: int, init: Path, model,
                 data_dir: str | None, records: Path | None = None) -> dict:
    """`model`: the ModelConfig of `init` (read once per study; run() reads the weights itself)."""
    from gpt1_jax.config import FinetuneConfig, apply_overrides
    from gpt1_jax.errors import DivergenceError
    from gpt1_jax.finetune import run
    from gpt1_jax.optim import optimizer_state_bytes, uses_eval_params

    workdir = study / "runs" / name / run_name(lr, seed)
    b = budget
    same = {k: b[k] for k in ("epochs", "batch", "max_train", "max_eval", "n_ctx")} | {"init": shown(init)}
    if (rec := _load_record(workdir, records, study, same)) is not None:
        return rec
    sets = [f"task={task}", f"epochs={b['epochs']}", f"batch_size={b['batch']}", f"seed={seed}",
            f"max_train_examples={b['max_train']}", f"max_eval_examples={b['max_eval']}", f"n_ctx={b['n_ctx']}",
            f"optim.name={name}", f"optim.lr={lr}"]
    sets += [f"optim.{k}={v}" for k, v in SPECS[name]["overrides"].items()]
    config = apply_overrides(FinetuneConfig(model=model), sets)
    print(f"== finetune {task} {name} lr={lr:.3g} seed={seed} -> {workdir}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    error, results = None, None
    try:
        results = run(config, workdir, init=str(init), data_dir=data_dir, progress=True)
    except DivergenceError as e:
        error = f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t0
    diverged = results is None
    metric = results["main_metric"] if results else None
    history = results["history"] if results else []
    rec = {
        "study": "finetune", "optimizer": name, "lr": lr, "seed": seed, "workdir": str(workdir), "task": task,
        "metric": metric, "final_val_loss": None, "best_val_loss": None,  # one schema; see dev_*
        "dev_final": history[-1].get(metric) if history else None,
        "dev_best": results["metrics"][metric] if results else None,
        "val_curve": [{"step": h["epoch"], "dev": h.get(metric), "train_loss": h["train_loss"]} for h in history],
        "eval_at": "x (schedule_free_eval_params)" if uses_eval_params(name) else "params",
        "schedule": f"{config.optim.schedule}, warmup {config.warmup_fraction:g} of the updates",
        "tokens_per_s": None, "train_seconds": results["train_seconds"] if results else None,
        "wall_seconds": round(wall, 2),
        "optimizer_state_bytes": optimizer_state_bytes(config.optim, _abstract_params(model)),
        "diverged": diverged, "error": error, **same,
    }
    _save_record(rec, workdir, records, study)
    return rec


# ---- the study loop -----------------------------------------------------------------------------------

def score(rec: dict) -> float | None:
    """Lower is better: final val loss (pre-training), minus the best dev metric (fine-tuning)."""
    if rec["diverged"]:
        return None
    if rec["study"] == "pretrain":
        return rec["final_val_loss"]
    return -rec["dev_best"] if _finite(rec.get("dev_best")) else None


def best_lr(runs: list[dict], name: str, seed: int) -> float | None:
    cands = [r for r in runs if r["optimizer"] == name and r["seed"] == seed and score(r) is not None]
    return min(cands, key=score)["lr"] if cands else None


def bracket_gap(runs: list[dict], name: str, seed: int) -> float | None:
    """The next lr to try so that the best one has a worse neighbour on both sides (a diverged run counts as
    worse); None when it is bracketed already. Every lr diverged: go one rung below the lowest."""
    tried = sorted({r["lr"] for r in runs if r["optimizer"] == name and r["seed"] == seed})
    if not tried:
        return None
    best = best_lr(runs, name, seed)
    if best is None:
        return next_rung(tried[0], up=False)
    if best == tried[0]:
        return next_rung(best, up=False)
    if best == tried[-1]:
        return next_rung(best, up=True)
    return None


def study_loop(study: Path, names: list[str], seeds: list[int], grids: dict[str, list[float]], run_one,
               max_extensions: int, write) -> list[dict]:
    """Breadth-first, so that a study cut short still has a row per optimizer: every optimizer at its centre
    lr, the rest of its grid, rounds of one more lr for each optimizer whose best is not yet bracketed (at
    most `max_extensions` each), then the other seeds at each best lr."""
    study.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []

    def do(name, lr, seed):
        rec = run_one(study, name, lr, seed)
        runs[:] = [r for r in runs if (r["optimizer"], r["lr"], r["seed"]) != (name, lr, seed)] + [rec]
        write(runs)

    for n in names:
        do(n, grids[n][len(grids[n]) // 2], seeds[0])
    for n in names:
        for lr in grids[n]:
            do(n, lr, seeds[0])
    for _ in range(max_extensions):
        gaps = {n: lr for n in names if (lr := bracket_gap(runs, n, seeds[0])) is not None}
        if not gaps:
            break
        for n, lr in gaps.items():
            do(n, lr, seeds[0])
    for n in names:
        b = best_lr(runs, n, seeds[0])
        if b is not None:
            for s in seeds[1:]:
                do(n, b, s)
    write(runs)
    return runs


# ---- outputs ------------------------------------------------------------------------------------------

def summarize(runs: list[dict], names: list[str], seeds: list[int], bench: dict[str, dict] | None = None) -> list[dict]:
    """One row per optimizer, best first; `distinct_from_next`: its mean ± std interval and the next row's do not
    overlap (a difference larger than the seed noise)."""
    ref_bytes = next((r["optimizer_state_bytes"] for r in runs if r["optimizer"] == REFERENCE), None)
    sign = -1.0 if runs and runs[0]["study"] == "finetune" else 1.0  # rows ascend in `score`
    rows = []
    for n in names:
        mine = [r for r in runs if r["optimizer"] == n]
        if not mine:
            continue
        lr = best_lr(runs, n, seeds[0])
        at_best = [r for r in mine if r["lr"] == lr and score(r) is not None]
        vals = [sign * score(r) for r in at_best]
        state = mine[0]["optimizer_state_bytes"]
        rows.append({
            "optimizer": n, "best_lr": lr, "n_seeds": len(vals), "values": vals,
            "mean": statistics.fmean(vals) if vals else None,
            "std": statistics.stdev(vals) if len(vals) > 1 else (0.0 if vals else None),
            "bracketed": lr is not None and bracket_gap(runs, n, seeds[0]) is None,
            "schedule": mine[0].get("schedule"),
            "wall_seconds": statistics.fmean(r["wall_seconds"] for r in at_best) if at_best else None,
            **_training_time(at_best, (bench or {}).get(n)),
            "state_bytes": state, "state_vs_ref": state / ref_bytes if ref_bytes else None,
            "bench": (bench or {}).get(n),
            "lrs": sorted({r["lr"] for r in mine if r["seed"] == seeds[0]}),
            "diverged_lrs": sorted({r["lr"] for r in mine if r["diverged"]}),
        })
    rows.sort(key=lambda r: math.inf if r["mean"] is None else sign * r["mean"])
    for a, b in zip(rows, rows[1:] + [None]):
        if b is None or a["mean"] is None or b["mean"] is None:
            a["distinct_from_next"] = False
        elif min(a["n_seeds"], b["n_seeds"]) < 2:
            a["distinct_from_next"] = None  # one seed has no spread: the noise is not known yet
        else:
            a["distinct_from_next"] = abs(a["mean"] - b["mean"]) > a["std"] + b["std"]
    return rows


def _training_time(at_best: list[dict], bench: dict | None) -> dict:
    """The row's training seconds and tokens/s. A study spanning sessions spans CPU kinds (one measured 1.8x
    another's tokens/s), so a run's own seconds compare only with runs on its CPU: where the optimizer has a
    bench column (all of them timed on one machine) the time is updates x its bench step time at the study's
    shape (`time_basis` "bench"), else the runs' own median (`time_basis` "measured")."""
    if not at_best:
        return {"train_seconds": None, "tokens_per_s": None, "time_basis": None}
    steps, per_step = at_best[0].get("steps"), at_best[0].get("tokens_per_step")
    bench_step = (bench or {}).get("study", {}).get("step_s")
    if _finite(bench_step) and steps and per_step:
        return {"train_seconds": steps * bench_step, "tokens_per_s": per_step / bench_step, "time_basis": "bench"}
    return {"train_seconds": _median(r["train_seconds"] for r in at_best),
            "tokens_per_s": _median(r["tokens_per_s"] for r in at_best), "time_basis": "measured"}


def cpu_kinds(records) -> list[str]:
    """The distinct CPU flag sets that `records` (runs or bench results) were measured on."""
    flags = [r.get("cpu_flags") for r in records]  # a run's record keeps a string, a bench result a list
    return sorted({(" ".join(f) if isinstance(f, list) else f) or "unknown" for f in flags})


def _fmt(x, spec=".4f"):
    return "-" if x is None else format(x, spec)


def results_md(kind: str, rows: list[dict], runs: list[dict], args, title: str) -> str:
    metric = "validation loss (nats/token)" if kind == "pretrain" else f"dev {next((r['metric'] for r in runs if r.get('metric')), 'metric')}"
    lines = [f"# {title}{' (quick)' if args.quick else ''}", ""]
    if kind == "pretrain":
        r0 = runs[0]
        lines.append(f"Same model, init, data order, tokenizer and budget per run: {r0['tokens']:,} tokens = {r0['steps']} "
                     f"updates of {r0['tokens_per_step']:,} tokens of `{args.corpus_shown}`. Best lr = lowest final "
                     "validation loss (the whole validation split) at the first seed, bracketed: the sweep grows "
                     "until the best lr has a worse (or diverged) neighbour on both sides. Mean ± std over seeds "
                     "at that lr.")
    else:
        lines.append(f"Fine-tuning `{args.init_shown}`; best lr = highest best-epoch dev score at the first seed, "
                     "from a 3-point grid around each optimizer's centre; mean ± std over seeds at that lr.")
    total = sum(r["wall_seconds"] for r in runs if _finite(r.get("wall_seconds")))
    kinds = len(cpu_kinds(runs))
    lines += ["", f"Compute: {len(runs)} runs, {total / 3600:.1f} h of wall-clock in all"
              + (f", on {kinds} CPU kinds (each run's flags in results.json)." if kinds > 1 else "."), ""]
    head = f"| optimizer | best lr | {metric}, mean ± std | seeds | > next? | bracketed | schedule |"
    sep = "|---|---|---|---|---|---|---|"
    if kind == "pretrain":
        head += " tokens/s | train s | ln V − loss per train min | state (MB) | vs Adam | step s (study) | step s (117M, 2x512) | lrs tried (✗ diverged) |"
        sep += "---|---|---|---|---|---|---|---|"
    else:
        head += " train s | state (MB) | vs Adam | lrs tried (✗ diverged) |"
        sep += "---|---|---|---|"
    lines += [head, sep]
    for i, r in enumerate(rows):
        tried = ", ".join(f"{lr:.3g}" + ("✗" if lr in r["diverged_lrs"] else "") for lr in r["lrs"])
        cells = [r["optimizer"], _fmt(r["best_lr"], ".3g"), f"{_fmt(r['mean'])} ± {_fmt(r['std'])}", str(r["n_seeds"]),
                 {True: "yes", None: "?"}.get(r["distinct_from_next"], "-" if i == len(rows) - 1 else "≈"), "yes" if r["bracketed"] else "**no**" if kind == "pretrain" else "no", r["schedule"] or "-"]
        if kind == "pretrain":
            vocab = next((x["vocab_size"] for x in runs if x["optimizer"] == r["optimizer"] and x.get("vocab_size")), None)
            gain = (math.log(vocab) - r["mean"]) / (r["train_seconds"] / 60) if vocab and r["mean"] and r["train_seconds"] else None
            bench = r["bench"] or {}
            cells += [_fmt(r["tokens_per_s"], ",.0f"), _fmt(r["train_seconds"], ".0f"), _fmt(gain, ".3f"),
                      f"{r['state_bytes'] / 2**20:.2f}", f"{_fmt(r['state_vs_ref'], '.2f')}×",
                      _fmt(bench.get("study", {}).get("step_s"), ".3f"), _fmt(bench.get("gpt1_117M", {}).get("step_s"), ".2f"),
                      tried]
        else:
            cells += [_fmt(r["train_seconds"], ".0f"), f"{r['state_bytes'] / 2**20:.2f}",
                      f"{_fmt(r['state_vs_ref'], '.2f')}×", tried]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Rows are best first. *> next?*: yes when this row's mean ± std interval does not overlap the next "
              "row's (the difference exceeds the seed noise); ≈ otherwise; ? while either has one seed. *bracketed*: the best lr has a worse or "
              "diverged neighbour on both sides. Optimizer state = bytes of `tx.init(params)` "
              "(`gpt1_jax.optim.optimizer_state_bytes`)."]
    if kind == "pretrain":
        basis = {r["time_basis"] for r in rows if r["time_basis"]}
        lines.append("Train s and tokens/s: " + (
            "updates × the optimizer's bench step time at the study's shape (step s (study)), so that runs made "
            "on different CPUs compare; each run's own seconds are in results.json. " if basis == {"bench"} else
            "the runs' summed step times (compilation and evaluation excluded), median over seeds. "
            if basis == {"measured"} else "updates × the bench step time where an optimizer has one, else its "
            "runs' own summed step times. ")
            + "ln V − loss per train min: nats/token gained over a uniform guess per minute of training. "
                     "Step s: `gpt1-jax bench --optim NAME` (forward + backward + update, median of 5) at the "
                     "study's shape and at GPT-1's 117M shape, batch 2 x 512; CPU flags in results.json.")
    if any(r["optimizer"].startswith("schedule_free") for r in runs):
        lines.append("schedule_free_adamw is evaluated at x (`gpt1_jax.optim.eval_params`) in every validation "
                     "and dev evaluation; it trains with warmup then a constant lr, the others warmup then "
                     + ("cosine." if kind == "pretrain" else "linear decay."))
    lines += ["", "## What the numbers say", "", *(f"- {c}" for c in findings(kind, rows, runs))]
    return "\n".join(lines) + "\n"


TARGET_LOSS = 5.0  # issue 14: the budget must let the best optimizer reach this validation loss (nats/token)


def findings(kind: str, rows: list[dict], runs: list[dict]) -> list[str]:
    """Statements the table supports, read off it: the order and which gaps exceed the seed noise, what is
    not yet bracketed or repeated, what diverged, and (pre-training) the budget rule and the cost extremes."""
    unit = "nats" if kind == "pretrain" else "points"
    done = [r for r in rows if r["mean"] is not None]
    if not done:
        return ["No finished run yet."]
    out = []
    cell = lambda r: f"{r['optimizer']} ({r['mean']:.3f} ± {r['std']:.3f}, {r['n_seeds']} seed{'s' * (r['n_seeds'] != 1)})"  # noqa: E731
    order = cell(done[0])
    for a, b in zip(done, done[1:]):
        order += {True: " > ", False: " ≈ ", None: " ? "}[a["distinct_from_next"]] + cell(b)
    out.append("Order, best first; `>` between rows whose difference exceeds the seed noise (mean ± std "
               "intervals apart), `≈` within it, `?` where a row has one seed (no noise estimate yet): "
               + order + ".")
    if len(done) > 1:
        gap = abs(done[0]["mean"] - done[1]["mean"])
        verdict = {True: "more than the seed noise", False: "within the seed noise",
                   None: "the seed noise is not measured yet"}[done[0]["distinct_from_next"]]
        out.append(f"{done[0]['optimizer']} leads {done[1]['optimizer']} by {gap:.3f} {unit}: {verdict}.")
    single = [r["optimizer"] for r in done if r["n_seeds"] < 2]
    if single:
        out.append(f"One seed so far (no noise estimate yet): {', '.join(single)}.")
    open_ = [r["optimizer"] for r in rows if not r["bracketed"]]
    if kind == "pretrain" and open_:
        out.append(f"Best lr not yet bracketed (its optimum may lie beyond the rates tried): {', '.join(open_)}.")
    div = [f"{r['optimizer']} at {', '.join(f'{lr:.3g}' for lr in r['diverged_lrs'])}" for r in rows if r["diverged_lrs"]]
    out.append(f"Diverged: {'; '.join(div)}." if div else "No run diverged.")
    if kind == "pretrain":
        best = done[0]
        met = best["mean"] <= TARGET_LOSS
        out.append(f"Budget rule: the best optimizer's final validation loss is {best['mean']:.3f} nats/token, "
                   f"{'within' if met else 'above'} the {TARGET_LOSS:g} the budget must allow.")
        benched = cpu_kinds(r["bench"] for r in rows if r["bench"])
        if len(benched) > 1:
            out.append(f"The bench columns were timed on {len(benched)} CPU kinds, so their step times (and the "
                       "training seconds made from them) do not compare; rerun `run_study.py bench` on one machine.")
        small = min(rows, key=lambda r: r["state_bytes"])
        if small["state_vs_ref"] is not None and small["optimizer"] != REFERENCE:
            out.append(f"Least optimizer state: {small['optimizer']}, {small['state_vs_ref']:.2f}× {REFERENCE}'s.")
    return out


def plot(study: Path, kind: str, runs: list[dict], rows: list[dict], seeds: list[int]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "val_loss" if kind == "pretrain" else "dev"
    ylabel = "validation loss (nats/token)" if kind == "pretrain" else f"dev {next((r['metric'] for r in runs if r.get('metric')), '')}"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    out = []
    xaxes = [("tokens", "tokens seen" if kind == "pretrain" else "epoch", "val_vs_tokens.png"),
             ("train_seconds", "training seconds (see results.md)", "val_vs_time.png")]
    for field, xlabel, fname in xaxes:
        fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
        for i, row in enumerate(rows):
            r = next((r for r in runs if r["optimizer"] == row["optimizer"] and r["lr"] == row["best_lr"]
                      and r["seed"] == seeds[0]), None)
            if r is None or not r["val_curve"]:
                continue
            if field == "tokens":
                scale = r.get("tokens_per_step", 1) if kind == "pretrain" else 1
                pts = [(p["step"] * scale, p.get(key)) for p in r["val_curve"]]
            elif kind == "finetune":  # one time per run: spread over the epochs
                n = len(r["val_curve"])
                pts = [((j + 1) / n * (r["train_seconds"] or 0), p.get(key)) for j, p in enumerate(r["val_curve"])]
            else:  # at the row's seconds per update: one machine's time for every optimizer (_training_time)
                per = (row["train_seconds"] or math.nan) / r["steps"]
                pts = [(p["step"] * per, p.get(key)) for p in r["val_curve"]]
            pts = [(x, y) for x, y in pts if _finite(x) and _finite(y)]
            if pts:
                ax.plot(*zip(*pts), "o-", ms=3, color=colors[i % len(colors)], label=f"{row['optimizer']} (lr {row['best_lr']:.3g})")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{kind}: best lr per optimizer, seed {seeds[0]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(study / fname)
        plt.close(fig)
        out.append(study / fname)
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    finite = [s for r in runs if (s := score(r)) is not None]
    top = (max(finite) if kind == "pretrain" else -min(finite)) if finite else 1.0
    for i, row in enumerate(rows):
        mine = sorted((r for r in runs if r["optimizer"] == row["optimizer"] and r["seed"] == seeds[0]), key=lambda r: r["lr"])
        ok = [(r["lr"], -score(r) if kind == "finetune" else score(r)) for r in mine if score(r) is not None]
        bad = [r["lr"] for r in mine if score(r) is None]
        c = colors[i % len(colors)]
        if ok:
            ax.plot(*zip(*ok), "o-", color=c, label=row["optimizer"])
        if bad:
            ax.plot(bad, [top] * len(bad), "x", color=c, ms=9, mew=2)
        if row["best_lr"] is not None and row["mean"] is not None:  # the bracketed optimum, with its seed spread
            ax.errorbar([row["best_lr"]], [row["mean"]], yerr=[row["std"]], fmt="*", ms=12, color=c, capsize=4)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(f"final {ylabel}" if kind == "pretrain" else f"best-epoch {ylabel}")
    ax.set_title(f"{kind}: lr sweep (seed {seeds[0]}; ★ best lr, mean ± std over seeds; x = diverged)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(study / "loss_vs_lr.png")
    plt.close(fig)
    out.append(study / "loss_vs_lr.png")
    return out


def write_outputs(study: Path, kind: str, runs: list[dict], names: list[str], seeds: list[int], args,
                  title: str) -> None:
    bench = load_bench(study, Path(args.records).absolute() / "pretrain" if args.records and kind == "pretrain" else None)
    rows = summarize(runs, names, seeds, bench)
    shown = [dict(r, workdir=str(Path(r["workdir"]).relative_to(study)) if Path(r["workdir"]).is_relative_to(study)
                  else r["workdir"]) for r in runs]
    (study / "results.json").write_text(json.dumps(
        {"study": kind, "quick": args.quick, "seeds": seeds, "cpu_flags": " ".join(cpu_flags()), "summary": rows, "runs": shown},
        indent=2) + "\n")
    (study / "results.md").write_text(results_md(kind, rows, runs, args, title))
    plot(study, kind, runs, rows, seeds)
    if args.results:  # the copy that is committed: the same files, nothing else
        dest = Path(args.results) / study.relative_to(Path(args.out))
        dest.mkdir(parents=True, exist_ok=True)
        for name in RESULT_FILES:
            shutil.copyfile(study / name, dest / name)


RESULT_FILES = ("results.json", "results.md", "val_vs_tokens.png", "val_vs_time.png", "loss_vs_lr.png")


# ---- command line -------------------------------------------------------------------------------------

def shown(path: str | Path) -> str:
    """A path as committed files print it: relative to the repository when inside it."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def missing_data(args) -> str | None:
    """What is wrong with the data flags of this study, or None."""
    if args.study in ("pretrain", "bench"):
        from gpt1_jax.data.sources import open_source

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
    if args.optimizers:
        return args.optimizers.split(",")
    results = Path(args.out) / "pretrain" / "results.json"
    if not results.is_file():
        raise SystemExit(f"{results}: no pre-training study to take the best four optimizers from; pass --optimizers")
    ranked = [r["optimizer"] for r in json.loads(results.read_text())["summary"] if r["mean"] is not None]
    return ranked[:4] + ([REFERENCE] if REFERENCE not in ranked[:4] else [])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", choices=["pretrain", "bench", "finetune"])
    p.add_argument("--out", required=True, help="study root; outputs go to <out>/<study>/")
    p.add_argument("--quick", action="store_true", help="minutes: tiny model, a short pre-training / a small GLUE subset")
    p.add_argument("--optimizers", default=None, help=f"comma-separated subset of {','.join(SPECS)} (finetune's "
                   "default: the pre-training study's best four plus gpt1_adam)")
    p.add_argument("--seeds", default="0,1,2", help="first: the lr sweep; others: repeats at the best lr")
    p.add_argument("--lr-points", type=int, default=3, help="initial lrs per optimizer (the 1-3-10 log ladder)")
    p.add_argument("--lr-scale", type=float, default=1.0, help="multiplies every centre lr")
    p.add_argument("--max-extensions", type=int, default=None,
                   help="lrs added per optimizer to bracket its best (default: 4 for pretrain, 0 for finetune)")
    p.add_argument("--steps", type=int, default=None, help="pre-training steps (overrides the budget)")
    p.add_argument("--tokenizer", default=None, help="pretrain: a tokenizer .json (default: the recipe's, from "
                   "experiments/paper/release, or one trained on --corpus)")
    p.add_argument("--records", default=None, help="also keep each run's record here (commit it: a study "
                   "spanning sessions resumes from it)")
    p.add_argument("--results", default=None, help="also write the results (json, md, plots) to "
                   "<results>/pretrain/ or <results>/finetune/<task>/, e.g. experiments/optimizers/results")
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
    p.add_argument("--tasks", default=None, help="finetune: GLUE tasks (default sst2,mrpc)")
    args = p.parse_args(argv)
    if args.lr_points < (2 if args.quick else 3):
        p.error("--lr-points must be >= 3 (a log grid of at least 3 values; --quick allows 2, for tests)")
    if args.study == "finetune" and args.init is None:
        args.init = str(Path(args.out) / "pretrain") if args.quick else str(RELEASE)
    missing = missing_data(args)
    if missing:  # one line, before any compilation; not a usage error, so no usage text
        p.exit(2, f"{p.prog}: error: {missing}\n")
    names = finetune_optimizers(args) if args.study == "finetune" else (
        args.optimizers.split(",") if args.optimizers else list(SPECS))
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        p.exit(2, f"{p.prog}: error: unknown optimizer(s) {', '.join(unknown)}; known: {', '.join(SPECS)}\n")
    seeds = [int(s) for s in args.seeds.split(",")]
    records = Path(args.records).absolute() if args.records else None
    args.corpus_shown, args.init_shown = shown(args.corpus), shown(args.init) if args.init else None

    if args.compile_cache != "none":
        from gpt1_jax import compile_cache

        compile_cache.enable(args.compile_cache)
    mode = "quick" if args.quick else "full"
    t0 = time.perf_counter()
    if args.study in ("pretrain", "bench"):
        budget = dict(PRETRAIN[mode], source=args.corpus)
        if args.steps:
            budget.update(steps=args.steps, eval_every=max(1, min(budget["eval_every"], args.steps // 2)))
        study = Path(args.out) / "pretrain"
        study.mkdir(parents=True, exist_ok=True)
        tokenizer = prepare_tokenizer(study, budget, args.tokenizer)
        if args.study == "bench":
            from gpt1_jax.tokenizer import GPT1Tokenizer

            vocab = GPT1Tokenizer.from_path(tokenizer).vocab_size
            for n in names:
                bench_optimizer(study, budget, n, vocab, records and records / "pretrain")
            runs = finished_runs(study, records and records / "pretrain")
            if runs:  # the table gets its cost columns; its rows are every optimizer that has runs
                ran = [n for n in SPECS if any(r["optimizer"] == n for r in runs)]
                write_outputs(study, "pretrain", runs, ran, seeds, args, "Optimizer study: pre-training")
            return 0
        grids = {n: lr_grid(SPECS[n]["pretrain_lr"] * args.lr_scale, args.lr_points) for n in names}
        run_one = lambda st, n, lr, s: pretrain_run(st, budget, n, lr, s, tokenizer, args.cache_dir,  # noqa: E731
                                                    records and records / "pretrain")
        write = lambda runs: write_outputs(study, "pretrain", runs, names, seeds, args,  # noqa: E731
                                           "Optimizer study: pre-training")
        runs = study_loop(study, names, seeds, grids, run_one,
                          4 if args.max_extensions is None else args.max_extensions, write)
    else:
        budget = dict(FINETUNE[mode])
        from gpt1_jax.weights import load_pretrained

        init = best_pretrain_workdir(Path(args.init))
        model = load_pretrained(init)[0]  # the architecture, for the state bytes
        grids = {n: lr_grid(SPECS[n]["finetune_lr"] * args.lr_scale, args.lr_points) for n in names}
        runs = []
        for task in (args.tasks.split(",") if args.tasks else budget["tasks"]):
            study = Path(args.out) / "finetune" / task
            run_one = (lambda t: lambda st, n, lr, s: finetune_run(  # noqa: E731
                st, budget, t, n, lr, s, init, model, args.data_dir, records and records / "finetune" / t))(task)
            write = (lambda st, t: lambda rs: write_outputs(  # noqa: E731
                st, "finetune", rs, names, seeds, args, f"Optimizer study: fine-tuning {t}"))(study, task)
            runs += study_loop(study, names, seeds, grids, run_one,
                               0 if args.max_extensions is None else args.max_extensions, write)
    print(f"{args.study} study: {len(runs)} runs in {time.perf_counter() - t0:.0f} s -> {Path(args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
