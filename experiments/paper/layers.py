"""Stage 6: Figure 2 (left, docs/gpt1.md "Analysis"), the score against the number of pre-trained blocks
transferred. The embeddings always come from pre-training; blocks k+1..L start fresh (FinetuneConfig.init_layers
= k, see gpt1_jax.finetune.transplant). The full arm's lr for the task (Table 5's grid) is used; k = L is the
full arm's own run. Runs go under OUT/layers/<task>/k<k>/seed<s>/; writes results/layers.json and layers.png.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path


from experiments.glue.common import errors_of
from experiments.harness import Count
from experiments.paper.settings import Paper
from experiments.paper.table5 import best_lr, cell, metric_name, ran_now, run_all, run_of, score
from gpt1_jax.files import pyplot, save_figure
from gpt1_jax.weights import load_pretrained


def n_layers(paper: Paper) -> int:
    return load_pretrained(paper.release_dir)[0].n_layers


def layers_stage(paper: Paper) -> bool | None:
    depth, fresh, curves = n_layers(paper), False, {}
    # The stage's count: per task, the full arm's lr grid on seed 0, then each k's seeds at the lr it chose (the
    # run of k = depth and seed 0 is the grid's own)
    seeds = paper.budget.layer_seeds
    curve_runs = (depth + 1) * len(seeds) - (paper.budget.seeds[0] in seeds)
    planned = len(paper.budget.lrs) + curve_runs
    count = Count(planned * len(paper.layer_tasks))
    for task in paper.layer_tasks:
        with count.group(planned):  # a task whose every lr failed lists no curve runs: they leave the total
            if (best := best_lr(paper, "full", task, count)) is None:
                return None
            lr, _, grid = best
            fresh = fresh or ran_now(grid)
            if lr is None:
                curves[task] = {"metric": metric_name(task, grid), "lr": None, "scores": {}, "failed": errors_of(grid)}
                continue
            # k = depth is the full arm's own run; k < depth keeps k blocks (init_layers)
            runs = {k: [run_of(paper, "full", task, lr, seed) if k == depth else
                        run_of(paper, "full", task, lr, seed, paper.out / "layers" / task / f"k{k}" / f"seed{seed}",
                               init_layers=k)
                        for seed in paper.budget.layer_seeds] for k in range(depth + 1)}
            dones = run_all(paper, [r for group in runs.values() for r in group], stage="layers", count=count)
        if dones is None:
            return None
        fresh = fresh or ran_now(dones)
        it = iter(dones)
        by_k = {k: [next(it) for _ in group] for k, group in runs.items()}
        curves[task] = {"metric": metric_name(task, dones), "lr": lr,
                        "scores": {str(k): [s for d in group if (s := score(d)) is not None] for k, group in by_k.items()}}
        print(f"layers {task}: " + "  ".join(f"k={k} {cell(v)}" for k, v in curves[task]["scores"].items()), file=sys.stderr)
    paper.save_json("layers.json", curves)
    plot(curves, paper.results_dir / "layers.png")
    return fresh


def plot(curves: dict, out: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, max(len(curves), 1), figsize=(4.5 * max(len(curves), 1), 3.6), dpi=110, squeeze=False)
    for ax, (task, curve) in zip(axes[0], curves.items()):
        ks = [int(k) for k, v in curve["scores"].items() if v]
        values = [curve["scores"][str(k)] for k in ks]
        means = [statistics.mean(v) for v in values]
        errors = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
        ax.errorbar(ks, means, yerr=errors, fmt="o-", capsize=3, color="tab:blue")
        ax.set_xticks(range(max(ks, default=0) + 1))
        ax.set_xlabel("pre-trained blocks transferred")
        ax.set_ylabel(f"dev {curve['metric']} x100")
        ax.set_title(task)
        ax.grid(alpha=0.3)
    fig.suptitle("Transferring pre-trained blocks (paper Figure 2, left)")
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)
