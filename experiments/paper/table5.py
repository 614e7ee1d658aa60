"""Stage 4: Table 5 at laptop scale. Every arm (full, no_pretrain, no_aux_lm) fine-tunes every task with the
lr that is best for that arm and task on seed 0, from one shared grid, then runs the other seeds at that lr.

Runs go through experiments/harness.py (in this process; done once a record exists, in the workdir or kept
under results/runs/), under OUT/table5/<arm>/<task>/lr<lr>/seed<k>/. Writes results/table5.json
({task: {arm: [score x100 per seed]}}), results/lr_grid.json and results/table5.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import statistics
import sys
from pathlib import Path


from experiments.glue.common import ablation, errors_of
from experiments import lr_grid
from experiments.harness import Count, Done, Run, finetune_record, sweep
from experiments.paper import stats
from experiments.paper.settings import ARMS, Paper, TASKS
from gpt1_jax.data.glue import glue_task, load_split
from gpt1_jax.data.tasks import subset
from gpt1_jax.files import pyplot, save_figure
from gpt1_jax.interrupt import unwrapped_interrupts

# Paper Table 5 (docs/gpt1.md), our five tasks: task -> (arm -> score).
PAPER = {
    "cola": {"full": 45.4, "no_pretrain": 18.9, "no_aux_lm": 47.9},
    "sst2": {"full": 91.3, "no_pretrain": 84.0, "no_aux_lm": 92.0},
    "mrpc": {"full": 82.3, "no_pretrain": 79.4, "no_aux_lm": 84.9},
    "stsb": {"full": 82.0, "no_pretrain": 30.9, "no_aux_lm": 83.2},
    "rte": {"full": 56.0, "no_pretrain": 53.8, "no_aux_lm": 54.4},
}
GOAL_GAIN, GOAL_WINS = 5.0, 4  # the bar: full beats no_pretrain by >= 5 points on average, on >= 4 tasks


def score(done: Done) -> float | None:
    """The task's official (first) metric x100; None for a failed run. An undefined correlation (constant
    predictions: Pearson's r divides by zero; null in the record) counts as 0, the correlation of a constant guess."""
    if not done.record:
        return None
    value = done.record["metrics"][done.record["main_metric"]]
    return 100.0 * value if value is not None and math.isfinite(value) else 0.0


def metric_name(task: str, dones: list[Done]) -> str:
    """The metric the task's runs recorded (the task's official one before any has run)."""
    return next((d.record["main_metric"] for d in dones if d.record), glue_task(task).metrics[0])


def run_of(paper: Paper, arm: str, task: str, lr: float, seed: int, workdir: Path | None = None, **fields) -> Run:
    """The arm's fine-tuning run of `task` from the release; `fields`: the run's own FinetuneConfig fields."""
    config, init = ablation(arm, paper.budget.finetune_config(task, lr, seed, **fields), str(paper.release_dir))
    workdir = workdir or paper.out / "table5" / arm / task / f"lr{lr:g}" / f"seed{seed}"
    return Run(config, workdir, init, paper.data_dir, paper.tfds_dir)


def run_all(paper: Paper, runs: list[Run], stage: str = "table5", count: Count | None = None) -> list[Done] | None:
    """Each run's Done (made now, or found here or in a kept record), adding each one's wall-clock to `stage` as
    it finishes (a stage spanning sessions keeps its time); None when one stopped at a checkpoint (SIGTERM).
    `count`: the stage's count its runs are numbered in (harness.Count; default: these runs alone)."""
    def keep(done: Done) -> None:
        if done.record and done.seconds:
            paper.add_time(stage, done.seconds)

    return sweep(runs, paper.records, finetune_record, on_done=keep, count=count)


def ran_now(dones: list[Done]) -> bool:
    return any(d.seconds for d in dones)


def selection_score(paper: Paper, done: Done) -> float | None:
    """What chooses the lr: the score x100 on the held-out slice of the training set where the budget holds one
    out, else the dev score (the first release's table, which says so)."""
    if not paper.budget.holdout_fraction or not done.record:
        return score(done)
    value = done.record["holdout"][done.record["main_metric"]]
    return 100.0 * value if value is not None and math.isfinite(value) else 0.0


def best_lr(paper: Paper, arm: str, task: str,
            count: Count | None = None) -> tuple[float | None, list[float], list[Done]] | None:
    """-> (the lr best for `arm` on `task` by seed 0's selection score (None: every run failed), the lrs tried,
    sorted, and their seed-0 runs); None when a run stopped at a checkpoint. The budget's grid first, then one
    more lr at a time (experiments/lr_grid.py) while the best has no worse neighbour on one side, at most
    `max_extensions` of them. `count`: the stage's (run_all), which counts each extension."""
    lrs, seed = list(paper.budget.lrs), paper.budget.seeds[0]
    count = count or Count(len(lrs))  # the grid and its extensions, one count
    grid = run_all(paper, [run_of(paper, arm, task, lr, seed) for lr in lrs], count=count)
    while grid is not None:
        chosen = {lr: s for lr, done in zip(lrs, grid) if (s := selection_score(paper, done)) is not None}
        more = lr_grid.bracket_gap({lr: -chosen[lr] if lr in chosen else None for lr in lrs})
        if more is None or len(lrs) - len(paper.budget.lrs) >= paper.budget.max_extensions:
            break
        lrs.append(more)
        count.total += 1
        added = run_all(paper, [run_of(paper, arm, task, more, seed)], count=count)
        grid = None if added is None else grid + added
    if grid is None:
        return None
    order = sorted(range(len(lrs)), key=lambda i: lrs[i])
    best = max(chosen, key=lambda lr: (chosen[lr], lr)) if chosen else None  # a tie: the larger lr
    return best, [lrs[i] for i in order], [grid[i] for i in order]


def baselines(paper: Paper) -> dict[str, float | None]:
    """Each task's constant-prediction baseline x100 on the dev examples the runs are scored on
    (`stats.constant_baseline`), kept in results/baselines.json: measured from the dev labels where the data
    is at hand, read back from that file where it is not (a rebuild from the records)."""
    known = paper.load_json("baselines.json", {})
    if all(t in known for t in paper.tasks) or not paper.train:
        return {t: known.get(t) for t in paper.tasks}
    for task in paper.tasks:
        if task not in known:
            dev = load_split(task, "validation", paper.data_dir, paper.tfds_dir)
            labels = [dev[i]["label"] for i in subset(len(dev), paper.budget.max_eval, 0)]
            known[task] = stats.constant_baseline(glue_task(task).metrics[0], labels)
            if task == "cola":  # its accuracy too, the measure BabyLM reports
                known["cola_accuracy"] = stats.constant_baseline("accuracy", labels)
    paper.save_json("baselines.json", known)
    return {t: known[t] for t in paper.tasks}


# The order the runs execute in (the tables keep paper.tasks and ARMS), for a plan that spans sessions: the goal's
# pairs (full, no_pretrain) before no_aux_lm, which the goal does not read, and the cheapest tasks first, so that
# each session completes whole paired tasks, intervals and all, and SST-2, the dearest per run, comes last
# (minutes per run: experiments/paper/README.md, "Its cost"). An arm runs its lr grid, then its seeds.
ARM_GROUPS = (("full", "no_pretrain"), ("no_aux_lm",))
CHEAPEST_FIRST = ("cola", "rte", "stsb", "mrpc", "sst2")


def run_order(tasks: tuple[str, ...]) -> list[tuple[str, str]]:
    """(arm, task) pairs in the order Table 5 runs them."""
    ranked = sorted(tasks, key=lambda t: CHEAPEST_FIRST.index(t) if t in CHEAPEST_FIRST else len(CHEAPEST_FIRST))
    return [(arm, task) for group in ARM_GROUPS for task in ranked for arm in group]


def planned_runs(paper: Paper, seeds: tuple[int, ...]) -> int:
    """The runs one arm plans on one task: its lr grid on seed 0, then `seeds` at the lr it chooses, where seed 0's
    run is the grid's (no extension counted: whether the grid grows is learnt as it runs)."""
    return len(paper.budget.lrs) + len(set(seeds) - {paper.budget.seeds[0]})


def arm_runs(paper: Paper, arm: str, task: str,
             count: Count | None = None) -> tuple[float | None, list[float], list[Done], list[Done]] | None:
    """-> (the lr chosen, the lrs tried, their seed-0 runs, the runs of every seed at the chosen lr), running
    what no record holds yet; None when a run stopped at a checkpoint. `count`: the stage's (run_all)."""
    if (best := best_lr(paper, arm, task, count)) is None:
        return None
    lr, lrs, grid = best
    seeds = paper.budget.seeds_of(arm) if lr is not None else ()  # every grid run failed: nothing to repeat
    runs = run_all(paper, [run_of(paper, arm, task, lr, seed) for seed in seeds], count=count)
    return None if runs is None else (lr, lrs, grid, runs)


def table5_stage(paper: Paper) -> bool | None:
    """Runs what is missing, in `run_order`, then writes the tables. Stopped (SIGTERM) -> None, having written
    table5.md with the cells finished so far, marked in progress (the JSON files, which later stages read, wait
    for the whole table). Interrupted (Ctrl-C, or a SIGTERM no run's loop caught: between two runs, or in a
    run's set-up): the same table5.md, then the interrupt goes on to its one line and exit 130. A task --tasks
    left out (`Paper.train_tasks`) fills its cells from the kept records; one not finished there leaves its cells
    empty and the table in progress, and the stage -> whether any run ran now."""
    done, order, waiting = {}, run_order(paper.tasks), []
    count = Count(sum(planned_runs(paper, paper.budget.seeds_of(arm)) for arm, _ in order))
    for arm, task in order:
        try:
            # a Ctrl-C that JAX's C++ wrapped in another error still writes the cells
            with unwrapped_interrupts(), count.group(planned_runs(paper, paper.budget.seeds_of(arm))):
                cell_runs = arm_runs(paper.for_task(task), arm, task, count)
        except FileNotFoundError:
            if not paper.left_out(task):
                raise
            waiting.append(f"{task}/{arm}")
            continue
        except KeyboardInterrupt:
            if add_kept_cells(paper, order, done):
                print(f"table5: interrupted during {task}/{arm}; writing the cells finished so far", file=sys.stderr)
                write_tables(paper, done, order)
            raise
        if cell_runs is None:
            return write_tables(paper, done, order) if add_kept_cells(paper, order, done) else None
        done[arm, task] = cell_runs
    fresh = write_tables(paper, done, order) if done else None
    if waiting:
        print(f"table5: {', '.join(waiting)} not finished, and --tasks leaves them out: the JSON tables wait for "
              "them", file=sys.stderr)
        return any(ran_now(grid + runs) for _, _, grid, runs in done.values())
    return fresh


def from_records(paper: Paper, lookup, *args):
    """`lookup(paper, *args)` (arm_runs, more_seeds.pair_runs) on the kept records alone, quietly (a lookup, not a
    run: no "[n/N] <workdir> done before" lines); None where a run it needs has no record (not finished)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return lookup(dataclasses.replace(paper, train=False), *args)
    except FileNotFoundError:
        return None


def add_kept_cells(paper: Paper, order: list[tuple[str, str]], done: dict) -> dict:
    """`done` with the cells that kept records finish added, for a stopped stage's table: the cells after the stop
    that an earlier session finished (--tasks, or a table grown by a budget) were left out of it, as if not run."""
    for arm, task in order:
        if (arm, task) not in done and (cell := from_records(paper, arm_runs, arm, task)) is not None:
            done[arm, task] = cell
    return done


def write_tables(paper: Paper, done: dict, order: list[tuple[str, str]]) -> bool | None:
    """table5.md from the finished cells `done` ((arm, task) -> arm_runs' result); with every cell of `order`
    finished, the JSON files too -> whether any run ran now; None while cells are missing."""
    stopped = len(done) < len(order)
    fresh, table, grid_scores, held_scores, chosen, metrics, failures = False, {}, {}, {}, {}, {}, {}
    cola_accuracy: dict[str, list[float]] = {}
    by_seed: dict[str, dict[str, dict[int, float]]] = {}  # task -> arm -> seed -> score: the pairs
    for task in paper.tasks:
        table[task], grid_scores[task], held_scores[task], chosen[task], by_seed[task], task_runs = {}, {}, {}, {}, {}, []
        for arm in ARMS:
            lr, lrs, grid, runs = done.get((arm, task), (None, [], [], []))  # not finished yet: an empty cell
            seeds = paper.budget.seeds_of(arm)
            fresh = fresh or ran_now(grid + runs)
            grid_scores[task][arm] = {f"{r_lr:g}": score(d) for r_lr, d in zip(lrs, grid)}
            if paper.budget.holdout_fraction:
                held_scores[task][arm] = {f"{r_lr:g}": selection_score(paper, d) for r_lr, d in zip(lrs, grid)}
            chosen[task][arm] = lr
            table[task][arm] = [s for d in runs if (s := score(d)) is not None]
            accuracies = [d.record["metrics"].get("accuracy") for d in runs if d.record]
            if task == "cola" and accuracies and None not in accuracies:  # recorded since 2026-11-25
                cola_accuracy[arm] = [100.0 * a for a in accuracies]
            by_seed[task][arm] = {seed: s for seed, d in zip(seeds, runs) if (s := score(d)) is not None}
            if errors_of(grid + runs):
                failures[f"{task}/{arm}"] = errors_of(grid + runs)
            task_runs += grid + runs
        metrics[task] = metric_name(task, task_runs)
    claims = intervals(by_seed, baselines(paper))
    selection = held_scores if paper.budget.holdout_fraction else grid_scores  # the scores that chose each lr
    text = table5_markdown(paper, table, chosen, selection, metrics, failures, goal(table), claims, cola_accuracy,
                           progress=(len(done), len(order)) if stopped else None)
    paper.save_text("table5.md", text)
    print(text, file=sys.stderr)
    if stopped:
        return None
    paper.save_json("table5.json", table)
    paper.save_json("lr_grid.json", {t: {a: {"lr": chosen[t][a], "seed0": grid_scores[t][a],
                                             **({"seed0_holdout": held_scores[t][a]} if held_scores[t] else {})}
                                         for a in ARMS} for t in paper.tasks})
    paper.save_json("table5_intervals.json", claims)
    plot(claims, paper.results_dir / "table5.png")
    return fresh


def mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")


def goal(table: dict[str, dict[str, list[float]]]) -> dict:
    """The issue's goal: pre-training raises the 5-task average by >= 5 points over no_pretrain and wins on
    >= 4 of the 5 tasks. `met` is None when a task or an arm has no score (the goal needs all five)."""
    means = {t: {a: mean(v) for a, v in arms.items()} for t, arms in table.items()}
    complete = set(TASKS) <= set(means) and all(math.isfinite(means[t].get(a, float("nan")))
                                                 for t in TASKS for a in ("full", "no_pretrain"))
    averages = {a: mean([means[t][a] for t in means if math.isfinite(means[t].get(a, float("nan")))]) for a in ARMS}
    wins = sum(means[t]["full"] > means[t]["no_pretrain"] for t in means
               if all(math.isfinite(means[t].get(a, float("nan"))) for a in ("full", "no_pretrain")))
    gain = averages["full"] - averages["no_pretrain"]
    met = (gain >= GOAL_GAIN and wins >= GOAL_WINS) if complete else None
    return {"averages": averages, "gain": gain, "wins": wins, "tasks": len(means), "met": met}


def verdict(paper: Paper, table: dict[str, dict[str, list[float]]], claims: dict | None) -> tuple[bool | None, str]:
    """-> (whether the budget's goal is met, None while a task lacks a pair; its line for the tables). The first
    release's goal reads the means (`goal`); a budget with `interval_goal` reads the 95% intervals, as issue 33
    asks: the paired gain above zero on >= 4 of the 5 tasks and on the 5-task average."""
    if not paper.budget.interval_goal or claims is None:
        v = goal(table)
        return v["met"], goal_line(v)
    above = [t for t, c in claims["tasks"].items() if stats.Interval(**c["gain"]).above_zero]
    average = stats.Interval(**claims["average_gain"])
    complete = set(TASKS) <= set(claims["tasks"]) and all(claims["tasks"][t]["gain"]["n"] >= 2 for t in TASKS)
    met = (len(above) >= GOAL_WINS and average.above_zero) if complete else None
    state = {True: "goal MET", False: "goal NOT met", None: "goal not assessed (it needs all five tasks)"}[met]
    n = len(claims["tasks"])  # fewer than 5 where --tasks leaves some out
    return met, (f"**{state}**: the paired gain full − no_pretrain is above zero at 95% on {len(above)} of "
                 f"{n} tasks ({', '.join(above) or 'none'}; goal: >= {GOAL_WINS}) and "
                 f"{'' if average.above_zero else 'not '}on the {n}-task average, {average.text()} (goal: above zero)")


def gain_goal(paper: Paper) -> float | None:
    """The points the budget's goal asks of the average gain (None: its goal reads the intervals)."""
    return None if paper.budget.interval_goal else GOAL_GAIN


def intervals(by_seed: dict[str, dict[str, dict[int, float]]], baseline: dict[str, float | None]) -> dict:
    """What Table 5 may claim, with 95% Student-t intervals over seeds: each arm's mean, whether it clears the
    task's constant-prediction baseline, the paired gain full − no_pretrain per task, and the 5-task average's."""
    row = dataclasses.asdict

    tasks = {}
    for task, arms in by_seed.items():
        base = baseline.get(task)
        tasks[task] = {
            "baseline": base,
            "arms": {a: dict(row(ci := stats.t_interval(list(v.values()))),
                             above_baseline=None if base is None or not v else ci.above(base)) for a, v in arms.items()},
            "gain": row(stats.paired(arms.get("full", {}), arms.get("no_pretrain", {}))),
        }
    pick = lambda arm: {t: arms.get(arm, {}) for t, arms in by_seed.items()}  # noqa: E731
    return {"level": 0.95, "tasks": tasks, "average_gain": row(stats.paired_average(pick("full"), pick("no_pretrain")))}


def plot(claims: dict, out: Path) -> None:
    """Table 5's claim as a picture: per task and for the task average, the paired gain full − no_pretrain with its
    95% t-interval (filled where the interval is above zero), beside the paper's gain (its test-server scores)."""
    plt = pyplot()

    paper_gain = {t: PAPER[t]["full"] - PAPER[t]["no_pretrain"] for t in claims["tasks"] if t in PAPER}
    rows = [(t, c["gain"], paper_gain.get(t)) for t, c in claims["tasks"].items()]
    rows.append(("average", claims["average_gain"], mean(list(paper_gain.values())) if paper_gain else None))
    rows = [r for r in rows if r[1]["n"] and math.isfinite(r[1]["mean"])][::-1]  # the first task on top
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.45 * len(rows)), dpi=110)
    labelled = set()

    def label(name: str) -> str:  # each kind of mark once in the legend
        return "_" if name in labelled or labelled.add(name) else name

    for y, (_, gain, theirs) in enumerate(rows):
        above = gain["n"] >= 2 and gain["low"] > 0
        kind = "ours, interval above 0" if above else "ours, interval reaches 0"
        ax.errorbar(gain["mean"], y, xerr=[[gain["mean"] - gain["low"]], [gain["high"] - gain["mean"]]], fmt="o",
                    color="tab:blue", mfc="tab:blue" if above else "white", capsize=4, label=label(kind))
        if theirs is not None:
            ax.plot(theirs, y, "x", color="tab:red", label=label("paper (GLUE test server)"))
    ax.axvline(0, color="gray", ls="--", lw=1)
    ax.set_yticks(range(len(rows)), [f"{name} ({gain['n']} seeds)" for name, gain, _ in rows])
    ax.set_xlabel("full − no_pretrain, points (x100; ours on the dev sets)")
    ax.set_title("What pre-training adds (Table 5): paired gain, 95% t-interval over seeds", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)


def interval_text(ci: dict, digits: int = 1) -> str:
    return stats.Interval(**ci).text(digits)


def cell(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def goal_line(verdict: dict) -> str:
    head = (f"pre-training gain on the average {verdict['gain']:+.1f} points (goal >= {GOAL_GAIN:g}); "
            f"full beats no_pretrain on {verdict['wins']} of {verdict['tasks']} tasks (goal >= {GOAL_WINS} of 5)")
    state = {True: "goal MET", False: "goal NOT met", None: "goal not assessed (it needs all five tasks)"}
    return f"**{state[verdict['met']]}**: {head}"


def interval_lines(claims: dict, gain_goal: float | None = GOAL_GAIN) -> list[str]:
    """The gains with their intervals, and which cells sit at their task's baseline, in words; `gain_goal`: the
    points the first release's goal asks of the average (None: a budget whose goal reads the intervals)."""
    tasks = claims["tasks"]
    gains = {t: c["gain"] for t, c in tasks.items()}
    above = [t for t, g in gains.items() if stats.Interval(**g).above_zero]
    avg = claims["average_gain"]
    lines = ["Pre-training's paired gain, full − no_pretrain, mean [95% t-interval] over the seeds both arms ran "
             "(a seed draws the same training subset and order in both): "
             + "; ".join(f"{t} {interval_text(g)}" for t, g in gains.items())
             + f"; {len(gains)}-task average {interval_text(avg)}.",  # --tasks may give fewer than 5
             f"Above zero at 95%: {', '.join(above) if above else 'none'} ({len(above)} of {len(gains)} tasks); "
             + ("the average waits for every task's pair" if not avg["n"] else
                f"the average's interval {'is' if stats.Interval(**avg).above_zero else 'is not'} above zero")
             + (f", and reaches below the goal's {gain_goal:g} points: whether the gain clears it is within the seed "
                "noise." if gain_goal is not None and avg["n"] >= 2 and avg["low"] < gain_goal <= avg["high"] else ".")]
    flat = [f"{t}/{a}" for t, c in tasks.items() for a, arm in c["arms"].items() if arm["above_baseline"] is False]
    if flat:
        lines.append("At the constant-prediction baseline (the cell's interval reaches it; marked ° in the table): "
                     + ", ".join(flat) + ".")
    return lines


def recipe_line(paper: Paper) -> str:
    b = paper.budget
    grid = "{" + ", ".join(f"{lr:g}" for lr in b.lrs) + "}"
    fewer = "".join(f", {a} {list(v)}" for a, v in b.arm_seeds.items())
    caps = b.caps_note()
    quick = "; **quick mode**" if paper.quick else ""
    batch = f"batch {b.batch_size}" + (" (examples of near-equal length, gpt1_jax/data/tasks.epoch_order)"
                                       if b.group_by_length else "")
    if not b.holdout_fraction:  # the first release's table: everything chosen on dev
        return (f"Dev-set scores x100, mean ± std over seeds {list(b.seeds)}{fewer}; each arm fine-tunes with the lr "
                f"best for it on seed 0 from {grid}; {b.epochs} epoch(s), {batch}, "
                f"{'every' if not b.max_train else f'at most {b.max_train:,}'} training examples per task{caps}{quick}.")
    return (f"Dev-set scores x100, mean ± std over seeds {list(b.seeds)}{fewer}; each arm fine-tunes with the lr best "
            f"for it on seed 0's held-out {b.holdout_fraction:.0%} of each training set (the same examples in every arm "
            f"and seed), from {grid} grown one rung of the 1-3-10 ladder at a time (at most {b.max_extensions} more) "
            f"until the chosen lr has a worse neighbour on both sides; each run's epoch is chosen on that slice too, "
            f"and the dev set is only measured; {b.epochs} epoch(s), {batch}, "
            f"{'every' if not b.max_train else f'at most {b.max_train:,}'} training example per task{caps} less the "
            f"held-out share{quick}.")


def lr_lines(paper: Paper, chosen: dict, selection: dict) -> list[str]:
    """The lr each arm chose per task, how it was chosen and, where the grid may grow, which choices are not
    bracketed (an optimum that may lie beyond the rates tried)."""
    if not paper.budget.holdout_fraction:
        head = ("Learning rate chosen (seed 0, dev score; the best epoch too is chosen on dev, so every score here "
                "is the best of several looks at the set it reports, an optimistic one):")
    else:
        head = "Learning rate chosen (seed 0, on the held-out slice; dev played no part), of how many lrs tried:"
    lines = [head, "", "| task | " + " | ".join(ARMS) + " |", "|---|" + "---|" * len(ARMS)]
    tried = lambda t, a: f" of {len(selection[t][a])}" if paper.budget.holdout_fraction else ""  # noqa: E731
    for task in paper.tasks:
        lines.append(f"| {task} | " + " | ".join(f"{chosen[task][a]:g}{tried(task, a)}" if chosen[task][a] else "–"
                                                 for a in ARMS) + " |")
    if paper.budget.max_extensions:
        open_ = [f"{t}/{a}" for t in paper.tasks for a in ARMS if lr_grid.bracket_gap(
            {float(lr): None if v is None else -v for lr, v in selection[t][a].items()}) is not None]
        lines += ["", "Not bracketed after the grid's extensions (the best lr sits at the edge of the rates tried): "
                  + (", ".join(open_) if open_ else "none") + "."]
    return lines


def cola_accuracy_line(paper: Paper, accuracy: dict[str, list[float]]) -> list[str]:
    """CoLA by accuracy too (BabyLM reports it so, experiments/paper/README.md), where every run recorded it."""
    if not accuracy:
        return []
    majority = paper.load_json("baselines.json", {}).get("cola_accuracy")
    return ["", "CoLA by accuracy, as BabyLM reports it" + (f" (majority class {majority:.1f})" if majority else "")
            + ": " + ", ".join(f"{a} {cell(v)}" for a, v in accuracy.items()) + "."]


def table5_markdown(paper: Paper, table, chosen, selection, metrics, failures, means: dict, claims: dict,
                    accuracy: dict[str, list[float]], progress: tuple[int, int] | None = None) -> str:
    """`progress`: (arm x task cells finished, of how many) while the table is unfinished: the missing cells
    show –, and the averages and the goal, which need every cell, are left out."""
    lines = [
        *([f"**In progress**: {progress[0]} of {progress[1]} arm × task cells finished (every seed at the chosen "
           "lr); the others show –, and the average and the goal wait for all of them. The same command goes "
           "on (experiments/paper/README.md).", ""] if progress else []),
        recipe_line(paper),
        "Paper: Table 5 (docs/gpt1.md), GPT-1 (117M, BooksCorpus) on GLUE's test server.", "",
        "| task | metric | paper full | paper no_pretrain | paper no_aux_lm | constant baseline | full | no_pretrain "
        "| no_aux_lm | full − no_pretrain [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task in paper.tasks:
        p, c = PAPER.get(task, {}), claims["tasks"][task]
        flat = lambda a: "°" if c["arms"].get(a, {}).get("above_baseline") is False else ""  # noqa: E731
        ours = [cell(table[task][a]) + flat(a) if table[task][a] else "failed" if f"{task}/{a}" in failures else "–"
                for a in ARMS]
        base = "–" if c["baseline"] is None else f"{c['baseline']:.1f}"
        lines.append(f"| {task} | {metrics[task]} | " + " | ".join(f"{p[a]:.1f}" if a in p else "–" for a in ARMS)
                     + f" | {base} | " + " | ".join(ours) + f" | {interval_text(c['gain'])} |")
    paper_avg = [mean([PAPER[t][a] for t in paper.tasks if t in PAPER]) for a in ARMS]
    if not progress:
        lines.append("| **average** | | " + " | ".join(f"{v:.1f}" for v in paper_avg) + " | | "
                     + " | ".join(f"{means['averages'][a]:.1f}" for a in ARMS)
                     + f" | {interval_text(claims['average_gain'])} |")
    lines += [*cola_accuracy_line(paper, accuracy)]
    lines += ["", *([] if progress else [verdict(paper, table, claims)[1], ""]), *interval_lines(claims, gain_goal(paper)), "",
              "Cells: mean ± std over seeds; ° where the cell's 95% t-interval reaches the task's constant-prediction "
              "baseline (majority class for accuracy, \"positive\" everywhere for F1, 0 for MCC and correlations: "
              "experiments/paper/stats.py). The interval's half-width is t × std / √seeds, t = 4.30 at 3 seeds, 2.78 at 5.",
              "", *lr_lines(paper, chosen, selection)]
    if failures:
        lines += ["", "Failed runs: " + "; ".join(f"{k}: {e}" for k, e in failures.items())]
    return "# Table 5 at laptop scale\n\n" + "\n".join(lines) + "\n"
