"""What checkpoint digests cost at the 117M shape: a `gpt1`-preset TrainState (params + Adam state,
~1.4 GB, random values) saved and restored by `Checkpointer` with and without its digests. Prints one
JSON line: medians over `--rounds`, the two variants alternating in order from round to round.

  python -m experiments.bench.checkpoint_integrity --dir /tmp/ckpt-bench --rounds 3

save_blocking_s: until save() returns (training resumes); save_total_s: until the save is on disk,
digests included (they are computed in orbax's save thread, so they lengthen save_total_s, not
save_blocking_s). restore_s includes the check of the digests that a resume does first; the files are
then in the page cache (just written), so that measures hashing more than the disk. record_s and
verify_s time `integrity.record` / `integrity.verify` alone on the saved folder.
"""

from __future__ import annotations

import sys

if not __package__:  # run by its path: the imports below need `python -m`, from the repository root
    print("checkpoint_integrity.py: error: run it from the repository root as: "
          "python -m experiments.bench.checkpoint_integrity ...", file=sys.stderr)
    sys.exit(2)

import json
import os
import shutil
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from experiments import harness
from gpt1_jax import integrity
from gpt1_jax.checkpoint import Checkpointer
from gpt1_jax.arguments import at_least
from gpt1_jax.config import MeshConfig, OptimConfig, model_preset
from gpt1_jax.flops import cpu_flags
from gpt1_jax.step import lm_trainer

PROG = harness.prog(__spec__.name)  # in --help and in every message: the command that runs it


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = harness.parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="a new or empty scratch folder (removed afterwards)")
    parser.add_argument("--rounds", type=at_least(1), default=3)
    args = parser.parse_args()
    root = Path(args.dir)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):  # it is emptied before every save
        parser.exit(2, f"{parser.prog}: error: --dir {root} is not a new or empty folder: the benchmark deletes "
                       "what it holds\n")
    config = model_preset("gpt1")
    trainer = lm_trainer(config, OptimConfig(total_steps=10, warmup_steps=1), MeshConfig())
    # Random values everywhere, as after some training: a fresh Adam state is zeros, which compress to nothing.
    leaves, tree = jax.tree.flatten(trainer.init())
    keys = jax.random.split(jax.random.key(0), len(leaves))
    state = jax.block_until_ready(jax.tree.unflatten(tree, [
        jax.random.normal(k, x.shape, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
        for k, x in zip(keys, leaves)]))
    abstract = trainer.abstract_state_sharded()
    record, verify = integrity.record, integrity.verify
    results: dict[str, list[float]] = {}

    def measure(digests: bool) -> None:
        tag = "with_digests" if digests else "without_digests"
        integrity.record = record if digests else (lambda folder: None)
        integrity.verify = verify if digests else (lambda folder: None)
        shutil.rmtree(root, ignore_errors=True)
        ckpt = Checkpointer(root)
        blocking = timed(lambda: ckpt.save(1, state, {"batches": {}}, config))
        total = blocking + timed(ckpt.wait)
        ckpt.close()
        fresh = Checkpointer(root)  # nothing verified yet, as at a resume
        restore = timed(lambda: jax.block_until_ready(fresh.restore(abstract, 1)[0]))
        fresh.close()
        for name, value in (("save_blocking_s", blocking), ("save_total_s", total), ("restore_s", restore)):
            results.setdefault(f"{name}_{tag}", []).append(value)
        if digests:
            results.setdefault("record_s", []).append(timed(lambda: record(root / "1")))
            results.setdefault("verify_s", []).append(timed(lambda: verify(root / "1")))

    for r in range(args.rounds):
        for digests in ((True, False) if r % 2 else (False, True)):
            measure(digests)
    files = sum(p.stat().st_size for p in (root / "1").rglob("*") if p.is_file())
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({
        "model": "gpt1 preset (117M) + Adam state, random values",
        "state_bytes": sum(x.nbytes for x in jax.tree.leaves(state)), "checkpoint_file_bytes": files,
        "rounds": args.rounds, **{k: round(statistics.median(v), 3) for k, v in results.items()},
        "all_rounds": {k: [round(x, 3) for x in v] for k, v in results.items()},
        "cpu_flags": cpu_flags(), "cpu_count": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
        "jax_backend": jax.default_backend(),
    }))


if __name__ == "__main__":
    main()
