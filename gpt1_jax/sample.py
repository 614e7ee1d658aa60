"""`gpt1-jax sample`: continuations from a run (`--workdir`, pre-training or fine-tuning) or any checkpoint
folder (`--init`: HF, OpenAI's original release, ours), with a KV cache. Both go through `load_pretrained`."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--workdir", help="a pre-training or fine-tuning run directory (its checkpoint and tokenizer)")
    where.add_argument("--init", help="a HF / original / gpt1-jax checkpoint folder")
    p.add_argument("--tokenizer", default=None, help="tokenizer .json or vocabulary folder (default: the one in "
                   "--workdir / --init)")
    p.add_argument("--prompt", default="the", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--num-samples", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step", type=int, default=None, help="checkpoint step of --workdir (default: the latest)")


def main(args: argparse.Namespace) -> int:
    from gpt1_jax.generate import sample
    from gpt1_jax.tokenizer import find_tokenizer
    from gpt1_jax.weights import load_pretrained

    source = args.workdir or args.init
    model_config, params = load_pretrained(source, step=args.step)
    tokenizer = find_tokenizer(args.tokenizer, source, model_vocab_size=model_config.vocab_size)
    if tokenizer is None:
        raise FileNotFoundError(f"{source}: no tokenizer in it; pass --tokenizer")
    prompt = tokenizer.encode(args.prompt)
    outputs = sample(model_config, params, prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                     top_k=args.top_k, seed=args.seed, num_samples=args.num_samples)
    step = f" step {args.step}" if args.step is not None else ""
    print(f"# {source}{step}, temperature {args.temperature}, top-k {args.top_k}")
    for ids in outputs:
        print(f"{args.prompt} >> {tokenizer.decode(ids)}")
    return 0
