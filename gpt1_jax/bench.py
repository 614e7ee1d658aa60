"""`gpt1-jax bench`: time the sharded train step (fwd + bwd + optimizer update) and print one JSON line.

Fixed seeded token data, so `losses` are comparable between runs and implementations. Compilation is
timed on its own (lower + compile for abstract inputs); the timed steps run the compiled executable.
jax is imported inside `main` only: `--simulate-devices` must set XLA_FLAGS before jax starts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="tiny", help="model preset (tiny, small, gpt1) or a YAML file")
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences per step)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: n_positions)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps after compilation")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="compute dtype (params and optimizer state stay in param_dtype)")
    parser.add_argument("--mesh", default="", help="e.g. data=2,fsdp=2,tensor=2 (default: data over all devices)")
    parser.add_argument("--accum-steps", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--simulate-devices", type=int, default=None, metavar="N", help="N fake CPU devices")
    parser.add_argument("--compile-only", action="store_true", help="compile, report compile_s and memory, do not run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="ModelConfig override")
    parser.add_argument("--optim", default="gpt1_adam", help="optimizer name (gpt1_adam, adamw, ...)")
    parser.add_argument("--lr", type=float, default=1e-4, help="constant learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s for MFU (default: table or measured)")


def _positive(name: str, value: int) -> None:
    from gpt1_jax.config import ConfigError

    if value < 1:
        raise ConfigError(f"--{name} must be >= 1, got {value}")


def main(args: argparse.Namespace) -> int:
    from gpt1_jax.config import ConfigError, apply_overrides, resolve_model_config

    config = apply_overrides(resolve_model_config(args.config), args.set)
    if args.dtype:
        config = apply_overrides(config, [f"dtype={args.dtype}"])
    seq = args.seq or config.n_positions
    for name in ("batch", "steps", "accum_steps"):
        _positive(name.replace("_", "-"), getattr(args, name))
    _positive("seq", seq)
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {args.warmup}")
    if seq > config.n_positions:
        raise ConfigError(f"--seq {seq} exceeds the model's n_positions={config.n_positions}")

    import jax
    import numpy as np

    from gpt1_jax import flops, sharding
    from gpt1_jax.optim import OptimConfig
    from gpt1_jax.step import Trainer, lm_batch, state_bytes

    mesh_cfg = sharding.parse_mesh(args.mesh)
    mesh = sharding.make_mesh(mesh_cfg)
    divisor = sharding.batch_divisor(mesh) * args.accum_steps
    if args.batch % divisor:
        raise ConfigError(f"--batch {args.batch} is not divisible by data x fsdp x accum-steps = {divisor}")
    optim = OptimConfig(name=args.optim, lr=args.lr, schedule="constant", warmup_steps=0)
    trainer = Trainer(config, optim, mesh, sharding.logical_rules(mesh_cfg.rules), args.accum_steps, args.seed)

    t0 = time.perf_counter()
    compiled = trainer.lower((args.batch, seq)).compile()
    compile_s = time.perf_counter() - t0

    state = trainer.init()
    total_bytes, per_device_bytes = state_bytes(state)
    fpt = flops.flops_per_token(config, seq)
    result = {
        "config": args.config,
        "num_params": config.num_params(),
        "dtype": config.dtype,
        "param_dtype": config.param_dtype,
        "batch": args.batch,
        "seq": seq,
        "accum_steps": args.accum_steps,
        "mesh": dict(mesh.shape),
        "devices": mesh.size,
        "platform": jax.devices()[0].platform,
        "compile_s": round(compile_s, 3),
        "flops_per_token": fpt,
        "state_bytes_total": total_bytes,
        "state_bytes_per_device": per_device_bytes,
    }
    memory = compiled.memory_analysis()
    if memory is not None:
        result["temp_bytes_per_device"] = int(getattr(memory, "temp_size_in_bytes", 0))
    if not args.compile_only:
        rng = np.random.default_rng(args.seed)
        n = args.warmup + args.steps
        windows = rng.integers(0, config.vocab_size, (n, args.batch, seq + 1), dtype=np.int32)
        batches = [trainer.put_batch(lm_batch(windows[i])) for i in range(n)]
        times, losses = [], []
        for i, batch in enumerate(batches):
            t0 = time.perf_counter()
            state, metrics = compiled(state, batch)
            loss = float(metrics["loss"])  # blocks until the step is done
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
                losses.append(round(loss, 6))
        step_s = statistics.median(times)
        peak, peak_source = flops.peak_flops(config.dtype, args.peak_flops)
        tokens_per_s = args.batch * seq / step_s
        result.update(
            step_s_median=round(step_s, 4),
            step_s=[round(t, 4) for t in times],
            tokens_per_s=round(tokens_per_s, 2),
            model_flops_per_s=round(tokens_per_s * fpt, 1),
            peak_flops=peak,
            peak_source=peak_source,
            mfu=round(flops.mfu(tokens_per_s, fpt, peak), 4),
            losses=losses,
        )
    print(json.dumps(result), flush=True)
    return 0
