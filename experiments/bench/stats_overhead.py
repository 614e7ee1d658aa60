"""What per-layer statistics (config `stats_every`, gpt1_jax/layer_stats.py) cost: the train step with and without
them, timed alternately on the same state and batch, and the overhead a run pays at `stats_every=N` (one step in
N is the slower one). Prints one JSON object per shape, with the CPU's flags.

    python -m experiments.bench.stats_overhead                  # small (16 x 128) and gpt1 117M (2 x 512), N=100
    python -m experiments.bench.stats_overhead --shapes small --every 10 --steps 5
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("stats_overhead.py: error: run it from the repository root as: "
          "python -m experiments.bench.stats_overhead ...", file=sys.stderr)
    sys.exit(2)

import dataclasses
import json
import statistics
import time

import jax
import numpy as np

from experiments import harness
from gpt1_jax import flops, sizing
from gpt1_jax.arguments import at_least
from gpt1_jax.config import PretrainConfig, preset
from gpt1_jax.step import lm_batch

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it

SHAPES = {"small": ("small", 16, 128), "gpt1_117M": ("gpt1", 2, 512)}


def measure(name: str, steps: int, every: int) -> dict:
    preset_name, batch, seq = SHAPES[name]
    config = preset(PretrainConfig, preset_name)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, global_batch_size=batch, seq_len=seq))
    trainer = sizing.pretrain_trainer(config)
    tokens = np.random.default_rng(0).integers(0, config.model.vocab_size, (batch, seq + 1), dtype=np.int32)
    state = trainer.init()
    times = {False: [], True: []}
    for i in range(steps + 1):  # the first round compiles both programs and is not timed
        for stats in (False, True):
            t0 = time.perf_counter()
            state, metrics = trainer.step(state, trainer.put_batch(lm_batch(tokens)), stats=stats)
            float(metrics["loss"])  # blocks until the step is done
            if i:
                times[stats].append(time.perf_counter() - t0)
    plain, watched = statistics.median(times[False]), statistics.median(times[True])
    return {"shape": name, "batch": batch, "seq": seq, "params_M": round(config.model.num_params() / 1e6, 1),
            "step_s": round(plain, 4), "step_with_stats_s": round(watched, 4),
            "stats_step_extra": round(watched / plain - 1, 4), "every": every,
            "run_overhead": round((watched - plain) / (every * plain), 5),
            "n_stats": sum(k.startswith("stats/") for k in metrics), "cpu_flags": flops.cpu_flags(),
            "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}"}


def main(argv=None) -> int:
    p = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--steps", type=at_least(1), default=5, help="timed steps of each kind (after one that compiles)")
    p.add_argument("--every", type=at_least(1), default=100, help="stats_every to report the run's overhead at")
    args = p.parse_args(argv)
    if unknown := [n for n in args.shapes.split(",") if n not in SHAPES]:
        p.error(f"unknown shape(s) {unknown}; shapes: {', '.join(SHAPES)}")
    for name in args.shapes.split(","):
        print(json.dumps(measure(name, args.steps, args.every)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
