"""Shared by the GLUE tables (glue_table.py, race_table.py) and the paper's Table 5 (experiments/paper/): what
makes each of Table 5's arms, the --quick fine-tuning config, the mean ± std cells and the tables' plots. The runs
themselves go through experiments/harness.py.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path


from experiments.harness import Done, check_sets
from gpt1_jax.config import FinetuneConfig, apply_overrides, preset
from gpt1_jax.errors import CheckpointFormatError
from gpt1_jax.files import atomic_write_text, pyplot, save_figure
from gpt1_jax.weights import detect_format

# Table 5 (docs/gpt1.md): no_pretrain starts from random weights at the init source's architecture and
# vocabulary (--init scratch:SOURCE; `none` stays none), no_aux_lm fine-tunes without the auxiliary LM loss.
ABLATIONS = ("full", "no_pretrain", "no_aux_lm")


def ablation(arm: str, config: FinetuneConfig, init: str) -> tuple[FinetuneConfig, str]:
    """(the arm's config, its init source) from the full arm's."""
    if arm == "no_aux_lm":
        return dataclasses.replace(config, lm_coef=0.0), init
    if arm == "no_pretrain" and init != "none":
        return config, f"scratch:{init}"
    return config, init


def table_config(quick: bool, sets: list[str], owned: dict[str, str]) -> FinetuneConfig:
    """The GLUE/RACE tables' base config: the paper's recipe, or --quick's (the `tiny` model, one epoch of 64
    examples, 32 dev examples), then the user's --set KEY=VALUE (checked now, before any run starts; a key no run
    keeps, derived or `owned` by the table's own flags, is refused: harness.check_sets)."""
    check_sets(sets, owned)
    config = FinetuneConfig()
    if quick:
        config = dataclasses.replace(preset(FinetuneConfig, "tiny"), epochs=1, batch_size=8, max_train_examples=64,
                                     max_eval_examples=32)
    return apply_overrides(config, sets)


def missing_path(flag: str, path: str | None) -> str | None:
    """The one-line error for a data path that does not exist (None: the flag was not given, or it exists)."""
    if path is None or Path(path).exists():
        return None
    return f"{flag} {path}: no such file or directory"


def missing_init(init: str) -> str | None:
    """missing_path for --init, and the one line for a folder that holds no model (each run failed on it in turn,
    then an empty table was written): `none` needs no folder, and scratch:DIR needs DIR, a model too (its
    architecture and tokenizer)."""
    if init == "none":
        return None
    source = init.removeprefix("scratch:")
    if missing := missing_path("--init", source):
        return missing
    try:
        detect_format(Path(source))
    except CheckpointFormatError as e:  # its line names the folder and the formats it looked for
        return f"--init {e}"
    return None


def mean_std(values: list[float], scale: float = 100.0) -> str:
    if not values:
        return "–"
    values = [v * scale for v in values]
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def metric_values(dones: list[Done], metric: str) -> list[float]:
    return [d.record["metrics"][metric] for d in dones if d.record and d.record["metrics"].get(metric) is not None]


def errors_of(dones: list[Done]) -> str:
    return "; ".join(sorted({d.error for d in dones if d.error}))


def write_table(path: Path, title: str, lines: list[str]) -> str:
    text = f"# {title}\n\n" + "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return text


def plot_table(path: Path, title: str, rows: list[tuple[str, dict[str, list[float]], float | None]],
               paper: str) -> None:
    """The table as a picture: per row (label, {ablation: scores over seeds}, the paper's number), each ablation's
    mean x100 with its seeds' std, beside the paper's number (`paper`: its legend); an ablation without a score
    leaves its bar out."""
    plt = pyplot()

    ablations = list(dict.fromkeys(a for _, arms, _ in rows for a in arms))
    width = 0.8 / max(len(ablations), 1)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(rows) + 2), 3.6), dpi=110)
    for i, arm in enumerate(ablations):
        bars = [(j + (i - (len(ablations) - 1) / 2) * width, [100 * v for v in arms.get(arm, [])])
                for j, (_, arms, _) in enumerate(rows)]
        bars = [(x, v) for x, v in bars if v]
        ax.bar([x for x, _ in bars], [statistics.mean(v) for _, v in bars], width,
               yerr=[statistics.stdev(v) if len(v) > 1 else 0.0 for _, v in bars], capsize=3, label=arm)
    theirs = [(j, number) for j, (_, _, number) in enumerate(rows) if number is not None]
    ax.plot([j for j, _ in theirs], [n for _, n in theirs], "x", color="tab:red", ms=9, label=paper)
    ax.set_xticks(range(len(rows)), [label for label, _, _ in rows])
    ax.set_ylabel("score x100 (mean ± std over seeds)")
    ax.set_title(title, fontsize=10)
    ax.axhline(0, color="gray", lw=0.8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
