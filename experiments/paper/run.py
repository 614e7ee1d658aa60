"""The paper at laptop scale, one command: pre-train, release, zero-shot curves, Table 5, Figure 2 (left).

    python -m experiments.paper.run --corpus CORPUS --data-dir GLUE_DIR --race RACE_TAR
    python -m experiments.paper.run --quick --corpus default --data-dir GLUE_DIR --race RACE_TAR --out /tmp/paper

Stages, in order (--stages picks some): pretrain (OUT/pretrain), release (the final parameters + tokenizer as a
HF folder), zeroshot (Figure 2 right), table5 (ablations), more_seeds (seeds added to Table 5's pairs after it
was read, where the budget has them), layers (Figure 2 left), diagnosis (full vs no_pretrain on more
fine-tuning data). Everything resumes: the
pre-training job from its checkpoint, every fine-tuning run from its record (experiments/harness.py), the zero-shot stage from the
checkpoints it has scored; run the same command again after a stop. The laptop-scale run writes the committed
experiments/paper/release/ and experiments/paper/results/; --quick (or another recipe or budget) writes
OUT/release/ and OUT/results/. Details and budget: experiments/paper/README.md.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("run.py: error: run it from the repository root as: "
          "python -m experiments.paper.run ...", file=sys.stderr)
    sys.exit(2)

import argparse
import dataclasses
import time
from pathlib import Path

from experiments import harness
from experiments.glue.common import missing_path
from experiments.paper.diagnosis import diagnosis_stage
from experiments.paper.layers import layers_stage
from experiments.paper.more_seeds import more_seeds_stage
from experiments.paper.release import pretrain_config, pretrain_stage, pretraining_finished, release_stage
from experiments.paper.report import write_readme
from experiments.paper.settings import BUDGETS, OUT_ENTRIES, RECIPE, STAGES, TASKS, Paper
from experiments.paper.table5 import table5_stage
from experiments.paper.zeroshot import scored_without_checkpoints, zeroshot_stage
from gpt1_jax import compile_cache
from gpt1_jax.data.race import check_archive
from gpt1_jax.data.sources import open_source
from gpt1_jax.errors import ConfigError, GPT1JaxError
from gpt1_jax.files import some_names
from gpt1_jax.workdir import LOCK_FILE

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

PER_RUN_TIMES = ("table5", "more_seeds", "layers", "diagnosis")  # their fine-tuning runs add their own time as each finishes (table5.run_all)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=None, help="pre-training text: a .txt/.txt.gz file or glob, `default` (the "
                   "corpus embedded in the package) or tfds:NAME; needed while pre-training is unfinished "
                   "(--quick: default)")
    p.add_argument("--data-dir", default=None, help="GLUE's official TSV distribution (<dir>/<Task>/{train,dev}.tsv; "
                   "default: tensorflow-datasets downloads GLUE)")
    p.add_argument("--race", default=None, help="RACE's race.tar.gz or its unpacked folder (the zeroshot stage)")
    p.add_argument("--out", default="runs/paper", help="run workdirs (default: runs/paper)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)} (default: all)")
    p.add_argument("--quick", action="store_true", help="tiny model, 20 updates, 16 examples, one lr and seed: the "
                   "whole pipeline in minutes (a smoke test; writes under OUT only)")
    p.add_argument("--budget", choices=sorted(BUDGETS), default=None,
                   help="laptop (default: the first release's Table 5), full_sets (every training example, "
                   "lr and epoch chosen on a held-out 10%%, 5 paired seeds), paper (the paper's fine-tuning), "
                   "quick (= --quick)")
    p.add_argument("--pretrain-config", default=str(RECIPE), metavar="PRESET|YAML",
                   help="the pre-training config (default: experiments/paper/pretrain.yaml)")
    p.add_argument("--tasks", default=",".join(TASKS),
                   help=f"Table 5's tasks to train (default: {','.join(TASKS)}); on a committed pipeline its tables "
                   "still cover every task, the others read from their kept records")
    p.add_argument("--layer-tasks", default=None, help="Figure 2 (left)'s tasks (default: sst2,stsb)")
    p.add_argument("--tfds-dir", default=None, help="where tensorflow-datasets prepares GLUE (default: "
                   "~/.cache/gpt1_jax/tfds)")
    harness.cpu_devices_flag(p)
    args = p.parse_args(argv)
    if args.quick and args.budget not in (None, "quick"):
        p.error("--quick is --budget quick")
    args.budget = "quick" if args.quick else args.budget or "laptop"
    args.stages = [s for s in args.stages.split(",") if s]
    if not args.stages:  # ran nothing, exit 0
        p.error(f"--stages names no stage; stages: {', '.join(STAGES)}")
    tasks = args.tasks.split(",") + (args.layer_tasks.split(",") if args.layer_tasks else [])
    bad = [s for s in args.stages if s not in STAGES] + [t for t in tasks if t not in TASKS]
    if bad:
        p.error(f"unknown stage(s) or task(s) {bad}; stages: {', '.join(STAGES)}; tasks: {', '.join(TASKS)}")
    for flag, path in (("--data-dir", args.data_dir), ("--race", args.race)):
        if missing := missing_path(flag, path):
            p.exit(2, f"{p.prog}: error: {missing}\n")
    if "zeroshot" in args.stages and not args.race:
        p.exit(2, f"{p.prog}: error: the zeroshot stage needs --race (RACE's race.tar.gz)\n")
    return args


def paper_of(args: argparse.Namespace) -> Paper:
    """The invocation; on a committed pipeline, --tasks picks what trains and the tables keep every task."""
    budget, tasks = BUDGETS[args.budget], tuple(args.tasks.split(","))
    paper = Paper(out=Path(args.out), budget_name=args.budget, pretrain_config=args.pretrain_config, tasks=tasks,
                  layer_tasks=tuple(args.layer_tasks.split(",")) if args.layer_tasks else budget.layer_tasks,
                  corpus=args.corpus or ("default" if args.budget == "quick" else None), data_dir=args.data_dir,
                  race=args.race, tfds_dir=args.tfds_dir)
    if paper.committed and set(tasks) != set(TASKS):
        paper = dataclasses.replace(paper, tasks=TASKS, train_tasks=tasks)
    return paper


def check_inputs(paper: Paper, stages: list[str]) -> None:
    """What a later stage needs that an earlier one will not make: fail now, not after an hour of training; and an
    --out that holds something else than a pipeline (a home folder, a checkout), which its runs would land beside."""
    held = sorted(p.name for p in paper.out.iterdir() if not p.name.startswith(".") and p.name != LOCK_FILE) \
        if paper.out.is_dir() else []  # a lock: a pipeline killed before its first run folder, or one running now
    if held and not OUT_ENTRIES & set(held):
        raise ConfigError(f"--out {paper.out} is not empty and holds no paper pipeline ({some_names(held)}): choose a "
                          "new or empty folder")
    pretrain_config(paper)  # a --pretrain-config that does not resolve, first: it was named after the --corpus check
    if "pretrain" in stages and not pretraining_finished(paper):  # a finished one reads no corpus: none is needed
        if paper.corpus is None:
            raise ConfigError("pre-training is not finished: pass --corpus (the recipe's corpus is "
                              "english_mixed.txt.gz; `default` trains on the corpus embedded in the package)")
        try:
            open_source(paper.corpus)  # parses the spec and checks that its files or dataset can be opened
        except (OSError, GPT1JaxError, ValueError) as e:
            raise ConfigError(f"--corpus: {e}") from None
    needs_release = {"table5", "more_seeds", "layers", "diagnosis"} & set(stages)
    if needs_release and "release" not in stages and not (paper.release_dir / "config.json").is_file():
        raise FileNotFoundError(f"{paper.release_dir}: no release to fine-tune (run the release stage)")
    if "diagnosis" in stages and "table5" not in stages and not (paper.results_dir / "lr_grid.json").is_file():
        raise FileNotFoundError(f"{paper.results_dir / 'lr_grid.json'}: no Table 5 learning rates for the diagnosis "
                                "stage (run the table5 stage)")
    if "zeroshot" in stages and paper.race:
        check_archive(paper.race)
    if "zeroshot" in stages and "pretrain" not in stages and not (paper.pretrain_dir / "checkpoints").is_dir() \
            and not scored_without_checkpoints(paper):
        raise FileNotFoundError(f"{paper.pretrain_dir}: no pre-training checkpoints for the zeroshot stage")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness.split_cpu(args.cpu_devices)
    paper = paper_of(args)
    run = {"pretrain": pretrain_stage, "release": release_stage, "zeroshot": zeroshot_stage,
           "table5": table5_stage, "more_seeds": more_seeds_stage, "layers": layers_stage, "diagnosis": diagnosis_stage}
    check_inputs(paper, args.stages)
    compile_cache.enable()  # the fine-tuning runs share their compilations, across sessions too
    with harness.one_sweep(paper.out, PROG):
        for stage in [s for s in STAGES if s in args.stages]:
            print(f"== {stage}", file=sys.stderr)
            t0 = time.perf_counter()
            ran = run[stage](paper)  # True: it did work; False: done before; None: stopped at a checkpoint
            if ran is not False and stage not in PER_RUN_TIMES:  # a stopped session's time counts too
                paper.add_time(stage, time.perf_counter() - t0)
            if ran is None:
                print(f"{stage}: stopped at a checkpoint (SIGTERM); the same command resumes", file=sys.stderr)
                break
        write_readme(paper)  # a stopped pipeline's too: what its stages have found so far
    print(f"results: {paper.results_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    harness.leave(harness.main(main, PROG, trains=True))
