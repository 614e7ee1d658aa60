"""Stage 7: the first question when Table 5 misses its goal. Does pre-training's advantage grow when each task
fine-tunes on more of its training set? At Table 5's budget (500 examples) a pair task can sit on its
majority class in every arm; if more data lifts the pre-trained model off it and the scratch model stays
there, the gap is a data-budget effect. If neither arm moves, the cause is somewhere else.

`full` and `no_pretrain` fine-tune each task once (seed 0), each at the lr Table 5 chose for that arm
(results/lr_grid.json), on up to `Budget.diagnosis_max_train` training examples. Everything else is
Table 5's recipe. Runs go under OUT/diagnosis/train<N>/<arm>/<task>/lr<lr>/seed0/. The stage writes
results/diagnosis.json ({task: {arm: {lr, score, table5}}}) and diagnosis.md.
"""

from __future__ import annotations

import sys

from experiments.glue.common import errors_of
from experiments.harness import Run
from experiments.paper.settings import Paper
from experiments.paper.table5 import PAPER, cell, mean, metric_name, ran_now, run_all, run_of, score

DIAGNOSIS_ARMS = ("full", "no_pretrain")


def diagnosis_stage(paper: Paper) -> bool | None:
    chosen = paper.load_json("lr_grid.json")
    if not chosen:
        raise FileNotFoundError(f"{paper.results_dir / 'lr_grid.json'}: no Table 5 learning rates (run the table5 stage)")
    table5 = paper.load_json("table5.json", {})
    n = paper.budget.diagnosis_max_train
    seed = paper.budget.seeds[0]
    runs: dict[tuple[str, str], Run] = {}
    unfinished = set()  # tasks --tasks left out whose runs have no record: the files wait for them
    for task in paper.tasks:
        for arm in DIAGNOSIS_ARMS:
            lr = chosen.get(task, {}).get(arm, {}).get("lr")
            if lr is not None:
                workdir = paper.out / "diagnosis" / f"train{n or 'all'}" / arm / task / f"lr{lr:g}" / f"seed{seed}"
                run = run_of(paper, arm, task, lr, seed, workdir, max_train_examples=n)
                if not paper.left_out(task) or paper.records.load(run.workdir) is not None:
                    runs[task, arm] = run
                else:
                    unfinished.add(task)
    dones = run_all(paper, list(runs.values()), stage="diagnosis")
    if dones is None:
        return None
    if unfinished:
        print(f"diagnosis: {', '.join(sorted(unfinished))} not finished and left out by --tasks; "
              f"{paper.results_dir / 'diagnosis.json'} is left as it was", file=sys.stderr)
        return ran_now(dones)
    by_key = dict(zip(runs, dones))
    found: dict[str, dict[str, dict]] = {}
    for (task, arm), done in by_key.items():
        found.setdefault(task, {})[arm] = {"lr": chosen[task][arm]["lr"], "score": score(done),
                                           "table5": table5.get(task, {}).get(arm, [])}
    paper.save_json("diagnosis.json", {"max_train": n, "seed": seed, "tasks": found})
    failed = errors_of(dones)
    metrics = {task: metric_name(task, [d for (t, _), d in by_key.items() if t == task]) for task in found}
    text = diagnosis_markdown(paper, found, metrics, failed)
    paper.save_text("diagnosis.md", text)
    print(text, file=sys.stderr)
    return ran_now(dones)


def gain(arms: dict, key) -> float | None:
    values = [key(arms.get(a, {})) for a in DIAGNOSIS_ARMS]
    return None if any(v is None for v in values) else values[0] - values[1]


def diagnosis_markdown(paper: Paper, found: dict, metrics: dict, failed: str) -> str:
    b = paper.budget
    size = f"at most {b.diagnosis_max_train:,}" if b.diagnosis_max_train else "all"
    lines = [
        f"`full` against `no_pretrain`, seed {b.seeds[0]}, each at the lr Table 5 chose for it, with {size} training "
        f"examples per task against Table 5's {b.max_train:,} (mean of its seeds). Dev scores x100.", "",
        f"| task | metric | full, {b.max_train:,} | no_pretrain, {b.max_train:,} | gain | full, {size} | "
        f"no_pretrain, {size} | gain | paper's gain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(v):
        return "–" if v is None else f"{v:+.1f}"

    for task, arms in found.items():
        small = gain(arms, lambda a: mean(a["table5"]) if a.get("table5") else None)
        large = gain(arms, lambda a: a.get("score"))
        paper_gain = PAPER[task]["full"] - PAPER[task]["no_pretrain"] if task in PAPER else None
        lines.append(f"| {task} | {metrics[task]} | {cell(arms.get('full', {}).get('table5', []))} | "
                     f"{cell(arms.get('no_pretrain', {}).get('table5', []))} | {fmt(small)} | "
                     + " | ".join(cell([s]) if (s := arms.get(a, {}).get("score")) is not None else "failed"
                                  for a in DIAGNOSIS_ARMS)
                     + f" | {fmt(large)} | {fmt(paper_gain)} |")
    if failed:
        lines += ["", f"Failed runs: {failed}"]
    return "# Diagnosis: does pre-training's gain grow with the fine-tuning set?\n\n" + "\n".join(lines) + "\n"
