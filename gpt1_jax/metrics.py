"""Run metrics: `metrics.jsonl` (one JSON object per line), the tracker (TensorBoard, W&B), a progress bar, a run's
`loss.png`, and `gpt1-jax compare`'s overlay of several pre-training runs.

Only process 0 writes (multi-host runs would otherwise write every line N times). On resume the
JSONL file is cut back to the restored step, so it always reads as one uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from tqdm import tqdm

from gpt1_jax.config import PretrainConfig, flat_fields, load_yaml, read_config_file, to_dict
from gpt1_jax.errors import DataError, GPT1JaxError, WorkdirError
from gpt1_jax.files import pyplot, save_figure
from gpt1_jax.workdir import read as workdir_identity


def json_safe(value: Any) -> Any:
    """`value` (nested dicts and lists too) with NaN/inf as the strings "nan"/"inf": JSON has no such numbers, and
    the bare NaN Python's json writes is refused by strict readers (a diverged step, an undefined correlation)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class MetricsWriter:
    """metrics.jsonl, and the same scalars to the run's tracker (gpt1_jax/tracker.py), which it closes."""

    def __init__(self, workdir: str | Path, *, enabled: bool = True, resume_step: int = 0, tracker=None):
        self.enabled = enabled
        self.path = Path(workdir) / "metrics.jsonl"
        self._tracker = tracker
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():  # the steps a resume replays come again; so does a record the last session tore
            kept = [json.dumps(r) for r in _records(self.path) if r["step"] <= resume_step]
            self.path.write_text("".join(l + "\n" for l in kept))
        self._file = open(self.path, "a", buffering=1)

    def write(self, step: int, **scalars: Any) -> None:
        if not self.enabled:
            return
        record = json_safe({"step": int(step), **scalars})
        self._file.write(json.dumps(record) + "\n")
        if self._tracker is not None:
            self._tracker.log(int(step), scalars)

    def flush(self) -> None:
        """At a checkpoint: a run killed later and resumed from it replays only the steps after it, so everything
        logged up to it must be on disk (TensorBoard's writer buffers; metrics.jsonl is line-buffered)."""
        if self.enabled and self._tracker is not None:
            self._tracker.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tracker is not None:
            self._tracker.close()


def _records(path: Path) -> list[dict]:
    """metrics.jsonl's records. A line that is not one (the last, torn by a kill or a full disk; a note a user
    added; an object without an integer step, which a resume compares and the plot draws against) is left out: it
    stopped every resume and plot with a traceback."""
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and not isinstance(record["step"], bool):
            records.append(record)
    return records


def read_metrics(workdir: str | Path) -> list[dict]:
    path = Path(workdir) / "metrics.jsonl"
    return _records(path) if path.exists() else []


def redraw_interval(stream) -> float:
    """Seconds between a bar's redraws: a terminal redraws one line; a file or pipe (a scheduler's log, the launcher's
    prefixed lines) keeps every frame, two a second, ~20 MB a day of a long run: one every 10 s there. What the bar
    says between steps (compiling, evaluating) is drawn at once either way."""
    try:
        return 0.5 if stream.isatty() else 10.0
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return 10.0


class Progress:
    """A progress bar with step, loss, tokens/s and MFU; tqdm supplies the ETA. Silent off process 0.
    `speaks`: whether `warn` prints (process 0's, with or without the bar: --no-progress turns off the bar and
    the status lines, not what a user must know about the run). Work between steps (compiling, evaluating,
    saving) runs inside `paused`: the bar says what it is, and its rate, ETA and elapsed time leave it out."""

    def __init__(self, total: int, initial: int, *, enabled: bool = True, desc: str = "train",
                 speaks: bool | None = None):
        self.bar = Bar(total=total, initial=initial, desc=desc, unit="step", disable=not enabled,
                       dynamic_ncols=True, file=sys.stderr, mininterval=redraw_interval(sys.stderr))
        self.speaks = enabled if speaks is None else speaks
        self.last = time.perf_counter()
        self._paused = False

    def update(self, n: int, **fields: Any) -> None:
        self.bar.update(n)
        self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in fields.items()}, refresh=False)

    @contextlib.contextmanager
    def paused(self, doing: str):
        """The bar says `doing` in place of its fields while the body runs, and its clock stops: a first step's
        compilation (6-26 s) made tqdm's ETA 06:14 for a 35 s run, and an evaluation's time went into the closing
        rate (10.87 s/step for a real 7.79). tqdm's `unpause` would drop the steps since its last print too."""
        bar = self.bar
        if bar.disable or self._paused:  # an outer pause already stopped the clock
            yield
            return
        clock, shown, since = bar._time, bar.postfix, bar._time()  # tqdm's clock: start_t's and last_print_t's
        bar._time, self._paused = (lambda: since), True  # a frame drawn meanwhile (a line written) keeps its times
        bar.set_postfix_str(doing)
        try:
            yield
        finally:
            bar._time, self._paused = clock, False
            paused = clock() - since
            bar.start_t += paused
            bar.last_print_t += paused
            bar.postfix = shown
            bar.refresh()

    def write(self, message: str) -> None:
        if not self.bar.disable:  # process 0 speaks for the run
            self.bar.write(message, file=sys.stderr)

    def warn(self, message: str) -> None:
        """A line the user must see (data cut, settings changed on resume, a preemption): said without the bar too."""
        if self.speaks:
            self.bar.write(message, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def smoothed(losses: np.ndarray) -> tuple[np.ndarray, int]:
    """The train loss as the plots draw it: a running mean over k = 1/25 of its points (a few hundred noisy steps read
    as one line), and k; the points stand for the last step of each window. Under 50 points, k is 1: the points."""
    k = max(1, len(losses) // 25)
    return (np.convolve(losses, np.ones(k) / k, mode="valid") if k > 1 else losses), k


def optimizer_title(workdir: str | Path) -> str:
    """`NAME: adamw, lr 0.003, warmup_cosine`: the run folder's name and the optimizer its config.yaml records, so a
    plot says what it shows once it is copied out of its folder. The name alone where config.yaml does not read:
    a plot never stops a run, and a damaged config.yaml is said by the verbs that use it."""
    try:
        optim = read_config_file(Path(workdir) / "config.yaml").get("optim")
    except (GPT1JaxError, OSError):
        optim = None
    name = Path(workdir).name
    if not isinstance(optim, dict) or not {"name", "lr", "schedule"} <= set(optim):
        return name
    return f"{name}: {optim['name']}, lr {optim['lr']:g}, {optim['schedule']}"


def plot_losses(workdir: str | Path, out: str | Path | None = None, records: list[dict] | None = None) -> Path:
    """`loss.png` beside metrics.jsonl (`records`: its lines, read already): train loss (raw and smoothed) and
    validation loss against step; for a fine-tuning run, beside it, the dev (and held-out) scores of each epoch's
    end."""
    plt = pyplot()

    records = read_metrics(workdir) if records is None else records
    train = [(r["step"], r["loss"]) for r in records if isinstance(r.get("loss"), float)]
    val = [(r["step"], r["val_loss"]) for r in records if isinstance(r.get("val_loss"), float)]
    scores: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for name, value in r.items():
            if name.startswith(("dev/", "holdout/")) and isinstance(value, float):
                scores.setdefault(name, []).append((r["step"], value))
    if scores:
        fig, (ax, right) = plt.subplots(1, 2, figsize=(12, 4), dpi=110)
    else:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        steps, losses = map(np.asarray, zip(*train))
        ax.plot(steps, losses, color="tab:blue", alpha=0.3, lw=1, label="train loss")
        smooth, k = smoothed(losses)
        if k > 1:
            ax.plot(steps[k - 1:], smooth, color="tab:blue", lw=2, label=f"train loss ({k}-step mean)")
    if val:
        ax.plot(*zip(*val), "o-", color="tab:orange", lw=2, label="validation loss")
    ax.set_xlabel("step")
    # a fine-tuning run's loss is its task's plus lm_coef x the LM's (heads.py)
    ax.set_ylabel("task + lm_coef x LM loss" if scores else "cross-entropy (nats/token)")
    ax.set_title(optimizer_title(workdir))
    ax.grid(alpha=0.3)
    if train or val:
        ax.legend()
    else:  # a run that diverged at its first step: matplotlib warned of a legend with nothing in it
        ax.text(0.5, 0.5, "no finite loss recorded", ha="center", va="center", transform=ax.transAxes)
    if scores:
        for name, points in scores.items():
            right.plot(*zip(*points), "o-", lw=2, label=name)
        right.set_xlabel("step")
        right.set_ylabel("score")
        right.set_title("at each epoch's end")
        right.grid(alpha=0.3)
        right.legend()
    out = Path(out) if out else Path(workdir) / "loss.png"
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)
    return out


def plot_layer_stats(workdir: str | Path, out: str | Path | None = None,
                     records: list[dict] | None = None) -> Path | None:
    """`layer_stats.png` beside metrics.jsonl (`records`: its lines, read already) where the run recorded per-layer
    statistics (config `stats_every`, gpt1_jax/layer_stats.py), else None: the update/parameter ratio, gradient and
    parameter norms of every group against step, a column per part of a block (attention, MLP, LayerNorms) with a
    line per block coloured by depth, and the embeddings (and a fine-tuning head) in the last; the ratios and
    gradients on log scales, where groups differ by decades."""
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}  # (group, norm) -> [(step, value)]
    for r in read_metrics(workdir) if records is None else records:
        for name, value in r.items():
            if name.startswith("stats/") and isinstance(value, float) and math.isfinite(value) and value > 0:
                group, norm = name.removeprefix("stats/").rsplit("/", 1)
                series.setdefault((group, norm), []).append((r["step"], value))
    if not series:
        return None
    plt = pyplot()
    from matplotlib import colormaps, colors  # with pyplot, on first use

    blocks = sorted({int(g.split("/")[0].removeprefix("block")) for g, _ in series if g.startswith("block")})
    # one colour per block, deepest yellow: a legend of 12 or 24 blocks would cover the lines
    depth = colors.BoundaryNorm(np.arange(-0.5, max(blocks, default=0) + 1.5), colormaps["viridis"].N)
    norms = [("update_ratio", "update / parameter norm"), ("grad_norm", "gradient norm"), ("param_norm", "parameter norm")]
    parts = [("attn", "attention"), ("mlp", "MLP"), ("ln", "LayerNorms"), ("", "embeddings, head")]
    fig, axes = plt.subplots(len(norms), len(parts), figsize=(14, 8.5), dpi=100, sharex=True, squeeze=False)
    for (norm, ylabel), row in zip(norms, axes):
        for (part, title), ax in zip(parts, row):
            for (group, kind), points in sorted(series.items()):
                block = group.split("/")[0]
                if kind != norm or (part and group != f"{block}/{part}") or (not part and block.startswith("block")):
                    continue
                color = colormaps["viridis"](depth(int(block.removeprefix("block")))) if part else None
                ax.plot(*zip(*points), lw=1.5, color=color, label=None if part else group)
            if norm != "param_norm":  # ratios and gradients span decades; a norm that grows 20% reads better linear
                ax.set_yscale("log")
            else:  # a LayerNorm's norm moves in its 4th digit: "11.3135", not "+1.1313e1" above the axis and "0.0005"
                ax.ticklabel_format(axis="y", useOffset=False)
            ax.grid(alpha=0.3)
            if norm == norms[0][0]:
                ax.set_title(title)
            if part == parts[0][0]:
                ax.set_ylabel(ylabel)
            if not part and ax.lines and norm == norms[0][0]:
                ax.legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.suptitle(f"per-layer statistics: {optimizer_title(workdir)}")
    fig.tight_layout(rect=(0, 0, 0.93 if blocks else 1, 1))
    if blocks:
        bar = fig.colorbar(plt.cm.ScalarMappable(norm=depth, cmap="viridis"), cax=fig.add_axes((0.945, 0.12, 0.012, 0.76)),
                           label="block")
        bar.set_ticks(blocks[::max(1, len(blocks) // 12)])
    out = Path(out) if out else Path(workdir) / "layer_stats.png"
    save_figure(fig, out)
    plt.close(fig)
    return out


def say_plots(workdir: str | Path) -> None:
    """Draws the run's plots and says where they are (process 0, at a run's end): loss.png, and layer_stats.png
    where the run recorded per-layer statistics."""
    records = read_metrics(workdir)  # once: a long run's file is tens of MB with statistics in it
    print(f"loss curve: {plot_losses(workdir, records=records)}", file=sys.stderr)
    if (stats := plot_layer_stats(workdir, records=records)) is not None:
        print(f"per-layer statistics: {stats}", file=sys.stderr)


# ---- compare: pre-training runs side by side ----------------------------------------------------------

# Fields that change neither what a run trains nor how fast: left out of what `compare` says differs between runs.
# optim.total_steps is pre-training's `steps` again (the schedule spans the run).
BOOKKEEPING = ("keep_checkpoints", "keep_steps", "tracker", "data.cache_dir", "data.cache_wait_s", "data.progress",
               "optim.total_steps")


class RunMetrics(NamedTuple):
    """What `compare` reads of one pre-training run: its config's fields, flat, and its curves."""
    label: str  # the folder as the user named it
    fields: dict[str, Any]  # flat_fields of its config.yaml
    tokens_per_step: int  # global batch x seq_len: what one optimizer step trains on, micro-batches or not
    train: list[tuple[int, float]]  # (step, loss)
    val: list[tuple[int, float]]  # (step, val_loss)
    lr: list[tuple[int, float]]
    tokens_per_s: float | None  # the median of the logged rates (a compiling step logs none)


def read_run(workdir: str | Path) -> RunMetrics:
    """A pre-training run folder's config.yaml and metrics.jsonl; one line saying why where it is not a run
    `compare` can draw (no folder, not a pre-training run, no config.yaml, no finite loss logged yet)."""
    path = Path(workdir)
    if not path.is_dir():
        raise WorkdirError(f"{path} " + ("is a file" if path.exists() else "does not exist")
                           + ": give a pre-training run's workdir")
    held = workdir_identity(path)
    if held is None or not (path / "config.yaml").is_file():
        raise WorkdirError(f"{path} is not a pre-training workdir (it holds no run)")
    if held.kind != "pretrain":
        raise WorkdirError(f"{path} holds {held.describe()}, not a pre-training run: compare overlays "
                           "pre-training runs (a fine-tuning run's curves are its loss.png)")
    config = load_yaml(PretrainConfig, path / "config.yaml")
    records = read_metrics(path)

    def series(key: str) -> list[tuple[int, float]]:
        return [(r["step"], r[key]) for r in records if isinstance(r.get(key), float) and math.isfinite(r[key])]

    train, val = series("loss"), series("val_loss")
    if not train and not val:
        raise DataError(f"{path} has no finite loss in {path / 'metrics.jsonl'} (no step trained yet, or it diverged "
                        "at its first): nothing to draw")
    rates = [r for _, r in series("tokens_per_s")]
    return RunMetrics(str(workdir), flat_fields(to_dict(config)), config.data.global_batch_size * config.data.seq_len,
                      train, val, series("lr"), float(np.median(rates)) if rates else None)


def differing_fields(runs: list[RunMetrics]) -> list[list[str]]:
    """For each run, `key=value` for each config field whose value is not the same in every run (in the config's
    own order, BOOKKEEPING left out): what tells the runs apart."""
    keys = [k for k in dict.fromkeys(k for run in runs for k in run.fields)
            if k not in BOOKKEEPING and len({repr(run.fields.get(k)) for run in runs}) > 1]
    return [[f"{k}={run.fields.get(k)}" for k in keys] for run in runs]


def _end_of_train(run: RunMetrics) -> float | None:
    """The train loss where the plotted curve ends: the mean of the last k steps, not the last step's noise."""
    return float(smoothed(np.asarray([loss for _, loss in run.train]))[0][-1]) if run.train else None


def comparison_table(runs: list[RunMetrics]) -> str:
    """One row per run: its steps and tokens, where its train curve ends, its best and final validation loss,
    its tokens/s and what sets it apart."""
    def number(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    header = ("run", "steps", "tokens", "train loss", "best val (step)", "final val", "tokens/s", "differs")
    rows = [header]
    for run, differs in zip(runs, differing_fields(runs)):
        steps = max(step for step, _ in run.train + run.val)
        best = min(run.val, key=lambda point: point[1]) if run.val else None
        rows.append((run.label, str(steps), f"{steps * run.tokens_per_step:,}", number(_end_of_train(run), ".4f"),
                     "-" if best is None else f"{best[1]:.4f} ({best[0]})", number(run.val[-1][1] if run.val else None,
                     ".4f"), number(run.tokens_per_s, ",.0f"), ", ".join(differs) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(row, widths))) + "  " + row[-1] for row in rows)


LEGEND_FIELDS = 4  # differing fields named in a run's legend entry; the table names them all


def plot_comparison(runs: list[RunMetrics], out: Path) -> None:
    """The runs overlaid against tokens seen, each in its own colour: the smoothed train loss (a line) and the
    validation loss (dots) above, the learning rate (log scale) below; the legend names each run by its folder and
    what sets it apart."""
    plt = pyplot()
    from matplotlib.ticker import EngFormatter

    fig, (ax, lr_ax) = plt.subplots(2, 1, figsize=(9, 6.5), dpi=110, sharex=True, height_ratios=(3, 1))
    for i, (run, differs) in enumerate(zip(runs, differing_fields(runs))):
        color = f"C{i % 10}"
        shown = ", ".join(differs[:LEGEND_FIELDS]) + (f", ... (+{len(differs) - LEGEND_FIELDS})"
                                                      if len(differs) > LEGEND_FIELDS else "")
        ax.plot([], [], color=color, lw=2, label=f"{run.label}: {shown}" if shown else run.label)
        if run.train:
            steps, losses = map(np.asarray, zip(*run.train))
            smooth, k = smoothed(losses)
            ax.plot(steps[k - 1:] * run.tokens_per_step, smooth, color=color, lw=2)
        if run.val:
            steps, losses = map(np.asarray, zip(*run.val))
            ax.plot(steps * run.tokens_per_step, losses, "o--", color=color, lw=1)
        points = [(step, lr) for step, lr in run.lr if lr > 0]  # warmup's first step trains at 0: no log of it
        if points:
            steps, lrs = map(np.asarray, zip(*points))
            lr_ax.plot(steps * run.tokens_per_step, lrs, color=color, lw=1.5)
    ax.plot([], [], color="gray", lw=2, label="train loss (running mean over steps / 25)")
    ax.plot([], [], "o--", color="gray", lw=1, label="validation loss")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(f"{len(runs)} pre-training run{'s' * (len(runs) > 1)} against tokens seen")
    ax.legend(fontsize="small")
    lr_ax.set_yscale("log")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("tokens seen (steps x global batch x seq_len)")
    lr_ax.xaxis.set_major_formatter(EngFormatter())
    for axes in (ax, lr_ax):
        axes.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)


class Bar(tqdm):
    """Every progress bar of the package: a tqdm bar that `close_open_bars` can end cleanly."""

    def close(self) -> None:
        # A Ctrl-C inside tqdm's close, after it marked the bar closed and before its newline, left the bar's line
        # open, and the one line that comes last was glued to it (once in a loaded suite): remembered here.
        _closing.add(id(self))
        super().close()
        _closing.discard(id(self))


_closing: set[int] = set()


def say(line: str, who: str = "gpt1-jax") -> None:
    """A status line on stderr (stdout is kept for results: a verb's JSON, samples), e.g. `bench: compiling ...`."""
    print(f"{who}: {line}", file=sys.stderr, flush=True)


def close_open_bars() -> None:
    """A bar a job left open (stopped before its loop closed it) redraws itself when garbage-collected, after
    the one line that must come last: close every open one first, and end the line of one stopped while closing."""
    for bar in list(getattr(tqdm, "_instances", ())):  # every tqdm class's bars (tqdm.auto's too)
        bar.close()
    if _closing:
        _closing.clear()
        print(file=sys.stderr, flush=True)
