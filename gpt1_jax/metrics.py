"""Run metrics: `metrics.jsonl` (one JSON object per line), the tracker (TensorBoard, W&B), and a progress bar.

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
from typing import Any

import numpy as np
from tqdm import tqdm

from gpt1_jax.files import pyplot, save_figure


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


def plot_losses(workdir: str | Path, out: str | Path | None = None) -> Path:
    """`loss.png` beside metrics.jsonl: train loss (raw and smoothed) and validation loss against step; for a
    fine-tuning run, beside it, the dev (and held-out) scores of each epoch's end."""
    plt = pyplot()

    records = read_metrics(workdir)
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
        k = max(1, len(losses) // 25)
        if k > 1:
            smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
            ax.plot(steps[k - 1:], smooth, color="tab:blue", lw=2, label=f"train loss ({k}-step mean)")
    if val:
        ax.plot(*zip(*val), "o-", color="tab:orange", lw=2, label="validation loss")
    ax.set_xlabel("step")
    # a fine-tuning run's loss is its task's plus lm_coef x the LM's (heads.py)
    ax.set_ylabel("task + lm_coef x LM loss" if scores else "cross-entropy (nats/token)")
    ax.set_title(Path(workdir).name)
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
