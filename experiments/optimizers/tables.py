"""The optimizer study's outputs, read off its finished runs: one row per optimizer (best lr, mean ± std over
seeds, bracket, cost), results.md with what the numbers say, results.json and the plots."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

from matplotlib.ticker import MaxNLocator

from gpt1_jax.files import atomic_write_text, pyplot, save_figure
from experiments.optimizers.sweep import best_lr, bracket_gap, finite, median, score
from experiments.paper.report import duration

REFERENCE = "gpt1_adam"  # state memory and token speed-ups are reported relative to this one
UNIGRAM = "unigram.json"  # the pre-training study's unigram loss, beside its bench folder
PLATEAU_NATS = 0.01  # an optimizer whose best loss never gets this far below the unigram loss did not train


# ---- the table ------------------------------------------------------------------------------------------

def summarize(runs: list[dict], names: list[str], seeds: list[int], bench: dict[str, dict] | None = None,
              unigram: float | None = None) -> list[dict]:
    """One row per optimizer, best first; `distinct_from_next`: its mean ± std interval and the next row's do not
    overlap (a difference larger than the seed noise). Pre-training, given the study's `unigram` loss: an
    optimizer whose best validation loss at every lr is not PLATEAU_NATS below it did not train at this budget
    (`trained` False): it is not ranked, its row comes last; `token_speedup`: the tokens REFERENCE's mean curve
    needs to reach the row's mean loss, over the row's tokens (`speedup_bound` "<" or ">" where the curve cannot
    say)."""
    ref_bytes = next((r["optimizer_state_bytes"] for r in runs if r["optimizer"] == REFERENCE), None)
    sign = -1.0 if runs and runs[0]["study"] == "finetune" else 1.0  # rows ascend in `score`
    rows, factors = [], machine_factors(runs, bench or {})
    for n in names:
        mine = [r for r in runs if r["optimizer"] == n]
        if not mine:
            continue
        lr = best_lr(runs, n, seeds[0])
        at_best = _at_best(mine, n, lr)
        vals = [sign * score(r) for r in at_best]
        state = mine[0]["optimizer_state_bytes"]
        rows.append({
            "optimizer": n, "best_lr": lr, "n_seeds": len(vals), "values": vals,
            "mean": statistics.fmean(vals) if vals else None,
            "std": statistics.stdev(vals) if len(vals) > 1 else (0.0 if vals else None),
            "bracketed": lr is not None and bracket_gap(runs, n, seeds[0]) is None,
            "schedule": mine[0].get("schedule"),
            "wall_seconds": statistics.fmean(r["wall_seconds"] for r in at_best) if at_best else None,
            **_training_time(at_best, factors),
            "state_bytes": state, "state_vs_ref": state / ref_bytes if ref_bytes else None,
            "bench": (bench or {}).get(n),
            "lrs": sorted({r["lr"] for r in mine if r["seed"] == seeds[0]}),
            "diverged_lrs": sorted({r["lr"] for r in mine if r["diverged"]}),
            **({"trained": _trained(mine, unigram)} if sign > 0 else {}),
        })
    rows.sort(key=lambda r: (r.get("trained") is False, math.inf if r["mean"] is None else sign * r["mean"]))
    if sign > 0:
        ref = next((r for r in rows if r["optimizer"] == REFERENCE), None)
        ref_curve = _curve(runs, ref) if ref is not None else ([], None)
        for row in rows:
            row["token_speedup"], row["speedup_bound"] = _token_speedup(row, ref, ref_curve, runs)
    for a, b in zip(rows, rows[1:] + [None]):
        if b is None or a["mean"] is None or b["mean"] is None or False in (a.get("trained"), b.get("trained")):
            a["distinct_from_next"] = False
        elif min(a["n_seeds"], b["n_seeds"]) < 2:
            a["distinct_from_next"] = None  # one seed has no spread: the noise is not known yet
        else:
            a["distinct_from_next"] = abs(a["mean"] - b["mean"]) > a["std"] + b["std"]
    return rows


def _trained(mine: list[dict], unigram: float | None) -> bool | None:
    """False when no run of this optimizer got PLATEAU_NATS below the unigram loss; None when it is unknown."""
    best = [r["best_val_loss"] for r in mine if finite(r.get("best_val_loss"))]
    if unigram is None or not best:
        return None
    return min(best) < unigram - PLATEAU_NATS


def _token_speedup(row: dict, ref: dict | None, ref_curve: tuple[list[tuple[float, float]], int | None],
                   runs: list[dict]) -> tuple[float | None, str | None]:
    """(tokens REFERENCE needs to reach the row's mean loss / the tokens the row trained on, "=" | "<" | ">"), read
    off REFERENCE's mean validation curve at its best lr (`_curve`), linear between evaluations. A row better than
    REFERENCE ever got: read off the row's own mean curve instead, the tokens it needs to reach REFERENCE's mean
    loss ("=", or ">" the curve's end if it never does). Above REFERENCE's first evaluation: "<" that share."""
    if ref is None or row["mean"] is None or row.get("trained") is False or ref["mean"] is None:
        return None, None
    if row is ref:
        return 1.0, "="
    ref_curve, ref_tokens = ref_curve
    mine, tokens = _curve(runs, row)
    if not ref_curve or not tokens:
        return None, None
    if row["mean"] >= ref_curve[0][1]:
        return ref_curve[0][0] / tokens, "<"
    if (needed := _tokens_to(ref_curve, row["mean"])) is not None:
        return needed / tokens, "="
    if mine and (own := _tokens_to(mine, ref["mean"])) is not None:  # better than REFERENCE's whole curve
        return ref_tokens / own, "="
    return ref_tokens / tokens, ">"


def _at_best(runs: list[dict], name: str, lr: float | None) -> list[dict]:
    """`name`'s scored runs at `lr`, in seed order: those the row's mean is over."""
    return sorted((r for r in runs if r["optimizer"] == name and r["lr"] == lr and score(r) is not None),
                  key=lambda r: r["seed"])


def _curve(runs: list[dict], row: dict) -> tuple[list[tuple[float, float]], int | None]:
    """(tokens, validation loss) points of the row's mean curve, and its tokens in all: the mean over the runs
    its mean loss is over (`_at_best`), at the evaluations they all made. The curve then ends at the row's mean,
    which the speed-up compares with: one seed's curve against another row's mean put seed noise into it (the
    reference's seed-0 curve never reached its own 3-seed mean, so a row within the noise of it read "> 1.00x")."""
    at_best = _at_best(runs, row["optimizer"], row["best_lr"])
    curves = [{p["step"]: p["val_loss"] for p in r.get("val_curve") or [] if finite(p.get("val_loss"))}
              for r in at_best]
    if not curves:
        return [], None
    steps = sorted(set(curves[0]).intersection(*curves[1:]))
    per_step = at_best[0]["tokens_per_step"]
    return [(step * per_step, statistics.fmean(c[step] for c in curves)) for step in steps], at_best[0].get("tokens")


def _tokens_to(curve: list[tuple[float, float]], loss: float) -> float | None:
    """The tokens at which a curve first reaches `loss`, linear between its points; None when it never does."""
    if curve and curve[0][1] <= loss:
        return curve[0][0]
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if l1 <= loss:
            return t0 + (t1 - t0) * (l0 - loss) / (l0 - l1)
    return None


def cpu_kind(record: dict) -> str:
    """The CPU flag set a run or bench result was measured on (a run's record keeps a string, a bench a list)."""
    flags = record.get("cpu_flags")
    return (" ".join(flags) if isinstance(flags, list) else flags) or "unknown"


def cpu_kinds(records) -> list[str]:
    """The distinct CPU flag sets that `records` (runs or bench results) were measured on."""
    return sorted({cpu_kind(r) for r in records})


def machine_factors(runs: list[dict], bench: dict[str, dict]) -> dict[str, float]:
    """CPU kind -> how long its updates take relative to the bench machine's: the median, over that kind's
    finished runs, of (the run's seconds per update) / (its optimizer's bench step at the study's shape). No factor
    at all when the runs and the bench share one CPU kind: no other machine's seconds to convert, and the runs' own are
    the measurement (a conversion only traded them for the bench's few steps and the median overhead)."""
    if len(kinds := cpu_kinds(runs)) == 1 and cpu_kinds(bench.values()) == kinds:
        return {}
    ratios: dict[str, list[float]] = {}
    for r in runs:
        b = (bench.get(r["optimizer"]) or {}).get("study", {}).get("step_s")
        if not r["diverged"] and finite(b) and finite(r.get("train_seconds")) and r.get("steps"):
            ratios.setdefault(cpu_kind(r), []).append(r["train_seconds"] / r["steps"] / b)
    return {kind: median(v) for kind, v in ratios.items()}


def _training_time(at_best: list[dict], factors: dict[str, float]) -> dict:
    """The row's training seconds and tokens/s. A study spanning sessions spans CPU kinds (one measured 1.8x
    another's tokens/s), so each run's own summed step times are converted to the bench machine's seconds
    with its CPU kind's factor (`machine_factors`; `time_basis` "bench machine"): what an optimizer's
    training loop costs beyond its bench step still counts, the machine's speed does not. Without a factor
    (no bench column for that kind's runs, or every run and bench on one kind): the runs' own seconds
    (`time_basis` "measured")."""
    if not at_best:
        return {"train_seconds": None, "tokens_per_s": None, "time_basis": None}
    per_step = at_best[0].get("tokens_per_step")
    converted = [r["train_seconds"] / factors[cpu_kind(r)] for r in at_best
                 if cpu_kind(r) in factors and finite(r.get("train_seconds"))]
    if converted and per_step and at_best[0].get("steps"):
        seconds = median(converted)
        return {"train_seconds": seconds, "tokens_per_s": at_best[0]["steps"] * per_step / seconds,
                "time_basis": "bench machine"}
    return {"train_seconds": median(r["train_seconds"] for r in at_best),
            "tokens_per_s": median(r["tokens_per_s"] for r in at_best), "time_basis": "measured"}


def _fmt(x, spec=".4f"):
    return "-" if x is None else format(x, spec)


def dev_metric(runs: list[dict]) -> str:
    """The fine-tuning task's main dev metric (accuracy, f1, ...), as its runs recorded it."""
    return next((r["metric"] for r in runs if r.get("metric")), "score")


def metric_label(kind: str, runs: list[dict]) -> str:
    """What the study scores: the table's column and the plots' axis."""
    return "validation loss (nats/token)" if kind == "pretrain" else f"dev {dev_metric(runs)}"


# What each plot of `plot` shows, as results.md captions it.
CAPTIONS = {"val_vs_tokens.png": "validation loss against tokens seen, each optimizer at its best lr",
            "val_vs_time.png": "validation loss against training seconds",
            "loss_vs_lr.png": "final validation loss against lr: the sweep",
            "dev_vs_epoch.png": "dev score against epoch, each optimizer at its best lr",
            "dev_vs_time.png": "dev score against training seconds",
            "dev_vs_lr.png": "best-epoch dev score against lr: the sweep",
            "update_ratio.png": "per-layer update size relative to the parameters"}


def results_md(kind: str, rows: list[dict], runs: list[dict], args, title: str, figures: list[str] = ()) -> str:
    """`figures`: the plots written beside it, shown at its end."""
    lines = [f"# {title}{' (quick)' if args.quick else ''}", "", _protocol(kind, runs, args), "", _compute_line(runs), "",
             *_table(kind, rows, runs),
             "", "Rows are best first. *> next?*: yes when this row's mean ± std interval does not overlap the next "
             "row's (the difference exceeds the seed noise); ≈ otherwise; ? while either has one seed. *bracketed*: "
             "the best lr has a worse or diverged neighbour on both sides. Optimizer state = bytes of "
             "`tx.init(params)` (`gpt1_jax.optim.optimizer_state_bytes`)."]
    if kind == "pretrain":
        lines.append(_time_note(rows))
    if any(r["optimizer"].startswith("schedule_free") for r in runs):
        lines.append("schedule_free_adamw is evaluated at x (`gpt1_jax.optim.eval_params`) in every validation "
                     "and dev evaluation; it trains with warmup then a constant lr, the others warmup then "
                     + ("cosine." if kind == "pretrain" else "linear decay."))
    lines += ["", "## What the numbers say", "", *(f"- {c}" for c in findings(kind, rows, runs))]
    if figures:
        lines += ["", "## Plots", *(f"\n![{CAPTIONS.get(name, name)}]({name})" for name in figures)]
    return "\n".join(lines) + "\n"


def _protocol(kind: str, runs: list[dict], args) -> str:
    """What every run shares and how the best lr is chosen; the --set every run had, where it had one."""
    sets = runs[0].get("sets") if runs else None
    return _protocol_text(kind, runs, args) + (f" Every run with --set {', '.join(sets)}." if sets else "")


def _protocol_text(kind: str, runs: list[dict], args) -> str:
    if kind == "pretrain":
        r0 = runs[0]
        return (f"Same model, init, data order, tokenizer and budget per run: {r0['tokens']:,} tokens = {r0['steps']} "
                f"updates of {r0['tokens_per_step']:,} tokens of `{args.corpus_shown}`. Best lr = lowest final "
                "validation loss (the whole validation split) at the first seed, bracketed: the sweep grows "
                "until the best lr has a worse (or diverged) neighbour on both sides. Mean ± std over seeds "
                "at that lr.")
    # What the records hold, not what this invocation's --max-extensions allows: a study is often extended by a
    # later command with a larger one (MRPC's muon tried 4 more lrs where the text said "at most 2").
    extended = max(len({r["lr"] for r in runs if r["optimizer"] == name}) for name in {r["optimizer"] for r in runs})
    extended -= args.lr_points
    return (f"Fine-tuning `{args.init_shown}`; best lr = highest best-epoch dev score at the first seed, "
            f"from a {args.lr_points}-point log grid around each optimizer's centre"
            + (f", extended by up to {extended} more where the best sat on an edge" if extended > 0 else "")
            + "; mean ± std over seeds at that lr.")


def _compute_line(runs: list[dict]) -> str:
    total = sum(r["wall_seconds"] for r in runs if finite(r.get("wall_seconds")))
    kinds = len(cpu_kinds(runs))
    # hours to one decimal, as the committed studies' (15.9 h); a --quick study's minutes read "0.0 h" that way
    spent = f"{total / 3600:.1f} h" if total >= 360 else duration(total)
    return (f"Compute: {len(runs)} runs, {spent} of wall-clock in all"
            + (f", on {kinds} CPU kinds (each run's flags in results.json)." if kinds > 1 else "."))


def _table(kind: str, rows: list[dict], runs: list[dict]) -> list[str]:
    head = f"| optimizer | best lr | {metric_label(kind, runs)}, mean ± std | seeds | > next? | bracketed | schedule |"
    sep = "|---|---|---|---|---|---|---|"
    if kind == "pretrain":
        head += (" tokens/s | train s | ln V − loss per train min | Adam's tokens to this loss | state (MB) | vs Adam |"
                 " step s (study) | step s (117M, 2x512) | lrs tried (✗ diverged) |")
        sep += "---|---|---|---|---|---|---|---|---|"
    else:
        head += " train s | state (MB) | vs Adam | lrs tried (✗ diverged) |"
        sep += "---|---|---|---|"
    ends = [i == len(rows) - 1 or rows[i + 1].get("trained") is False for i in range(len(rows))]  # the last ranked
    return [head, sep, *(_row(kind, r, end, runs) for r, end in zip(rows, ends))]


def _row(kind: str, r: dict, last: bool, runs: list[dict]) -> str:
    tried = ", ".join(f"{lr:.3g}" + ("✗" if lr in r["diverged_lrs"] else "") for lr in r["lrs"])
    # pre-training grows its sweep until every optimum is bracketed, so a miss there stands out
    bracketed = "yes" if r["bracketed"] else "**no**" if kind == "pretrain" else "no"
    apart = "did not train" if r.get("trained") is False else \
        {True: "yes", None: "?"}.get(r["distinct_from_next"], "-" if last else "≈")
    cells = [r["optimizer"], _fmt(r["best_lr"], ".3g"), f"{_fmt(r['mean'])} ± {_fmt(r['std'])}", str(r["n_seeds"]),
             apart, bracketed, r["schedule"] or "-"]
    state = [f"{r['state_bytes'] / 2**20:.2f}", f"{_fmt(r['state_vs_ref'], '.2f')}×"]
    if kind == "pretrain":
        bench = r["bench"] or {}
        cells += [_fmt(r["tokens_per_s"], ",.0f"), _seconds(r["train_seconds"]),
                  _fmt(_nats_per_minute(r, runs), ".3f"), _speedup_text(r), *state,
                  _fmt(bench.get("study", {}).get("step_s"), ".3f"), _fmt(bench.get("gpt1_117M", {}).get("step_s"), ".2f"),
                  tried]
    else:
        cells += [_seconds(r["train_seconds"]), *state, tried]
    return "| " + " | ".join(cells) + " |"


def _seconds(x: float | None) -> str:
    """A train s cell: whole seconds, as every committed table's (65 s and up); below 10 s, a --quick run's, to
    the hundredth (whole seconds showed 0, 1 or 2 for each optimizer)."""
    return _fmt(x, ".0f" if x is None or x >= 10 else ".2f")


def _speedup_text(r: dict) -> str:
    if r.get("token_speedup") is None:
        return "-"
    return {"=": "", "<": "< ", ">": "> "}[r["speedup_bound"]] + f"{r['token_speedup']:.2f}×"


def _nats_per_minute(r: dict, runs: list[dict]) -> float | None:
    """Nats/token gained over a uniform guess (ln V) per minute of training: loss and cost in one number."""
    vocab = next((x["vocab_size"] for x in runs if x["optimizer"] == r["optimizer"] and x.get("vocab_size")), None)
    return (math.log(vocab) - r["mean"]) / (r["train_seconds"] / 60) if vocab and r["mean"] and r["train_seconds"] else None


def _time_note(rows: list[dict]) -> str:
    basis = {r["time_basis"] for r in rows if r["time_basis"]}
    converted = ("in the bench machine's seconds: divided by the run's CPU kind's factor, the median over "
                 "that kind's runs of (seconds per update / the optimizer's step s (study)), so runs made on "
                 "different CPUs compare and an optimizer's overheads in the training loop still count")
    return ("Train s and tokens/s: each run's summed step times (compilation and evaluation excluded), median "
            "over seeds, " + {frozenset({"bench machine"}): converted, frozenset({"measured"}): "as measured"}.get(
                frozenset(basis), converted + " (where the kind has a factor; as measured otherwise)")
            + "; each run's own seconds and CPU flags are in results.json. ln V − loss per train min: nats/token "
            "gained over a uniform guess per minute of training. Step s: `gpt1-jax bench --optim NAME` (forward "
            "+ backward + update, median of 5) at the study's shape and at GPT-1's 117M shape, batch 2 x 512, "
            "on the bench machine (its CPU flags in the bench records).")


TARGET_LOSS = 5.0  # issue 14: the budget must let the best optimizer reach this validation loss (nats/token)


def findings(kind: str, rows: list[dict], runs: list[dict]) -> list[str]:
    """Statements the table supports, read off it: the order and which gaps exceed the seed noise, what is
    not yet bracketed or repeated, what diverged, and (pre-training) the budget rule and the cost extremes."""
    unit = "nats" if kind == "pretrain" else f"in dev {dev_metric(runs)}"
    finished = [r for r in rows if r["mean"] is not None]
    done = [r for r in finished if r.get("trained") is not False]  # the ranked ones
    if not finished:
        return ["No finished run yet."]
    out = []
    cell = lambda r: f"{r['optimizer']} ({r['mean']:.3f} ± {r['std']:.3f}, {r['n_seeds']} seed{'s' * (r['n_seeds'] != 1)})"  # noqa: E731
    if done:
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
    if open_:
        out.append(f"Best lr not yet bracketed (its optimum may lie beyond the rates tried): {', '.join(open_)}.")
    div = [f"{r['optimizer']} at {', '.join(f'{lr:.3g}' for lr in r['diverged_lrs'])}" for r in rows if r["diverged_lrs"]]
    out.append(f"Diverged: {'; '.join(div)}." if div else "No run diverged.")
    flat = [r for r in runs if r.get("dev_classes_predicted") == 1]
    if flat:  # its score is the score of always answering that class: it ranks nothing
        at_best = [r for r in flat if any(r["optimizer"] == w["optimizer"] and r["lr"] == w["best_lr"] for w in rows)]
        out.append(f"{len(flat)} of {len(runs)} runs predicted one class for all of dev ({len(at_best)} of them at "
                   "an optimizer's best lr): their score is that class's, not a measure of the optimizer.")
    if kind == "pretrain":
        out += _pretrain_findings(rows, runs, done, finished)
    return out


def _pretrain_findings(rows: list[dict], runs: list[dict], done: list[dict], finished: list[dict]) -> list[str]:
    """The pre-training study's own findings: what did not train, the token speed-up, the budget rule and the
    cost columns' caveats."""
    out = []
    stuck = [r for r in rows if r.get("trained") is False]
    if stuck:
        out.append(f"Did not train at this budget, so not ranked: {', '.join(r['optimizer'] for r in stuck)} (best "
                   f"validation loss at every lr tried not {PLATEAU_NATS:g} nats below the unigram loss, what a model "
                   "that ignores its context reaches: `unigram.json`).")
    sped = [f"{r['optimizer']} {_speedup_text(r)}" for r in done if r.get("token_speedup") is not None]
    if sped:
        out.append(f"Token speed-up over {REFERENCE} (the tokens {REFERENCE}'s curve at its best lr, the mean over "
                   "its seeds, needs to reach each optimizer's mean final loss, over the tokens that optimizer "
                   f"trained on; for an optimizer below {REFERENCE}'s whole curve, {REFERENCE}'s tokens over those "
                   f"its own mean curve needs to reach {REFERENCE}'s mean final loss): {', '.join(sped)}.")
    best = finished[0]
    met = best["mean"] <= TARGET_LOSS
    out.append(f"Budget rule: the best optimizer's final validation loss is {best['mean']:.3f} nats/token, "
               f"{'within' if met else 'above'} the {TARGET_LOSS:g} the budget must allow.")
    steps = next((r["steps"] for r in runs if r.get("steps")), None)
    slower = [f"{r['optimizer']} (+{over:.0%})" for r in rows if r["time_basis"] == "bench machine" and steps
              and finite(b := (r["bench"] or {}).get("study", {}).get("step_s"))
              and (over := r["train_seconds"] / steps / b - 1) > 0.1]
    if slower:
        out.append("Training updates slower than the optimizer's bench step by more than 10% (on the bench "
                   f"machine's clock): {', '.join(slower)}; the time columns count the training runs' cost.")
    benched = cpu_kinds(r["bench"] for r in rows if r["bench"])
    if len(benched) > 1:
        out.append(f"The bench columns were timed on {len(benched)} CPU kinds, so their step times (and the "
                   "training seconds made from them) do not compare; rerun `run_study.py bench` on one machine.")
    small = min(rows, key=lambda r: r["state_bytes"])
    if small["state_vs_ref"] is not None and small["optimizer"] != REFERENCE:
        out.append(f"Least optimizer state: {small['optimizer']}, {small['state_vs_ref']:.2f}× {REFERENCE}'s.")
    return out


def plot(study: Path, kind: str, runs: list[dict], rows: list[dict], seeds: list[int]) -> list[Path]:
    """Each optimizer's curve at its best lr against tokens (fine-tuning: epochs) and against training seconds,
    and the lr sweep."""
    pre = kind == "pretrain"
    by_progress = study / ("val_vs_tokens.png" if pre else "dev_vs_epoch.png")
    by_time = study / ("val_vs_time.png" if pre else "dev_vs_time.png")
    by_lr = study / ("loss_vs_lr.png" if pre else "dev_vs_lr.png")
    _plot_curves(by_progress, "tokens", "tokens seen" if pre else "epoch", kind, runs, rows, seeds)
    _plot_curves(by_time, "train_seconds", "training seconds (see results.md)", kind, runs, rows, seeds)
    _plot_lr_sweep(by_lr, kind, runs, rows, seeds)
    best = [r for row in rows if (r := _best_run(runs, row, seeds)) is not None and r.get("update_ratio")]
    if not best:  # runs made before the study logged per-layer statistics
        return [by_progress, by_time, by_lr]
    by_layer = study / "update_ratio.png"
    _plot_update_ratios(by_layer, best)
    return [by_progress, by_time, by_lr, by_layer]


def _best_run(runs: list[dict], row: dict, seeds: list[int]) -> dict | None:
    return next((r for r in runs if r["optimizer"] == row["optimizer"] and r["lr"] == row["best_lr"]
                 and r["seed"] == seeds[0]), None)


def _plot_update_ratios(path: Path, best: list[dict]) -> None:
    """|update| / |params| per parameter group over training, one panel per optimizer's best run: which layers
    each optimizer moves, and how fast (LayerNorms left out; embeddings in black and gray, blocks darker as they go up)."""
    plt = pyplot()
    cols = min(4, len(best))
    rows_n = -(-len(best) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.6 * cols, 3.0 * rows_n), dpi=110, squeeze=False, sharey=True)
    for ax, run in zip(axes.flat, best):
        groups = {g: pts for g, pts in run["update_ratio"].items() if not g.endswith("/ln")}
        depth = 1 + max((int(g.split("/")[0][5:]) for g in groups if g.startswith("block")), default=0)
        for group, pts in sorted(groups.items()):
            steps, values = zip(*pts)
            if group.startswith("block"):
                layer, part = group.split("/")
                color = plt.cm.viridis(1 - int(layer[5:]) / max(depth, 1))
                ax.plot(steps, values, "-" if part == "attn" else "--", color=color, lw=1,
                        label=f"{layer} {part}" if part == "attn" or depth <= 4 else None)
            else:
                ax.plot(steps, values, ":" if group == "embed/tokens" else "-.", color="black" if group == "embed/tokens"
                        else "gray", lw=1.2, label=group)
        ax.set_yscale("log")
        ax.set_title(f"{run['optimizer']} (lr {run['lr']:.3g})", fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3, which="both")
    for ax in axes.flat[len(best):]:
        ax.axis("off")
    axes[0][0].set_ylabel("|update| / |params|")
    axes[0][0].legend(fontsize=6, ncol=2)
    fig.suptitle("Per-layer update size at each optimizer's best lr (solid: attention, dashed: MLP)", fontsize=10)
    _save(plt, fig, path)


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _plot_curves(path: Path, field: str, xlabel: str, kind: str, runs: list[dict], rows: list[dict],
                 seeds: list[int]) -> None:
    plt = pyplot()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    for i, row in enumerate(rows):
        r = _best_run(runs, row, seeds)
        pts = _curve_points(field, kind, r, row) if r is not None and r["val_curve"] else []
        if pts:
            ax.plot(*zip(*pts), "o-", ms=3, color=colors[i % len(colors)], label=f"{row['optimizer']} (lr {row['best_lr']:.3g})")
    ax.set_xlabel(xlabel)
    if field == "tokens" and kind != "pretrain":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs
    ax.set_ylabel(metric_label(kind, runs))
    ax.set_title(f"{kind}: best lr per optimizer, seed {seeds[0]}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def _curve_points(field: str, kind: str, r: dict, row: dict) -> list[tuple[float, float]]:
    """The run's evaluations as (x, score): x in tokens (fine-tuning: epochs) or training seconds."""
    key = "val_loss" if kind == "pretrain" else "dev"
    if field == "tokens":
        scale = r.get("tokens_per_step", 1) if kind == "pretrain" else 1
        pts = [(p["step"] * scale, p.get(key)) for p in r["val_curve"]]
    elif kind == "finetune":  # one time per run: spread over the epochs
        n = len(r["val_curve"])
        pts = [((j + 1) / n * (r["train_seconds"] or 0), p.get(key)) for j, p in enumerate(r["val_curve"])]
    else:  # at the row's seconds per update: one machine's time for every optimizer (_training_time)
        per = (row["train_seconds"] or math.nan) / r["steps"]
        pts = [(p["step"] * per, p.get(key)) for p in r["val_curve"]]
    return [(x, y) for x, y in pts if finite(x) and finite(y)]


def _plot_lr_sweep(path: Path, kind: str, runs: list[dict], rows: list[dict], seeds: list[int]) -> None:
    plt = pyplot()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    scores = [s for r in runs if (s := score(r)) is not None]
    top = (max(scores) if kind == "pretrain" else -min(scores)) if scores else 1.0  # where diverged runs are drawn
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
    ylabel = metric_label(kind, runs)
    ax.set_ylabel(f"final {ylabel}" if kind == "pretrain" else f"best-epoch {ylabel}")
    ax.set_title(f"{kind}: lr sweep (seed {seeds[0]}; ★ best lr, mean ± std over seeds; x = diverged)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def write_outputs(study: Path, kind: str, runs: list[dict], names: list[str], seeds: list[int], args,
                  title: str, plots: bool = True) -> None:
    """results.json and results.md, and with `plots` the PNGs; each file written whole (a killed study never
    leaves half of one), and copied to --results when given."""
    kept = Path(args.records).absolute() / "pretrain" if args.records and kind == "pretrain" else None
    rows = summarize(runs, names, seeds, load_bench(study, kept), (load_unigram(study, kept) or {}).get("unigram_loss") if kind == "pretrain" else None)
    # The records alone decide the file (a rebuild from them gives it byte for byte): runs in workdir order, and
    # the CPU kinds they ran on, not the writer's.
    shown = sorted((dict(r, workdir=str(Path(r["workdir"]).relative_to(study)) if Path(r["workdir"]).is_relative_to(study)
                         else r["workdir"]) for r in runs), key=lambda r: r["workdir"])
    atomic_write_text(study / "results.json", json.dumps(
        {"study": kind, "quick": args.quick, "seeds": seeds, "cpu_kinds": cpu_kinds(runs), "summary": rows, "runs": shown},
        indent=2) + "\n")
    drawn = plot(study, kind, runs, rows, seeds) if plots else []
    atomic_write_text(study / "results.md", results_md(kind, rows, runs, args, title, [p.name for p in drawn]))
    if args.results:  # the copy that is committed: the same files, nothing else
        dest = Path(args.results) / study.relative_to(Path(args.out))
        dest.mkdir(parents=True, exist_ok=True)
        for path in [study / "results.json", study / "results.md", *drawn]:
            shutil.copyfile(path, dest / path.name)


def load_unigram(study: Path, records: Path | None) -> dict | None:
    """The pre-training study's unigram measurement (run_study.measure_unigram: `unigram_loss`, and the study's
    --set where it had one): <study>/unigram.json, or its copy kept under `records` (a fresh clone); None for a
    study measured before it was kept."""
    for path in [study / UNIGRAM] + ([records / UNIGRAM] if records is not None else []):
        if path.is_file():
            return json.loads(path.read_text())
    return None


def load_bench(study: Path, records: Path | None) -> dict[str, dict]:
    """Optimizer -> its bench result: <study>/bench/, or the copies kept under `records` (a fresh clone)."""
    found = {}
    for folder in ([records / "bench"] if records is not None else []) + [study / "bench"]:
        found.update({p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))})
    return found
