"""What a Table 5 budget costs before any of it runs: each task's padded tokens per fine-tuning run (training,
and the dev and held-out passes at every epoch's end), counted with the library's own encoding and batching
(gpt1_jax/data/tasks.py) and the release's tokenizer and context, turned into minutes at a measured throughput
(per token and per step), and the plan: runs x minutes per arm. From the repository root:

    python -m experiments.paper.cost --budget full_sets --data-dir ../shared/data/glue

Prints the tables as markdown at the end (experiments/paper/README.md keeps them); --json FILE keeps the numbers.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("cost.py: error: run it from the repository root as: "
          "python -m experiments.paper.cost ...", file=sys.stderr)
    sys.exit(2)

import json
from pathlib import Path

import numpy as np

from experiments import harness
from experiments.paper.settings import ARMS, BUDGETS, PAPER_DIR, TASKS, Budget
from gpt1_jax.arguments import number_at_least
from gpt1_jax.data.tasks import bucket_len, encode_task, epoch_order, eval_order, example_lengths, make_task
from gpt1_jax.files import atomic_write_text, folder_problem
from gpt1_jax.tokenizer import GPT1Tokenizer
from gpt1_jax.weights import load_pretrained

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it


def padded_tokens(seqs: list[list[list[int]]], batch_size: int, n_ctx: int, order: np.ndarray) -> int:
    """Tokens the model computes over for `seqs` batched in `order`: every batch is `batch_size` rows (filler
    included) of each example's sequences, padded to the batch's bucketed length (tasks.make_batch)."""
    total = 0
    for first in range(0, len(order), batch_size):
        rows = [seqs[i] for i in order[first: first + batch_size]]
        total += batch_size * len(rows[0]) * bucket_len(max(len(s) for ex in rows for s in ex), n_ctx)
    return total


def task_cost(budget: Budget, task_name: str, tok, n_ctx: int, data_dir: str | None) -> dict:
    """One run's padded tokens of `task_name` under `budget` (seed 0's subset and order)."""
    config = budget.finetune_config(task_name, budget.lrs[0], budget.seeds[0])
    task = make_task(config, data_dir)
    splits = encode_task(task, config, tok, n_ctx, predict_test=False)
    n = len(splits.train.seqs)
    lengths = example_lengths(splits.train)
    train = sum(padded_tokens(splits.train.seqs, budget.batch_size, n_ctx,
                              epoch_order(lengths, budget.batch_size, config.seed, epoch, config.group_by_length))
                for epoch in range(1, budget.epochs + 1))
    looked = list(splits.dev.values()) + ([splits.holdout] if splits.holdout is not None else [])
    evaluated = budget.epochs * sum(padded_tokens(e.seqs, budget.batch_size, n_ctx, eval_order(e)) for e in looked)
    return {"train_examples": n, "held_out": 0 if splits.holdout is None else len(splits.holdout.seqs),
            "train_tokens": train, "train_steps": budget.epochs * -(-n // budget.batch_size), "eval_tokens": evaluated}


def runs_per_arm(budget: Budget, arm: str, extensions: int) -> int:
    """Seed 0 over the grid and `extensions` added lrs, then the arm's other seeds at the chosen lr."""
    return len(budget.lrs) + extensions + len(budget.seeds_of(arm)) - 1


def _json_target_problem(path: Path) -> str | None:
    if path.is_dir():
        return "is a folder; give a file"
    if problem := folder_problem(path):
        return problem
    if path.exists() and path.suffix != ".json":  # `--json README.md` replaced the README with numbers
        return "exists and is not a .json file: it would be replaced; give a .json file"
    return None


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--budget", choices=sorted(BUDGETS), default="full_sets")
    p.add_argument("--data-dir", default=None, help="GLUE's TSV distribution (default: tensorflow-datasets)")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--release", default=str(PAPER_DIR / "release"), help="the model whose tokenizer and context count")
    # Fitted 2026-11-27 on the AVX2 kind (AMD EPYC, avx avx2 fma sha_ni; 2 CPU devices, huge pages, warm compile
    # cache), alone: one epoch of SST-2 (3,000 examples) and of RTE (2,490), each with random and with
    # length-grouped batches; seconds = tokens / 2,297 + 0.1375 x steps (+ dev at 3x), within 8% of all four.
    p.add_argument("--train-tokens-per-s", type=number_at_least(0.0, above=True), default=2300.0,
                   help="training throughput of a fine-tuning run, per padded token (default: 2,300, fitted on "
                        "the AVX2 kind)")
    p.add_argument("--step-s", type=number_at_least(0.0), default=0.14,
                   help="seconds per training step besides its tokens (default: 0.14, fitted with the above)")
    p.add_argument("--eval-tokens-per-s", type=number_at_least(0.0, above=True), default=6900.0,
                   help="forward-only throughput (default: 3x)")
    p.add_argument("--startup-s", type=number_at_least(0.0), default=25.0, help="per run: data, init and compilation")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the numbers there")
    args = p.parse_args(argv)
    if args.json and (problem := _json_target_problem(Path(args.json))):  # found after the work, as a temp file's name
        p.error(f"--json {args.json}: {problem}")
    budget = BUDGETS[args.budget]
    n_ctx = load_pretrained(args.release)[0].n_positions
    tok = GPT1Tokenizer.load(f"{args.release}/tokenizer.json")
    tasks = {}
    for t in args.tasks.split(","):
        c = task_cost(budget, t, tok, n_ctx, args.data_dir)
        c["minutes"] = (args.startup_s + c["train_tokens"] / args.train_tokens_per_s + c["train_steps"] * args.step_s
                        + c["eval_tokens"] / args.eval_tokens_per_s) / 60
        tasks[t] = c
        print(f"{t}: {c}", file=sys.stderr)
    round_min = sum(c["minutes"] for c in tasks.values())  # one (arm, lr, seed) over every task
    plan = {arm: {ext: runs_per_arm(budget, arm, ext) for ext in (0, budget.max_extensions)} for arm in ARMS}
    lines = ["| task | training examples (held out) | padded tokens per run: training, evaluation | minutes per run |",
             "|---|---|---|---|"]
    lines += [f"| {t} | {c['train_examples']:,} ({c['held_out']:,}) | {c['train_tokens'] / 1e6:.2f}M, "
              f"{c['eval_tokens'] / 1e6:.2f}M | {c['minutes']:.0f} |" for t, c in tasks.items()]
    lines += ["", "| arm | runs per task (no extension .. all extensions) | hours |", "|---|---|---|"]
    for arm in ARMS:
        lo, hi = plan[arm][0], plan[arm][budget.max_extensions]
        lines.append(f"| {arm} | {lo} .. {hi} | {lo * round_min / 60:.1f} .. {hi * round_min / 60:.1f} |")
    total = [sum(plan[a][e] for a in ARMS) * round_min / 60 for e in (0, budget.max_extensions)]
    lines.append(f"| **all** | | **{total[0]:.1f} .. {total[1]:.1f}** |")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(
            {"budget": args.budget, "tasks": tasks, "runs": plan, "hours": total,
             "rates": {"train_tokens_per_s": args.train_tokens_per_s, "step_s": args.step_s,
                       "eval_tokens_per_s": args.eval_tokens_per_s,
                       "startup_s": args.startup_s}}, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":  # a bad --tasks, --data-dir or --release, or GLUE out of reach: one line, not a traceback
    harness.leave(harness.main(main, PROG))
