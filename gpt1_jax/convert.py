"""`gpt1-jax convert SRC DST --to {hf,jax}`: any checkpoint format load_pretrained reads -> HF or ours."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="an original release, HF or gpt1-jax checkpoint directory")
    p.add_argument("dst", help="output directory (must not exist or be empty, unless --overwrite)")
    p.add_argument("--to", choices=("hf", "jax"), default="hf", help="output format (default: hf)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty DST")


def main(args: argparse.Namespace) -> int:
    from gpt1_jax.weights import load_pretrained, save_jax, save_pretrained

    config, params = load_pretrained(args.src)
    save = save_pretrained if args.to == "hf" else save_jax
    out = save(config, params, args.dst, overwrite=args.overwrite)
    n = config.num_params()
    print(f"wrote {args.to} checkpoint of {n:,} parameters ({config.n_layers} layers x {config.d_model}) to {out}")
    return 0
