"""Optimizer comparison (issue 7): the same model, initialisation, data order and token budget for each
optimizer; a learning-rate sweep per optimizer; extra seeds at each one's best lr.

    # pre-training: `small` (~1 h on 2 cores), or --quick (`tiny`); --corpus: any gpt1-jax text source
    # (default: the demo corpus embedded in Python; the committed results used english_mixed.txt.gz)
    python experiments/optimizers/run_study.py pretrain --out /tmp/opt-study [--corpus SOURCE] [--quick]
    # fine-tuning: one GLUE task from the best pre-training run of a pre-training study (or any workdir);
    # GLUE from --data-dir (the official TSV distribution) or, without it, downloaded by tensorflow-datasets
    python experiments/optimizers/run_study.py finetune --out /tmp/opt-study --init /tmp/opt-study/pretrain \
        [--data-dir GLUE_DIR] [--task sst2] [--quick]

Outputs under `<out>/<study>/`: results.json (every run), results.md (one row per optimizer), and PNGs
(val loss vs step and vs training wall-clock at each optimizer's best lr; final loss vs lr). Each
(optimizer, lr, seed) has its own run dir `runs/<optimizer>/lr<lr>_s<seed>/`; a run with `record.json`
is finished and skipped, an unfinished one resumes from its checkpoint, a diverged one (NaN loss:
`train` returns 1, or fine-tuning raises) is recorded as diverged. The order is breadth-first (every
optimizer at its centre lr, then the rest of the grid, then the extra seeds) so that a study cut short
still has a row per optimizer.

Same seed => same init and same data order: `seed` drives both the parameter init and the dropout
masks, `data.seed` the window order; the sweep uses the first seed, the extra seeds repeat the best lr.

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

GRID_FACTOR = 10 ** 0.5  # about the ratio of neighbouring lrs (the 1-3-10 ladder: x3, x3.33)

# Per optimizer: centre lr of the pre-training sweep and of the fine-tuning sweep, and the config
# overrides that make it itself (its own hyper-parameters; the rest are OptimConfig defaults).
SPECS: dict[str, dict[str, Any]] = {
    "gpt1_adam": dict(pretrain_lr=3e-3, finetune_lr=1e-4, overrides={}),
    "adamw": dict(pretrain_lr=3e-3, finetune_lr=1e-4, overrides={"b2": 0.95}),
    "adafactor": dict(pretrain_lr=3e-2, finetune_lr=1e-3, overrides={}),
    "lion": dict(pretrain_lr=3e-4, finetune_lr=1e-5, overrides={"b1": 0.9, "b2": 0.99, "weight_decay": 0.1}),
    "sgd_nesterov": dict(pretrain_lr=0.3, finetune_lr=1e-2, overrides={"momentum": 0.9}),
    "muon": dict(pretrain_lr=3e-3, finetune_lr=1e-4, overrides={}),
    "schedule_free_adamw": dict(pretrain_lr=3e-3, finetune_lr=1e-4, overrides={"schedule": "warmup_constant"}),
    "lamb": dict(pretrain_lr=1e-2, finetune_lr=3e-4, overrides={"eps": 1e-6}),
}
REFERENCE = "gpt1_adam"  # state memory is reported relative to this one

# Budgets. Full pre-training: `small` (4 layers, d 256, 8k BPE) on 16 x 128-token windows per step.
# Measured on this 2-core machine (shared): ~1.3 s per step plus ~15 s compile/eval per run, so
# 8 optimizers x (3 lrs + 1 extra seed) x 80 steps is about an hour.
PRETRAIN = {
    "full": dict(preset="small", source="default", steps=80, warmup=8, batch=16, seq_len=128, eval_every=20,
                 eval_batches=8),
    "quick": dict(preset="tiny", source="default", steps=24, warmup=3, batch=8, seq_len=64, eval_every=8,
                  eval_batches=4),
}
FINETUNE = {
    "full": dict(task="sst2", epochs=2, batch=32, max_train=4000, max_eval=872, n_ctx=128),
    "quick": dict(task="sst2", epochs=1, batch=16, max_train=256, max_eval=128, n_ctx=64),
}


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
    """step -> seconds of that training step, from the logged tokens/s. Step 1 (compilation) and steps
    after an evaluation are as logged by pretrain.py (it restarts the clock after evaluating); step 1 is
    replaced by the median so compile time is not counted as training time."""
    out = {r["step"]: tokens_per_step / r["tokens_per_s"] for r in records if _finite(r.get("tokens_per_s"))}
    if 1 in out and len(out) > 1:
        out[1] = statistics.median(v for k, v in out.items() if k != 1)
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

def pretrain_config(budget: dict, name: str, lr: float, seed: int, tokenizer: str, cache_dir: str | None):
    from gpt1_jax.config import apply_overrides
    from gpt1_jax.config import PretrainConfig, preset

    b = budget
    spec = SPECS[name]
    sets = [
        f"data.source={b['source']}", f"data.tokenizer={tokenizer}", f"data.global_batch_size={b['batch']}",
        f"data.seq_len={b['seq_len']}", f"steps={b['steps']}", f"seed={seed}", f"data.seed={seed}",
        f"eval_every={b['eval_every']}", f"eval_batches={b['eval_batches']}",
        f"checkpoint_every={b['eval_every']}", "log_every=1", "keep_checkpoints=1",
        f"optim.name={name}", f"optim.lr={lr}", f"optim.warmup_steps={b['warmup']}", f"optim.total_steps={b['steps']}",
    ]
    if cache_dir:
        sets.append(f"data.cache_dir={cache_dir}")
    sets += [f"optim.{k}={v}" for k, v in spec["overrides"].items()]
    return apply_overrides(preset(PretrainConfig, b["preset"]), sets)


def prepare_tokenizer(study: Path, budget: dict) -> str:
    """Trains the BPE once for the whole study (every run then loads the same file, and the token cache,
    keyed by the tokenizer, is shared)."""
    from gpt1_jax.data.sources import open_source
    from gpt1_jax.data.tokens import tokenizer_for
    from gpt1_jax.config import PretrainConfig, preset

    vocab = preset(PretrainConfig, budget["preset"]).data.vocab_size
    tokdir = study / "tokenizer"
    tokenizer_for(open_source(budget["source"]), tokdir, vocab_size=vocab, tokenizer="train")
    return str((tokdir / "tokenizer.json").absolute())


def pretrain_run(study: Path, budget: dict, name: str, lr: float, seed: int, tokenizer: str,
                 cache_dir: str | None) -> dict:
    from gpt1_jax.metrics import read_metrics
    from gpt1_jax.errors import DivergenceError
    from gpt1_jax.optim import optimizer_state_bytes, uses_eval_params
    from gpt1_jax.pretrain import run

    workdir = study / "runs" / name / run_name(lr, seed)
    done = workdir / "record.json"
    if done.is_file():
        return json.loads(done.read_text())
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
    records = read_metrics(workdir)
    last_step = max((r["step"] for r in records if "loss" in r), default=0)
    diverged = status != 0 or any(isinstance(r.get("loss"), str) for r in records)
    if not diverged and last_step < config.steps:
        raise KeyboardInterrupt(f"{workdir} stopped at step {last_step} of {config.steps} (interrupted)")
    val = [(r["step"], r["val_loss"]) for r in records if _finite(r.get("val_loss"))]
    eval_at = "x (schedule_free_eval_params)" if uses_eval_params(name) else "params"
    tokens_per_step = config.data.global_batch_size * config.data.seq_len
    times = step_times(records, tokens_per_step)
    from gpt1_jax.config import PretrainConfig, load_yaml

    saved = workdir / "config.yaml"  # run() writes it with the tokenizer's real vocabulary size
    model = load_yaml(PretrainConfig, saved).model if saved.is_file() else config.model
    finals = [l for _, l in val]
    rec = {
        "study": "pretrain", "optimizer": name, "lr": lr, "seed": seed, "workdir": str(workdir),
        "steps": config.steps, "tokens": config.steps * tokens_per_step,
        "final_val_loss": finals[-1] if finals and not diverged and val[-1][0] == config.steps else None,
        "best_val_loss": min(finals) if finals and not diverged else None,
        "val_curve": curve_with_time(val, times), "eval_at": eval_at,
        "tokens_per_s": _median(r.get("tokens_per_s") for r in records if r.get("step", 0) > 1),
        "train_seconds": round(sum(times.values()), 2), "wall_seconds": round(wall, 2),
        "optimizer_state_bytes": optimizer_state_bytes(config.optim, _abstract_params(model)),
        "diverged": diverged, "error": error,
    }
    _prune_checkpoints(workdir)
    done.write_text(json.dumps(rec, indent=2) + "\n")
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


# ---- fine-tuning --------------------------------------------------------------------------------------

def best_pretrain_workdir(init: Path) -> Path:
    """A pre-training study dir -> the workdir of its lowest final validation loss; any other dir is taken
    as a pre-training workdir as is."""
    results = init / "results.json"
    if not results.is_file():
        return init
    runs = [r for r in json.loads(results.read_text())["runs"] if _finite(r.get("final_val_loss"))]
    if not runs:
        raise SystemExit(f"{results}: no finished pre-training run to start from")
    best = min(runs, key=lambda r: r["final_val_loss"])
    return Path(best["workdir"])


def finetune_run(study: Path, budget: dict, name: str, lr: float, seed: int, init: Path, data_dir: str | None,
                 preset: str) -> dict:
    from gpt1_jax.config import FinetuneConfig, PretrainConfig, apply_overrides, load_yaml
    from gpt1_jax.errors import DivergenceError
    from gpt1_jax.finetune import run
    from gpt1_jax.optim import optimizer_state_bytes

    workdir = study / "runs" / name / run_name(lr, seed)
    done = workdir / "record.json"
    if done.is_file():
        return json.loads(done.read_text())
    b = budget
    model = load_yaml(PretrainConfig, init / "config.yaml").model
    sets = [f"task={b['task']}", f"epochs={b['epochs']}", f"batch_size={b['batch']}", f"seed={seed}",
            f"max_train_examples={b['max_train']}", f"max_eval_examples={b['max_eval']}", f"n_ctx={b['n_ctx']}",
            f"optim.name={name}", f"optim.lr={lr}"]
    sets += [f"optim.{k}={v}" for k, v in SPECS[name]["overrides"].items()]
    config = apply_overrides(FinetuneConfig(model=model), sets)
    tokenizer = None  # runs of an older study have no tokenizer.json: use the one their config names
    if not (init / "tokenizer.json").is_file():
        tokenizer = load_yaml(PretrainConfig, init / "config.yaml").data.tokenizer
    print(f"== finetune {name} lr={lr:.3g} seed={seed} -> {workdir}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    error, results = None, None
    try:
        results = run(config, workdir, init=str(init), data_dir=data_dir, tokenizer=tokenizer, progress=True)
    except DivergenceError as e:
        error = f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t0
    diverged = results is None
    metric = results["main_metric"] if results else None
    history = results["history"] if results else []
    rec = {
        "study": "finetune", "optimizer": name, "lr": lr, "seed": seed, "workdir": str(workdir), "init": str(init),
        "task": b["task"], "metric": metric,
        "final_val_loss": None, "best_val_loss": None,  # the loss slots stay for one schema; see dev_*
        "dev_final": history[-1].get(metric) if history else None,
        "dev_best": results["metrics"][metric] if results else None,
        "val_curve": [{"step": h["epoch"], "dev": h.get(metric), "train_loss": h["train_loss"]} for h in history],
        "eval_at": "x (schedule_free_eval_params)" if name.startswith("schedule_free") else "params",
        "tokens_per_s": None, "train_seconds": results["train_seconds"] if results else None,
        "wall_seconds": round(wall, 2),
        "optimizer_state_bytes": optimizer_state_bytes(config.optim, _abstract_params(model)),
        "diverged": diverged, "error": error,
    }
    done.write_text(json.dumps(rec, indent=2) + "\n")
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


def study_loop(args, kind: str, run_one) -> Path:
    study = Path(args.out) / kind
    study.mkdir(parents=True, exist_ok=True)
    names = args.optimizers.split(",") if args.optimizers else list(SPECS)
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        raise SystemExit(f"unknown optimizer(s) {', '.join(unknown)}; known: {', '.join(SPECS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    centre = {n: SPECS[n][f"{kind}_lr"] * args.lr_scale for n in names}
    grids = {n: lr_grid(centre[n], args.lr_points) for n in names}
    runs: list[dict] = []

    def do(name, lr, seed):
        rec = run_one(study, name, lr, seed)
        runs[:] = [r for r in runs if (r["optimizer"], r["lr"], r["seed"]) != (name, lr, seed)] + [rec]
        write_outputs(study, kind, runs, names, seeds, args)

    t0 = time.perf_counter()
    mid = args.lr_points // 2
    for n in names:  # 1. every optimizer at its centre lr
        do(n, grids[n][mid], seeds[0])
    for n in names:  # 2. the rest of the grid
        for lr in grids[n][:mid] + grids[n][mid + 1:]:
            do(n, lr, seeds[0])
    if args.extend_edges:  # 2b. one more point past a best lr that sits on the grid's edge
        for n in names:
            b = best_lr(runs, n, seeds[0])
            if b == grids[n][0] or b == grids[n][-1]:
                do(n, next_rung(b, up=b == grids[n][-1]), seeds[0])
    for n in names:  # 3. the other seeds at the best lr
        b = best_lr(runs, n, seeds[0])
        if b is not None:
            for s in seeds[1:]:
                do(n, b, s)
    write_outputs(study, kind, runs, names, seeds, args)
    print(f"{kind} study: {len(runs)} runs in {time.perf_counter() - t0:.0f} s -> {study}", file=sys.stderr)
    return study


# ---- outputs ------------------------------------------------------------------------------------------

def summarize(runs: list[dict], names: list[str], seeds: list[int]) -> list[dict]:
    ref_bytes = next((r["optimizer_state_bytes"] for r in runs if r["optimizer"] == REFERENCE), None)
    rows = []
    for n in names:
        mine = [r for r in runs if r["optimizer"] == n]
        if not mine:
            continue
        lr = best_lr(runs, n, seeds[0])
        at_best = [r for r in mine if r["lr"] == lr and score(r) is not None]
        vals = [-score(r) if r["study"] == "finetune" else score(r) for r in at_best]
        state = mine[0]["optimizer_state_bytes"]
        rows.append({
            "optimizer": n, "best_lr": lr, "n_seeds": len(vals),
            "mean": statistics.fmean(vals) if vals else None,
            "std": statistics.stdev(vals) if len(vals) > 1 else (0.0 if vals else None),
            "wall_seconds": statistics.fmean(r["wall_seconds"] for r in at_best) if at_best else None,
            "train_seconds": _median(r["train_seconds"] for r in at_best),
            "tokens_per_s": _median(r["tokens_per_s"] for r in at_best),
            "state_bytes": state, "state_vs_ref": state / ref_bytes if ref_bytes else None,
            "lrs": sorted({r["lr"] for r in mine}),
            "diverged_lrs": sorted({r["lr"] for r in mine if r["diverged"]}),
        })
    return rows


def _fmt(x, spec=".4f"):
    return "-" if x is None else format(x, spec)


def results_md(kind: str, rows: list[dict], runs: list[dict], args) -> str:
    metric = "validation loss (nats/token)" if kind == "pretrain" else f"dev {next((r['metric'] for r in runs if r.get('metric')), 'metric')}"
    budget = runs[0]["tokens"] if runs and kind == "pretrain" else None
    lines = [f"# Optimizer study: {kind}{' (quick)' if args.quick else ''}", ""]
    if kind == "pretrain":
        lines.append(f"Same model, init, data order and budget ({budget:,} tokens, {runs[0]['steps']} steps of "
                     f"`{args.corpus}`) per run; "
                     "best lr = lowest final validation loss at the first seed; mean ± std over seeds at that lr.")
    else:
        lines.append(f"Fine-tuning from `{runs[0]['init']}`; best lr = highest best-epoch dev metric at the first "
                     "seed; mean ± std over seeds at that lr.")
    lines += ["", f"| optimizer | best lr | {metric}, mean ± std | seeds | wall time / run (s) | train time (s) | tokens/s "
              "| optimizer state (MB) | state vs Adam | lrs tried (diverged) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tried = ", ".join(f"{lr:.3g}" + ("✗" if lr in r["diverged_lrs"] else "") for lr in r["lrs"])
        lines.append(
            f"| {r['optimizer']} | {_fmt(r['best_lr'], '.3g')} | {_fmt(r['mean'])} ± {_fmt(r['std'])} | {r['n_seeds']} "
            f"| {_fmt(r['wall_seconds'], '.0f')} | {_fmt(r['train_seconds'], '.1f')} | {_fmt(r['tokens_per_s'], ',.0f')} "
            f"| {r['state_bytes'] / 2**20:.2f} | {_fmt(r['state_vs_ref'], '.2f')}× | {tried} |")
    lines += ["", "✗ = diverged (non-finite loss). Optimizer state = bytes of `tx.init(params)` "
              "(`gpt1_jax.optim.optimizer_state_bytes`, clipping and schedule counters included). "
              "Train time = summed step times (compilation and evaluation excluded); wall time includes both.", ""]
    if any(r["optimizer"].startswith("schedule_free") for r in runs):
        lines.append("schedule_free_adamw: pre-training validation losses are at x "
                     "(`gpt1_jax.optim.eval_params` = `optax.contrib.schedule_free_eval_params`), re-evaluated from "
                     "checkpoints." if kind == "pretrain" else
                     "schedule_free_adamw: finetune.py predicts at the training params y, not at x "
                     "(`gpt1_jax.optim.eval_params`), so its dev metric here understates it.")
        lines.append("")
    return "\n".join(lines)


def plot(study: Path, kind: str, runs: list[dict], rows: list[dict], seeds: list[int]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "val_loss" if kind == "pretrain" else "dev"
    ylabel = "validation loss (nats/token)" if kind == "pretrain" else f"dev {next((r['metric'] for r in runs if r.get('metric')), '')}"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    out = []
    xaxes = [("step", "step" if kind == "pretrain" else "epoch", "val_vs_step.png")]
    xaxes.append(("train_seconds", "training wall-clock (s)", "val_vs_time.png") if kind == "pretrain" else
                 ("train_seconds", "fine-tuning time (s)", "val_vs_time.png"))
    for field, xlabel, fname in xaxes:
        fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
        for i, row in enumerate(rows):
            r = next((r for r in runs if r["optimizer"] == row["optimizer"] and r["lr"] == row["best_lr"]
                      and r["seed"] == seeds[0]), None)
            if r is None or not r["val_curve"]:
                continue
            pts = [(p.get(field), p.get(key)) for p in r["val_curve"]]
            if field == "train_seconds" and kind == "finetune":  # one time per run: spread over epochs
                n = len(pts)
                pts = [((j + 1) / n * (r["train_seconds"] or 0), p[1]) for j, p in enumerate(pts)]
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
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(f"final {ylabel}" if kind == "pretrain" else f"best-epoch {ylabel}")
    ax.set_title(f"{kind}: lr sweep (seed {seeds[0]}; x = diverged)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(study / "loss_vs_lr.png")
    plt.close(fig)
    out.append(study / "loss_vs_lr.png")
    return out


def write_outputs(study: Path, kind: str, runs: list[dict], names: list[str], seeds: list[int], args) -> None:
    rows = summarize(runs, names, seeds)
    (study / "results.json").write_text(json.dumps(
        {"study": kind, "quick": args.quick, "seeds": seeds, "summary": rows, "runs": runs}, indent=2) + "\n")
    (study / "results.md").write_text(results_md(kind, rows, runs, args))
    plot(study, kind, runs, rows, seeds)


# ---- command line -------------------------------------------------------------------------------------

def missing_data(args) -> str | None:
    """What is wrong with the data flags of this study, or None."""
    if args.study == "pretrain":
        from gpt1_jax.data.sources import open_source

        try:
            open_source(args.corpus)  # parses the spec and checks the files exist; reads nothing
        except (OSError, ValueError) as e:
            return f"--corpus: {e}"
        return None
    if not Path(args.init).exists():
        return f"--init {args.init}: no such directory"
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        return f"--data-dir {args.data_dir}: no such directory"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", choices=["pretrain", "finetune"])
    p.add_argument("--out", required=True, help="study root; outputs go to <out>/<study>/")
    p.add_argument("--quick", action="store_true", help="minutes: tiny model, a short pre-training / a small GLUE subset")
    p.add_argument("--optimizers", default=None, help=f"comma-separated subset of {','.join(SPECS)}")
    p.add_argument("--seeds", default="0,1", help="first: the lr sweep; others: repeats at the best lr")
    p.add_argument("--lr-points", type=int, default=3, help="lrs per optimizer (the 1-3-10 log ladder around each centre)")
    p.add_argument("--lr-scale", type=float, default=1.0, help="multiplies every centre lr")
    p.add_argument("--extend-edges", action="store_true", help="one more lr past a best lr on the grid's edge")
    p.add_argument("--steps", type=int, default=None, help="pre-training steps (overrides the budget)")
    p.add_argument("--cache-dir", default=None, help="token cache (default: the machine's)")
    p.add_argument("--compile-cache", default=None, help="JAX persistent compilation cache (default: <out>/jax_cache; "
                   "'none' disables): the init and eval programs are the same for every lr, and a resumed study "
                   "recompiles nothing")
    p.add_argument("--corpus", default="default", help="pretrain: a gpt1-jax text source (file, folder, glob or "
                   "tfds:NAME; default: the demo corpus embedded in Python)")
    p.add_argument("--init", default=None, help="finetune: a pre-training study dir (its best run) or workdir")
    p.add_argument("--data-dir", default=None, help="finetune: GLUE's official TSV distribution "
                   "(<dir>/<Task>/{train,dev}.tsv; default: tensorflow-datasets downloads GLUE)")
    p.add_argument("--task", default=None, help="finetune: GLUE task (default sst2)")
    args = p.parse_args(argv)
    if args.lr_points < (2 if args.quick else 3):
        p.error("--lr-points must be >= 3 (a log grid of at least 3 values; --quick allows 2, for tests)")
    if args.study == "finetune" and not args.init:
        p.error("finetune needs --init (a pre-training study dir or workdir)")
    missing = missing_data(args)
    if missing:  # one line, before any compilation; not a usage error, so no usage text
        p.exit(2, f"{p.prog}: error: {missing}\n")

    if args.compile_cache != "none":
        import jax

        jax.config.update("jax_compilation_cache_dir", str(Path(args.compile_cache or Path(args.out) / "jax_cache").absolute()))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    mode = "quick" if args.quick else "full"
    if args.study == "pretrain":
        budget = dict(PRETRAIN[mode], source=args.corpus)
        if args.steps:
            budget["steps"] = args.steps
            budget["warmup"] = min(budget["warmup"], max(1, args.steps // 10))
            budget["eval_every"] = max(1, min(budget["eval_every"], args.steps // 2))
        study = Path(args.out) / "pretrain"
        study.mkdir(parents=True, exist_ok=True)
        tokenizer = prepare_tokenizer(study, budget)
        study_loop(args, "pretrain",
                   lambda st, n, lr, s: pretrain_run(st, budget, n, lr, s, tokenizer, args.cache_dir))
    else:
        budget = dict(FINETUNE[mode])
        if args.task:
            budget["task"] = args.task
        init = best_pretrain_workdir(Path(args.init))
        study_loop(args, "finetune", lambda st, n, lr, s: finetune_run(st, budget, n, lr, s, init, args.data_dir, mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
