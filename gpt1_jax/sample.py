"""`gpt1-jax sample --workdir DIR --prompt TEXT`: continuations from a pre-training run's latest checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True, help="a pre-training run directory")
    p.add_argument("--prompt", default="the", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--num-samples", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")


def main(args: argparse.Namespace) -> int:
    from gpt1_jax.generate import sample
    from gpt1_jax.pretrain import load_run
    from gpt1_jax.tokenizer import GPT1Tokenizer

    workdir = Path(args.workdir)
    config, _, params, step = load_run(workdir, args.step)
    tokenizer = GPT1Tokenizer.load(workdir / "tokenizer.json")
    prompt = tokenizer.encode(args.prompt)
    outputs = sample(config.model, params, prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                     top_k=args.top_k, seed=args.seed, num_samples=args.num_samples)
    print(f"# {workdir} step {step}, temperature {args.temperature}, top-k {args.top_k}")
    for ids in outputs:
        print(f"{args.prompt} >> {tokenizer.decode(ids)}")
    return 0
