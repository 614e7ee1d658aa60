"""Per-layer statistics in the sharded train step (gpt1_jax/layer_stats.py): over data=2, fsdp=2, tensor=2 on 8 fake
devices they equal a float64 NumPy recomputation, and the step's update is the same with or without them, under the
suite's loop emitters and again, in a process of its own, under the fusion emitters users run (the grouping and the
plot: tests/unit/test_layer_stats.py)."""

import dataclasses

import jax
import numpy as np
import pytest

from gpt1_jax.config import OptimConfig, model_preset
from gpt1_jax.step import lm_functions, make_trainer
from tests.support.layer_stats import numpy_stats


@pytest.mark.fusion_emitters
def test_in_the_sharded_step_they_match_numpy_and_leave_the_update_alone():
    """Scanned blocks over data=2, fsdp=2, tensor=2: the norms are global reductions of sharded arrays."""
    from gpt1_jax.config import parse_mesh

    model = dataclasses.replace(model_preset("tiny"), n_layers=3, scan_layers=True, vocab_size=96, n_positions=16,
                                d_model=32, n_heads=2, d_mlp=64)
    init_fn, loss_fn = lm_functions(model)
    optim = OptimConfig(name="adamw", lr=1e-2, warmup_steps=0, total_steps=10)
    trainer = make_trainer(init_fn, loss_fn, optim, parse_mesh("data=2,fsdp=2,tensor=2"), devices=jax.devices()[:8])
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.vocab_size, (8, 17)).astype(np.int32)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}

    before = jax.device_get(trainer.init().params)
    plain, _ = trainer.step(trainer.init(), trainer.put_batch(batch))
    watched, metrics = trainer.step(trainer.init(), trainer.put_batch(batch), stats=True)
    after = jax.device_get(watched.params)
    for a, b in zip(jax.tree_util.tree_leaves(jax.device_get(plain.params)), jax.tree_util.tree_leaves(after)):
        np.testing.assert_array_equal(a, b)  # the statistics observe the step, never change it

    _, grads, _ = trainer.grads(trainer.init().params, trainer.put_batch(batch), 0)
    updates = jax.tree.map(lambda new, old: np.asarray(new, np.float64) - np.asarray(old, np.float64), after, before)
    want = numpy_stats(before, jax.device_get(grads), updates, model.n_layers)
    got = {k: float(v) for k, v in jax.device_get(metrics).items() if k.startswith("stats/")}
    assert set(got) == set(want) and len(want) == 4 * (2 + 3 * model.n_layers)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=2e-4, abs=1e-7), k
