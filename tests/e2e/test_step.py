"""The train step, compiled: gradient accumulation == one large batch, metrics, deterministic dropout on
resume, runs differing in lr and seed share one program, mixed precision keeps fp32 state, remat leaves
gradients unchanged, and the CPU's bf16 attention core runs with XLA's own flags."""

import dataclasses
import functools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpt1_jax import sharding as shd
from gpt1_jax.config import model_preset
from gpt1_jax.optim import OptimConfig, make_optimizer, make_schedule
from gpt1_jax.step import lm_batch, lm_functions, lm_trainer, train_step


TINY = model_preset("tiny")
ROOT = Path(__file__).resolve().parents[2]


NO_DROPOUT = dataclasses.replace(TINY, embd_dropout=0.0, attn_dropout=0.0, resid_dropout=0.0)


OPTIM = OptimConfig(lr=1e-3, schedule="warmup_linear", warmup_steps=2, total_steps=10)


WINDOWS = np.random.default_rng(0).integers(0, TINY.vocab_size, (16, 33), dtype=np.int32)


BATCH = lm_batch(WINDOWS)


def _mesh(spec="data=2,fsdp=2,tensor=2"):
    return shd.make_mesh(shd.parse_mesh(spec))


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / max(np.linalg.norm(np.asarray(b)), 1e-30))


# Tests share one (config, optimizer, mesh, batch signature) where they can: equal Trainers reuse
# compilations, which is most of this file's run time.
WEIGHTS = np.random.default_rng(2).integers(0, 2, BATCH["targets"].shape).astype(np.float32)  # uneven per micro-batch


def _reference(config=NO_DROPOUT):
    trainer = lm_trainer(config, OPTIM, _mesh())
    params = trainer.init(seed=3).params
    batch = trainer.put_batch({**BATCH, "weights": WEIGHTS})
    return trainer, params, batch


def test_grad_accumulation_equals_one_large_batch():
    big, params, batch = _reference()
    micro = lm_trainer(NO_DROPOUT, OPTIM, big.mesh, accum_steps=4)
    loss_1, grads_1, w_1 = big.grads(params, batch)
    loss_k, grads_k, w_k = micro.grads(params, batch)
    assert float(w_1) == float(w_k) == WEIGHTS.sum()
    assert abs(float(loss_k) - float(loss_1)) / float(loss_1) <= 1e-5
    errs = jax.tree.map(_rel, grads_k, grads_1)
    assert max(jax.tree.leaves(errs)) <= 1e-5, errs


def test_train_step_metrics_and_resume_determinism():
    # Dropout on: the key comes from (seed, step), so two runs from the same state agree exactly.
    trainer = lm_trainer(TINY, OPTIM, _mesh(), seed=7)
    batch = trainer.put_batch(BATCH)
    runs = []
    for _ in range(2):
        state, losses = trainer.init(seed=0), []
        for i in range(3):
            state, metrics = trainer.step(state, batch)
            losses.append(float(metrics["loss"]))
            assert float(metrics["lr"]) == pytest.approx(float(trainer.schedule(i)))
            assert np.isfinite(float(metrics["grad_norm"])) and float(metrics["grad_norm"]) > 0
        assert int(state.step) == 3
        runs.append(losses)
    assert runs[0] == runs[1]
    assert runs[0][0] > runs[0][2]  # lr warms up from 0: step 0 changes nothing, then the loss drops
    assert float(metrics["weight"]) == BATCH["targets"].size  # the summed weights: tokens, for the LM loss


@pytest.mark.fusion_emitters
def test_runs_differing_in_lr_and_seed_share_one_compiled_step_and_keep_their_own_numbers():
    # A sweep's runs (Table 5's lr grid and seeds) compile once: the lr and the dropout seed are inputs of the
    # programs. Each run still follows its own: its updates equal those of the step with both as constants.
    first = lm_trainer(TINY, OPTIM, _mesh(), seed=7)
    batch = first.put_batch(BATCH)
    first.step(first.init(seed=0), batch)
    other = lm_trainer(TINY, dataclasses.replace(OPTIM, lr=3e-3), first.mesh, seed=11)
    compiles = []
    listener = lambda event, secs, **kw: compiles.append(event) if event.startswith("/jax/core/compile/") else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        state = other.init(seed=0)
        for _ in range(3):
            state, metrics = other.step(state, batch)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert float(metrics["lr"]) == pytest.approx(float(other.schedule(2))) and float(other.schedule(2)) > float(first.schedule(2))

    tx, schedule = make_optimizer(other.optim, other.abstract_params), make_schedule(other.optim)
    constants = jax.jit(functools.partial(train_step, loss_fn=lm_functions(TINY)[1], tx=tx, schedule=schedule, seed=11))
    with other._context():
        ref = other.init(seed=0)
        for _ in range(3):
            ref, ref_metrics = constants(ref, batch)
    assert float(ref_metrics["loss"]) == float(metrics["loss"])
    for x, y in zip(jax.tree.leaves((state.params, state.opt_state)), jax.tree.leaves((ref.params, ref.opt_state))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_mixed_precision_keeps_fp32_params_and_state():
    ref, params, batch = _reference()
    loss_ref, _, _ = ref.grads(params, batch)
    trainer = lm_trainer(dataclasses.replace(NO_DROPOUT, dtype="bfloat16"), OPTIM, ref.mesh)
    loss, grads, _ = trainer.grads(params, batch)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype("float32")}  # grads in param_dtype
    assert abs(float(loss) - float(loss_ref)) < 2e-2
    state, metrics = trainer.step(trainer.state_from_params(params), batch)
    assert {x.dtype for x in jax.tree.leaves((state.params, state.opt_state)) if x.ndim} == {jnp.dtype("float32")}
    assert float(metrics["loss"]) == pytest.approx(float(loss), rel=1e-6)


@pytest.mark.parametrize("remat", ["full", "dots", "attention"])
def test_remat_does_not_change_gradients(remat):
    ref, params, batch = _reference()
    _, grads_ref, _ = ref.grads(params, batch)
    _, grads, _ = lm_trainer(dataclasses.replace(NO_DROPOUT, remat=remat), OPTIM, ref.mesh).grads(params, batch)
    assert max(jax.tree.leaves(jax.tree.map(_rel, grads, grads_ref))) <= 1e-5


BF16_CORE = """
import jax, jax.numpy as jnp, numpy as np
from gpt1_jax.attention import causal_attention
for B, T, H, K in [(2, 16, 2, 16), (2, 256, 2, 64)]:  # one query block, and two
    q, k, v = (jnp.asarray(np.random.default_rng(i).normal(size=(B, T, H, K)), jnp.float32) for i in range(3))
    probe = jnp.asarray(np.random.default_rng(3).normal(size=(B, T, H, K)), jnp.float32)
    def loss(q, k, v):
        out = causal_attention(q, k, v, impl="xla_blocked", dropout_rate=0.1, dropout_rng=jax.random.key(0))
        return jnp.sum(out.astype(jnp.float32) * probe)
    grads = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        grads[dtype] = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*(x.astype(dtype) for x in (q, k, v)))
    for got, ref in zip(grads[jnp.bfloat16], grads[jnp.float32]):
        assert got.dtype == jnp.bfloat16
        rel = float(jnp.linalg.norm(got.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
        assert rel < 3e-2, (B, T, rel)
print("ok")
"""


def test_the_bf16_attention_core_runs_with_xlas_own_flags():
    """The suite compiles with fast-compile flags (tests/support/env.py), under which XLA:CPU picks other kernels
    for small products: a bf16 x bf16 -> fp32 product that XLA:CPU refuses at run time with its default flags
    (`products._COTANGENT_FIRST`) passed every in-process test. Here the CPU's bf16 attention core (forward and
    backward, dropout on) runs as users run it, and its gradients match float32's to bf16's precision."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, "-c", BF16_CORE], capture_output=True, text=True, timeout=300, env=env,
                          cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
