"""`gpt1-jax VERB ...`: the command line only wires modules together.

Each verb lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`. Nothing
here imports jax at module level: `--simulate-devices` must set XLA_FLAGS before jax initialises.
User errors (bad config, bad checkpoint, bad input) end as one line on stderr and exit status 2;
GPT1_JAX_DEBUG=1 shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from gpt1_jax import distributed

VERBS = {
    "pretrain": ("gpt1_jax.pretrain", "pre-train GPT-1 on a text corpus (resumable; the main job)"),
    "evaluate": ("gpt1_jax.evaluate", "LM loss and perplexity of a pre-training checkpoint on a text source"),
    "sample": ("gpt1_jax.sample", "generate text from a pre-training checkpoint"),
    "convert": ("gpt1_jax.convert", "convert checkpoints between the original release, HF and gpt1-jax"),
    "bench": ("gpt1_jax.bench", "time the sharded train step and print one JSON line"),
    "finetune": ("gpt1_jax.finetune", "fine-tune on a GLUE task or RACE with the auxiliary LM loss; results.json + predictions"),
}


def simulate_devices(n: int | None) -> None:
    """N fake CPU devices, for trying meshes on one machine; only possible before jax starts."""
    if not n:
        return
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def user_errors() -> tuple[type[BaseException], ...]:
    from gpt1_jax.config import ConfigError
    from gpt1_jax.weights import CheckpointFormatError

    from gpt1_jax.errors import GPT1JaxError

    return (GPT1JaxError, ConfigError, CheckpointFormatError, FileNotFoundError, FileExistsError, ValueError)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpt1-jax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, (module_name, help_text) in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        importlib.import_module(module_name).add_arguments(p)
        distributed.add_arguments(p)
    args = parser.parse_args(argv)
    simulate_devices(getattr(args, "simulate_devices", None))
    try:
        # Multi-process start-up (flags, GPT1_* env or a cluster JAX detects); nothing on a plain machine.
        distributed.initialize(args)
        status = importlib.import_module(args._module).main(args) or 0
    except user_errors() as e:
        if os.environ.get("GPT1_JAX_DEBUG"):
            raise
        print(f"gpt1-jax {args.verb}: error: {e}", file=sys.stderr)
        from gpt1_jax.errors import DivergenceError

        status = 1 if isinstance(e, DivergenceError) else 2
    return distributed.exit_status(status)  # multi-process: a failing process leaves at once


if __name__ == "__main__":
    sys.exit(main())
