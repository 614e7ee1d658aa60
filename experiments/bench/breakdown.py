"""Where one train step's time goes: the step timed whole, then its parts timed alone or by difference.

    python -m experiments.bench.breakdown --config gpt1 --batch 2 --seq 512 [--dtype bfloat16]

Prints one JSON line per part, then a summary line. XLA fuses across these parts, so they are estimates
that need not add up exactly; "rest" is what the step spends beyond their sum (negative: overlap).

  matmuls            the model FLOPs (gpt1_jax/flops.py) at this CPU's measured matmul peak: a floor
  attention_core     scores, causal mask, softmax and the weighted sum, forward + backward, x layers,
                     without dropout (timed alone at the step's shapes)
  dropout            step with the config's dropout - step with every dropout rate 0 (random bits + masking)
  layer_norm         2 LayerNorms per layer, forward + backward (timed alone)
  optimizer_update   the optimizer's update and apply_updates on gradient-shaped arrays (timed alone)
  host_sync          waiting for each step's loss before dispatching the next, vs steps dispatched ahead
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("breakdown.py: error: run it from the repository root as: "
          "python -m experiments.bench.breakdown ...", file=sys.stderr)
    sys.exit(2)

import dataclasses
import json
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from experiments import harness
from gpt1_jax import flops, sizing
from gpt1_jax.attention import causal_attention
from gpt1_jax.config import PretrainConfig, resolve
from gpt1_jax.model import layer_norm
from gpt1_jax.bench import seeded_batches
from gpt1_jax.arguments import at_least

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it


def median_seconds(fn, *args, repeats: int = 5) -> float:
    """Median wall time of `fn(*args)` (compiled on a first, untimed call), blocking on its result."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_seconds(config, steps: int, block_each: bool = True) -> float:
    """Median seconds of `config`'s compiled train step on seeded tokens (as `gpt1-jax bench` runs it);
    `block_each=False`: the mean over `steps` dispatched back to back, blocking once at the end."""
    trainer = sizing.pretrain_trainer(config)
    batches = seeded_batches(trainer, config, steps + 1)
    state = trainer.init()
    state, metrics = trainer.step(state, batches[0])  # compile + warm up
    float(metrics["loss"])
    if not block_each:
        t0 = time.perf_counter()
        for batch in batches[1:]:
            state, metrics = trainer.step(state, batch)
        jax.block_until_ready((state, metrics))
        return (time.perf_counter() - t0) / steps
    times = []
    for batch in batches[1:]:
        t0 = time.perf_counter()
        state, metrics = trainer.step(state, batch)
        float(metrics["loss"])
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def attention_core_seconds(model, B: int, T: int) -> float:
    dtype = jnp.dtype(model.dtype)
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, g = (jax.random.normal(key, (B, T, model.n_heads, model.head_dim), dtype) for key in keys)

    def loss(q, k, v):
        return jnp.sum(causal_attention(q, k, v, impl="xla").astype(jnp.float32) * g)

    fwd_bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    return median_seconds(fwd_bwd, q, k, v) * model.n_layers


def layer_norm_seconds(model, B: int, T: int) -> float:
    ln = layer_norm(model, "ln")
    x = jax.random.normal(jax.random.key(0), (B, T, model.d_model), jnp.dtype(model.dtype))
    params = ln.init(jax.random.key(1), x)
    g = jax.random.normal(jax.random.key(2), x.shape, jnp.float32)
    fwd_bwd = jax.jit(jax.grad(lambda p, x: jnp.sum(ln.apply(p, x).astype(jnp.float32) * g), argnums=(0, 1)))
    return median_seconds(fwd_bwd, params, x) * 2 * model.n_layers


def optimizer_seconds(config) -> float:
    trainer = sizing.pretrain_trainer(config)
    state = trainer.init()
    grads = jax.tree.map(lambda p: p * 1e-3, state.params)

    @jax.jit
    def update(params, opt_state, grads):
        updates, opt_state = trainer.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return median_seconds(update, state.params, state.opt_state, grads)


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--config", default="gpt1")
    p.add_argument("--batch", type=at_least(1), default=2)
    p.add_argument("--seq", type=at_least(1), default=512)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--steps", type=at_least(1), default=4, help="timed steps per variant")
    p.add_argument("--set", action="append", default=[], help="config override (e.g. model.scan_layers=true)")
    args = p.parse_args(argv)
    overrides = [f"data.global_batch_size={args.batch}", f"data.seq_len={args.seq}", f"model.dtype={args.dtype}",
                 "optim.schedule=constant", "optim.warmup_steps=0", *args.set]
    config = resolve(PretrainConfig, args.config, overrides=overrides)
    model, B, T = config.model, args.batch, args.seq
    no_dropout = dataclasses.replace(config, model=dataclasses.replace(model, embd_dropout=0.0, attn_dropout=0.0,
                                                                       resid_dropout=0.0))
    step = step_seconds(config, args.steps)
    parts = {
        "matmuls": flops.flops_per_token(model, T) * B * T / flops.measured_matmul_peak(model.dtype),
        "attention_core": attention_core_seconds(model, B, T),
        "dropout": step - step_seconds(no_dropout, args.steps),
        "layer_norm": layer_norm_seconds(model, B, T),
        "optimizer_update": optimizer_seconds(config),
        "host_sync": step - step_seconds(config, args.steps, block_each=False),
    }
    parts["rest"] = step - sum(parts.values())
    common = {"config": args.config, "batch": B, "seq": T, "dtype": args.dtype, "overrides": args.set}
    for name, seconds in parts.items():
        print(json.dumps({**common, "part": name, "seconds": round(seconds, 4), "share": round(seconds / step, 3)}))
    print(json.dumps({**common, "summary": True, "step_s": round(step, 4), "tokens_per_s": round(B * T / step, 1),
                      "cpu_flags": flops.cpu_flags()}))
    return 0


if __name__ == "__main__":
    harness.leave(harness.main(main, PROG))
