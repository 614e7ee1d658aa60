"""results/README.md: the command, each stage's wall-clock (results/timings.json, kept by run.py), and what
every stage found, from the files the stages wrote. Rewritten at the end of every invocation."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from experiments.paper import layers, table5, zeroshot
from experiments.paper.more_seeds import more_seeds_stage
from experiments.paper.release import pretrain_config
from experiments.paper.settings import ARMS, BUDGETS, RECIPE, TASKS, Paper, shown
from experiments.paper.table5 import cell, goal
from gpt1_jax.config import PretrainConfig, load_yaml
from gpt1_jax.metrics import read_metrics

# A committed pipeline's inputs, as this project's machines hold them (its README is rebuilt from records alone)
DATA = "--corpus ../shared/data/corpus/english_mixed.txt.gz --data-dir ../shared/data/glue --race ../shared/data/race.tar.gz"


def command(paper: Paper) -> str:
    """The command that writes these results: the defaults' recipe and budget go without saying; a pipeline that is
    not a committed one (--quick, another recipe or budget) names its own inputs and --out."""
    recipe = "" if Path(paper.pretrain_config).resolve() == RECIPE else f" --pretrain-config {shown(paper.pretrain_config)}"
    budget = "" if paper.budget_name == "laptop" else f" --budget {paper.budget_name}"
    if paper.committed:
        return f"python -m experiments.paper.run{recipe}{budget} {DATA}"
    given = [f"--{flag} {shown(value)}" for flag, value in (("corpus", paper.corpus), ("data-dir", paper.data_dir),
                                                     ("race", paper.race), ("out", paper.out)) if value is not None]
    return " ".join([f"python -m experiments.paper.run{recipe}{budget}", *given])


def duration(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {s:02d} s" if minutes else f"{s} s"


def pretrain_seconds(paper: Paper) -> float | None:
    """Pre-training's step time from its metrics.jsonl (evaluations and saves aside), for a run that run.py
    did not time because it ran elsewhere."""
    if not (paper.pretrain_dir / "config.yaml").is_file():
        return None
    config = load_yaml(PretrainConfig, paper.pretrain_dir / "config.yaml")
    tokens = config.data.global_batch_size * config.data.seq_len
    rates = [r["tokens_per_s"] for r in read_metrics(paper.pretrain_dir) if r.get("tokens_per_s")]
    return sum(tokens / rate for rate in rates) if rates else None


def figure(paper: Paper, name: str, caption: str) -> list[str]:
    """The results' plot `name` shown in README.md (where a renderer draws it), if the stage wrote it."""
    return ["", f"![{caption}]({name})"] if (paper.results_dir / name).is_file() else []


def pretrain_summary(paper: Paper) -> list[str]:
    """The validation curve of the pre-training run, and its loss plot copied beside the results."""
    val = [{"step": r["step"], "val_loss": r["val_loss"], "val_ppl": r["val_ppl"]}
           for r in read_metrics(paper.pretrain_dir) if "val_ppl" in r]
    if val:
        if (paper.pretrain_dir / "loss.png").is_file():
            shutil.copyfile(paper.pretrain_dir / "loss.png", paper.results_dir / "pretrain_loss.png")
        paper.save_json("pretrain.json", val)
    else:  # the run dir is gone (a fresh clone, another session): the curve kept beside the results
        val = paper.load_json("pretrain.json") or []
    if not val:
        return [f"No pre-training run in this OUT (the release was made elsewhere: see {shown(paper.release_dir)}/README.md)."]
    last = val[-1]
    return [f"Validation perplexity {last['val_ppl']:.1f} (loss {last['val_loss']:.3f} nats/token) at step {last['step']}; "
            "curve: `pretrain.json`, plot: `pretrain_loss.png`.", "",
            "| step | " + " | ".join(str(r["step"]) for r in val) + " |", "|---|" + "---|" * len(val),
            "| val ppl | " + " | ".join(f"{r['val_ppl']:.1f}" for r in val) + " |",
            *figure(paper, "pretrain_loss.png", "pre-training loss")]


def table5_summary(paper: Paper) -> list[str]:
    table = paper.load_json("table5.json")
    if not table:
        partial = paper.results_dir / "table5.md"  # a stopped Table 5 writes the cells it has finished
        return ["In progress: the cells finished so far are in `table5.md` (the average and the goal wait for all of "
                "them)."] if partial.is_file() else ["Not run yet."]
    claims, averages = paper.load_json("table5_intervals.json"), goal(table)["averages"]
    return [table5.verdict(paper, table, claims)[1], "",
            "Averages: " + ", ".join(f"{a} {averages[a]:.1f}" for a in ARMS)
            + ". Per task: `table5.md`; the gains, plotted: `table5.png`.",
            *(["", *table5.interval_lines(claims, table5.gain_goal(paper))] if claims else []),
            *figure(paper, "table5.png", "Table 5: pre-training's paired gain per task, 95% t-intervals")]


def more_seeds_summary(paper: Paper) -> list[str]:
    """The pairs' added seeds (more_seeds.md), where the budget has them."""
    if not paper.budget.more_seeds:
        return []
    if not (found := paper.load_json("more_seeds.json")):
        return ["", f"Seeds {list(paper.budget.more_seeds)} for full and no_pretrain, added after the table was read: "
                "not run yet (`more_seeds.md`)."]
    tasks = found["all"]["tasks"]
    gains = "; ".join(f"{t} {table5.interval_text(c['gain'])} (n {c['gain']['n']})" for t, c in tasks.items())
    average = (f"; {len(tasks)}-task average {table5.interval_text(found['all']['average_gain'])}" if found["complete"]
               else "")
    return ["", f"With seeds {found['more_seeds']} added to full and no_pretrain after the table was read (a follow-up, "
            f"not the planned test; `more_seeds.md`{'' if found['complete'] else ', in progress'}), the paired gain over "
            f"every seed: {gains}{average}."]


def layers_summary(paper: Paper) -> list[str]:
    curves = paper.load_json("layers.json")
    if not curves:
        return ["Not run yet."]
    lines = []
    for task, curve in curves.items():
        scores = curve["scores"]
        lines.append(f"- {task} ({curve['metric']}, lr {curve['lr']}): "
                     + ", ".join(f"{k} blocks {cell(v)}" for k, v in scores.items()) if scores else f"- {task}: failed")
    return lines + ["", "Plot: `layers.png`.", *figure(paper, "layers.png", "Figure 2 (left): layers transferred")]


def diagnosis_summary(paper: Paper) -> list[str]:
    found = paper.load_json("diagnosis.json")
    if not found and not paper.budget.max_train:
        return [f"Not run: this Table 5 already fine-tunes on every training example{paper.budget.caps_note()}, and the "
                "stage asks whether more of them would move the gain."]
    if not found:
        table = paper.load_json("table5.json")
        why = ("Table 5 met its goal, and this stage is for one that misses it"
               if table and table5.verdict(paper, table, paper.load_json("table5_intervals.json"))[0]
               else "the stage for a Table 5 that misses its goal")
        return [f"Not run: {why} (`--stages diagnosis`; ~2 h at the laptop budget)."]
    size = f"at most {found['max_train']:,}" if found["max_train"] else "all"
    lines = [f"`full` vs `no_pretrain` on {size} training examples per task (seed {found['seed']}):"]
    for task, arms in found["tasks"].items():
        lines.append(f"- {task}: " + ", ".join(f"{arm} {cell([a['score']]) if a['score'] is not None else 'failed'}"
                                              for arm, a in arms.items()))
    return lines + ["", "Beside Table 5's numbers: `diagnosis.md`."]


def zeroshot_summary(paper: Paper) -> list[str]:
    zs = paper.load_json("zeroshot.json")
    if not zs:
        return ["Not run yet." if pretrain_config(paper).keep_steps else
                "Not run: the recipe kept no pre-training checkpoints to score (its keep_steps)."]
    steps = sorted(zs["steps"], key=int)
    names = ("sst2", "cola", "race")
    lines = [f"Examples: {zs['examples']} (0: the whole set). Plot: `zeroshot.png`.", "",
             "| updates | SST-2 acc | CoLA MCC | RACE acc |", "|---|---|---|---|",
             "| chance | " + " | ".join(f"{zs['chance'][n]:.1f}" for n in names) + " |"]
    if "baseline" in zs:
        lines.append("| majority (constant) | " + " | ".join(f"{zs['baseline'][n]:.1f}" for n in names) + " |")
    lines += [f"| {s} | " + " | ".join(f"{zs['steps'][s][n]:.1f}" for n in names) + " |" for s in steps]
    if "baseline" in zs:
        lines += ["", "Against its set's majority (constant) baseline, a score counts only more than 2 standard errors "
                  "above it (binomial for accuracy, (1 − r²)/√(n − 1) for MCC; the plot's bands are 1 standard error): "
                  + "; ".join(_left(zs, n) for n in names) + "."]
    return lines + figure(paper, "zeroshot.png", "Figure 2 (right): zero-shot scores over pre-training")


def _left(zs: dict, key: str) -> str:
    name, n = {"sst2": "SST-2", "cola": "CoLA", "race": "RACE"}[key], zs["n"][key]
    above, last = zeroshot.above_baseline(zs, key), max(map(int, zs["steps"]))
    if not above:
        return f"{name} is never above it, a null result ({n:,} examples)"
    return (f"{name} is above it at update{'s' * (len(above) > 1)} {', '.join(f'{s:,}' for s in above)} ({len(above)} of "
            f"{len(zs['steps'])} checkpoints, {'the last among them' if last in above else 'not the last'}; {n:,} examples)")


def stage_row(stage: str, seconds: float, timings: dict) -> str:
    """A stage's wall-clock, with the machines it ran on where they are not the heading's (its last machine)."""
    others = [m for m in timings.get("stage_machines", {}).get(stage, []) if m != timings["machine"]]
    where = f" (on {'; '.join(others)})" if others else ""
    return f"| {stage} | {duration(seconds)}{where} |"


def write_readme(paper: Paper) -> None:
    timings = paper.load_json("timings.json", {"stages": {}, "machine": ""})
    b = paper.budget
    stage_rows = [stage_row(stage, seconds, timings) for stage, seconds in timings["stages"].items()]
    total = sum(timings["stages"].values())
    if "pretrain" not in timings["stages"] and (seconds := pretrain_seconds(paper)):
        stage_rows.insert(0, f"| pretrain | {duration(seconds)} (its steps, from metrics.jsonl: run outside run.py) |")
        total += seconds
    text = "\n".join([
        "# GPT-1 at laptop scale: results",
        "",
        f"Written by experiments/paper/run.py (budget `{paper.budget_name}`, pre-training config "
        f"`{shown(paper.pretrain_config)}`). The one command, from the repository root (the data paths are this project's "
        "machines'; see experiments/paper/README.md):",
        "",
        f"    {command(paper)}",
        "",
        f"## Wall-clock per stage ({timings['machine'] or f'{os.cpu_count()} CPU cores'})",
        "",
        "Time spent doing work, summed over sessions (a stage that finds its work done adds nothing).",
        "",
        "| stage | wall-clock |", "|---|---|", *stage_rows, f"| **total** | {duration(total)} |",
        "",
        "## Pre-training", "", *pretrain_summary(paper),
        "",
        "## Table 5: ablations", "",
        f"{len(ARMS)} arms x {len(paper.tasks)} tasks; lr grid {list(b.lrs)} on seed 0, then seeds {list(b.seeds)} "
        f"at the chosen lr; {b.epochs} epoch(s), batch {b.batch_size}, "
        f"{'all' if not b.max_train else f'at most {b.max_train:,}'} training examples per task{b.caps_note()}.", "",
        *table5_summary(paper), *more_seeds_summary(paper),
        "",
        "## Figure 2 (left): pre-trained blocks transferred", "", *layers_summary(paper),
        "",
        "## Figure 2 (right): zero-shot over pre-training", "", *zeroshot_summary(paper),
        "",
        "## Diagnosis: more fine-tuning data", "", *diagnosis_summary(paper),
        "",
        "## The same command for GPT-1 itself",
        "",
        "    python -m experiments.paper.run --pretrain-config gpt1 --budget paper --corpus BOOKS --data-dir GLUE_DIR \\",
        "        --race RACE_TAR --out runs/gpt1",
        "",
        "`--pretrain-config gpt1` is the `gpt1` preset (117M parameters: 12 blocks of 768, context 512, batch 64 x 512, "
        "lr 2.5e-4 after 2,000 warmup updates, 100,000 updates, docs/gpt1.md); a YAML of PretrainConfig sets its mesh "
        "(`mesh: {data: -1}` is data parallel over every device; `fsdp`/`tensor` shard further), `keep_steps` for the "
        "zero-shot curve, and `data.tokenizer` to use OpenAI's vocabulary. `--budget paper` is the paper's fine-tuning: "
        "lr 6.25e-5 (no grid), every training and dev example, 3 seeds. Every stage runs on whatever devices JAX "
        "finds; the fine-tuning runs go one after another in the pipeline's process, each over all of them.",
        "",
        "Cost scales with tokens x parameters: training is about 6 FLOPs per parameter per token (plus attention), so "
        "the preset's 100,000 x 64 x 512 = 3.3B tokens are about 2.3e18 FLOPs, some 1.6 hours of one H100 at 40% of "
        "its bf16 peak; `gpt1-jax pretrain --config gpt1 --dry-run --simulate-devices N` sizes memory and FLOPs per "
        "device for a mesh before a pod is booked, and `gpt1-jax bench` measures the step. Fine-tuning on every "
        "example (SST-2: 67k) is about 6,300 updates of 32 per run, 45 runs; zero-shot on every example is forward "
        "passes only.",
        "",
    ])
    paper.save_text("README.md", text)


def rebuild_results(scratch: Path, recipe: Path = RECIPE, budget: str = "laptop") -> None:
    """A committed pipeline's results (settings.COMMITTED) again from what it keeps (runs/, pretrain.json,
    zeroshot.json, timings.json), training nothing: Table 5, its more seeds, lr_grid.json, Figure 2's plots and
    README.md. A cell whose runs are not all recorded yet stays empty, as the pipeline stopped there writes it.
    `scratch`: an empty folder for the run workdirs the kept records are put back into. pretrain_loss.png is the
    pre-training run's own plot (a copy), so it is not rebuilt."""
    paper = Paper(out=scratch, budget_name=budget, pretrain_config=str(recipe), tasks=TASKS,
                  layer_tasks=BUDGETS[budget].layer_tasks, train=False, train_tasks=())
    assert paper.committed, (recipe, budget)
    table5.table5_stage(paper)
    more_seeds_stage(paper)
    if (paper.results_dir / "layers.json").is_file():  # the first release ran Figure 2 (left); the 4ep one has not
        layers.layers_stage(paper)
    if (scores := paper.load_json("zeroshot.json")) is not None:  # the long release kept no checkpoints to score
        zeroshot.plot(scores, paper.results_dir / "zeroshot.png")
    write_readme(paper)
