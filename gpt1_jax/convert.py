"""`gpt1-jax convert SRC DST --to {hf,jax}`: any checkpoint or run workdir load_pretrained reads -> HF or
ours, with SRC's tokenizer (`gpt1_jax.weights.convert`)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="an original release, HF or gpt1-jax checkpoint directory, or a run workdir")
    p.add_argument("dst", help="output directory (must not exist or be empty, unless --overwrite)")
    p.add_argument("--to", choices=("hf", "jax"), default="hf", help="output format (default: hf)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty DST")
    p.add_argument("--step", type=int, default=None, help="checkpoint step of a run workdir (default: the latest)")
    p.add_argument("--n-heads", type=int, default=None,
                   help="head count of an original release (its files do not record it; default: d_model / 64)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a model config field: run-time ones (dtype, scan_layers, ...) anywhere, any on an original release")


def main(args: argparse.Namespace) -> int:
    from gpt1_jax.weights import convert

    overrides = ([f"n_heads={args.n_heads}"] if args.n_heads is not None else []) + list(args.set)
    config, out = convert(args.src, args.dst, to=args.to, overwrite=args.overwrite, overrides=overrides, step=args.step)
    tokenizer = "with its tokenizer" if (out / "tokenizer.json").is_file() else "without a tokenizer (none in SRC)"
    print(f"wrote {args.to} checkpoint of {config.num_params():,} parameters ({config.n_layers} layers x "
          f"{config.d_model}) {tokenizer} to {out}")
    return 0
