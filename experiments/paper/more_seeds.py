"""Stage 5: more seeds for Table 5's pairs (full, no_pretrain), added after the planned table was read.

Table 5's seeds (Budget.seeds) were fixed before any result. `Budget.more_seeds` are run later, for the two
arms whose paired difference is the claim, each at the lr Table 5 chose for that arm and task (table5.best_lr,
from its seed-0 grid: the stage may run before Table 5's other arm); the planned seeds' runs are reused from
their records. Whether to add them was decided knowing the planned result, so their intervals are a follow-up,
reported apart (results/more_seeds.md and more_seeds.json) beside the planned seeds' own, which table5.md keeps.
Runs go where Table 5's go, OUT/table5/<arm>/<task>/lr<lr>/seed<k>/, cheapest task first (table5.CHEAPEST_FIRST).
"""

from __future__ import annotations

import sys

from experiments.harness import Count
from experiments.paper import stats
from experiments.paper.settings import Paper
from experiments.paper.table5 import (baselines, best_lr, cell, from_records, intervals, interval_text, planned_runs,
                                      ran_now, run_all, run_of, run_order, score)
from gpt1_jax.interrupt import unwrapped_interrupts

PAIR = ("full", "no_pretrain")


def more_seeds_stage(paper: Paper) -> bool | None:
    """Runs the pairs' added seeds -> whether any run ran now (False too when the budget adds none); None when a
    run stopped at a checkpoint, having written the pairs finished (those after the stop too, from kept records).
    Interrupted (Ctrl-C, or a SIGTERM between two runs): the same, then the interrupt goes on (exit 130)."""
    if not paper.budget.more_seeds:
        print(f"more_seeds: the {paper.budget_name} budget adds no seeds", file=sys.stderr)
        return False
    by_seed: dict[str, dict[str, dict[int, float]]] = {}  # task -> arm -> seed -> score
    fresh, waiting, order = False, [], [(a, t) for a, t in run_order(paper.tasks) if a in PAIR]
    seeds_of = {arm: paper.budget.seeds_of(arm) + paper.budget.more_seeds for arm in PAIR}
    count = Count(sum(planned_runs(paper, seeds_of[arm]) for arm, _ in order))
    for arm, task in order:
        try:
            # a Ctrl-C that JAX's C++ wrapped in another error still writes the pairs
            with unwrapped_interrupts(), count.group(planned_runs(paper, seeds_of[arm])):
                dones = pair_runs(paper.for_task(task), arm, task, seeds_of[arm], count)
        except FileNotFoundError:
            if not paper.left_out(task):
                raise
            waiting.append(f"{task}/{arm}")
            continue
        except KeyboardInterrupt:
            write(paper, add_kept_pairs(paper, order, seeds_of, by_seed))
            raise
        if dones is None:
            write(paper, add_kept_pairs(paper, order, seeds_of, by_seed))
            return None
        if dones:  # none: every run of its grid failed, no seed to add
            fresh = fresh or ran_now(dones)
            by_seed.setdefault(task, {})[arm] = scores(seeds_of[arm], dones)
    if waiting:
        print(f"more_seeds: {', '.join(waiting)} not finished, and --tasks leaves them out", file=sys.stderr)
    write(paper, by_seed)
    return fresh


def pair_runs(paper: Paper, arm: str, task: str, seeds: tuple[int, ...], count: Count | None = None) -> list | None:
    """`arm`'s runs on `task` at the lr Table 5 chose for it (table5.best_lr, from its seed-0 grid; a grid run
    missing is made, as there), one a seed: made now, or found (the planned seeds' are Table 5's own); [] when every
    run of its grid failed (no seed to add); None when a run stopped at a checkpoint."""
    if (best := best_lr(paper, arm, task, count)) is None:
        return None
    if (lr := best[0]) is None:
        return []
    return run_all(paper, [run_of(paper, arm, task, lr, s) for s in seeds], stage="more_seeds", count=count)


def scores(seeds: tuple[int, ...], dones: list) -> dict[int, float]:
    return {s: v for s, d in zip(seeds, dones) if (v := score(d)) is not None}


def add_kept_pairs(paper: Paper, order: list[tuple[str, str]], seeds_of: dict, by_seed: dict) -> dict:
    """`by_seed` with the pairs' arms that kept records finish added, for a stopped stage's tables: those after the
    stop that an earlier session finished were left out of them, as if not run."""
    for arm, task in order:
        if arm not in by_seed.get(task, {}) and (dones := from_records(paper, pair_runs, arm, task, seeds_of[arm])):
            by_seed.setdefault(task, {})[arm] = scores(seeds_of[arm], dones)
    return by_seed


def write(paper: Paper, by_seed: dict[str, dict[str, dict[int, float]]]) -> None:
    """more_seeds.json (the intervals over every seed and over the planned ones) and more_seeds.md."""
    planned = set(paper.budget.seeds)
    first = {t: {a: {s: v for s, v in arms[a].items() if s in planned} for a in arms} for t, arms in by_seed.items()}
    base = {t: b for t, b in baselines(paper).items() if t in by_seed}
    found = {"planned_seeds": list(paper.budget.seeds), "more_seeds": list(paper.budget.more_seeds),
             "complete": all(t in by_seed and set(by_seed[t]) == set(PAIR) for t in paper.tasks),
             "all": intervals(by_seed, base), "planned": intervals(first, base)}
    paper.save_json("more_seeds.json", found)
    text = more_seeds_markdown(paper, found, by_seed)
    paper.save_text("more_seeds.md", text)
    print(text, file=sys.stderr)


def seeds_text(seeds: list[int]) -> str:
    return f"{seeds[0]}–{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))


def more_seeds_markdown(paper: Paper, found: dict, by_seed: dict) -> str:
    planned, more = found["planned_seeds"], found["more_seeds"]
    every = seeds_text(planned + more)
    claims, first = found["all"], found["planned"]
    lines = [
        *([] if found["complete"] else [
            f"**In progress**: {len(by_seed)} of {len(paper.tasks)} tasks so far; the same command goes on "
            "(experiments/paper/README.md).", ""]),
        f"Table 5 (`table5.md`) planned seeds {seeds_text(planned)} for full and no_pretrain before any result. Seeds "
        f"{seeds_text(more)} were added after it was read, so the intervals over seeds {every} are a follow-up "
        "chosen knowing the planned result, not the planned test; both are below. Each arm runs at the lr "
        "`table5.md` chose for it, with its recipe; a seed draws the same training order in both arms. Dev "
        "scores x100, mean ± std over seeds, 95% Student-t intervals (experiments/paper/stats.py).", "",
        f"| task | constant baseline | full, seeds {every} | no_pretrain, seeds {every} | "
        f"gain, seeds {seeds_text(planned)} [95% CI] | gain, seeds {every} [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    for task, c in claims["tasks"].items():
        flat = lambda a: "°" if c["arms"].get(a, {}).get("above_baseline") is False else ""  # noqa: E731
        base = "–" if c["baseline"] is None else f"{c['baseline']:.1f}"
        lines.append(f"| {task} | {base} | "
                     + " | ".join(cell(list(by_seed[task].get(a, {}).values())) + flat(a) for a in PAIR)
                     + f" | {interval_text(first['tasks'][task]['gain'])} | {interval_text(c['gain'])} |")
    if found["complete"]:
        lines.append(f"| **{len(claims['tasks'])}-task average** | | | | {interval_text(first['average_gain'])} | "
                     f"{interval_text(claims['average_gain'])} |")
    lines.append("")
    for name, c in ((f"seeds {seeds_text(planned)} (planned)", first), (f"seeds {every}", claims)):
        above = [t for t, x in c["tasks"].items() if stats.Interval(**x["gain"]).above_zero]
        n = len(c["tasks"])
        average = ""
        if found["complete"]:
            average = f"; the {n}-task average's interval {'is' if stats.Interval(**c['average_gain']).above_zero else 'is not'} above zero"
        lines.append(f"Gain above zero at 95%, {name}: {', '.join(above) if above else 'none'} ({len(above)} of {n} tasks)"
                     f"{average}.")
    flat = [f"{t}/{a}" for t, c in claims["tasks"].items() for a, arm in c["arms"].items() if arm["above_baseline"] is False]
    if flat:
        lines.append(f"At the constant-prediction baseline over seeds {every} (the cell's interval reaches it; ° in "
                     "the table): " + ", ".join(flat) + ".")
    return "# Table 5: more seeds for the pairs\n\n" + "\n".join(lines) + "\n"
