"""Sharded loss and gradients equal the single-device ones on DP, FSDP, TP and mixed meshes (8 fake CPU
devices)."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

from gpt1_jax import sharding as shd
from gpt1_jax.attention import query_blocks, resolve_impl
from gpt1_jax.step import lm_batch, lm_trainer
from tests.support.sharding import OPTIM, TINY


BATCH = lm_batch(np.random.default_rng(0).integers(0, TINY.vocab_size, (8, 33), dtype=np.int32))


def _grads_on(mesh):
    trainer = lm_trainer(TINY, OPTIM, mesh)
    params = trainer.state_from_params(_reference()["params"]).params
    loss, grads, _ = trainer.grads(params, trainer.put_batch(BATCH))
    return float(loss), jax.tree.map(np.asarray, grads), params


@functools.lru_cache(maxsize=1)
def _reference():
    mesh = shd.make_mesh(shd.MeshConfig(data=1), jax.devices()[:1])
    trainer = lm_trainer(TINY, OPTIM, mesh)
    state = trainer.init(seed=1)
    loss, grads, _ = trainer.grads(state.params, trainer.put_batch(BATCH))
    return {"params": jax.tree.map(np.asarray, state.params), "loss": float(loss),
            "grads": jax.tree.map(np.asarray, grads)}


@pytest.fixture(scope="module")
def reference():
    return _reference()


def _rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("spec", ["data=8", "fsdp=8", "data=2,tensor=4", "data=2,fsdp=2,tensor=2"])
def test_sharded_loss_and_grads_match_single_device(reference, spec):
    mesh = shd.make_mesh(shd.parse_mesh(spec))
    assert mesh.size == 8
    loss, grads, params = _grads_on(mesh)
    assert abs(loss - reference["loss"]) / reference["loss"] <= 1e-5
    errs = jax.tree.map(_rel, grads, reference["grads"])
    assert max(jax.tree.leaves(errs)) <= 1e-5, errs
    if "tensor" in spec:  # the layout really is tensor-parallel, not silently replicated
        kernel = params["h_0"]["mlp"]["c_fc"]["kernel"]
        assert kernel.sharding.shard_shape(kernel.shape)[-1] == kernel.shape[-1] // mesh.shape["tensor"]


def test_query_blocked_attention_with_dropout_shards_like_one_device():
    """At 256 positions the CPU's attention (`auto`: xla_blocked) runs 2 query blocks, each drawing its own
    attention-dropout mask: a data x tensor mesh (heads split) gives the single-device loss and gradients,
    so the blocks' masks are the same bits however the batch and heads are split."""
    config = dataclasses.replace(TINY, n_positions=256, attn_dropout=0.1)
    assert query_blocks(256) == 2 and resolve_impl(config.attention, True, np.float32) == "xla_blocked"
    batch = lm_batch(np.random.default_rng(1).integers(0, config.vocab_size, (8, 257), dtype=np.int32))
    one_device = shd.make_mesh(shd.MeshConfig(data=1), jax.devices()[:1])
    params = jax.tree.map(np.asarray, lm_trainer(config, OPTIM, one_device).init(seed=1).params)

    def loss_and_grads(config, mesh):
        trainer = lm_trainer(config, OPTIM, mesh)
        loss, grads, _ = trainer.grads(trainer.state_from_params(params).params, trainer.put_batch(batch))
        return float(loss), jax.tree.map(np.asarray, grads)

    loss_1, grads_1 = loss_and_grads(config, one_device)
    loss_8, grads_8 = loss_and_grads(config, shd.make_mesh(shd.parse_mesh("data=2,tensor=4")))
    _, plain = loss_and_grads(dataclasses.replace(config, attn_dropout=0.0), one_device)
    assert max(jax.tree.leaves(jax.tree.map(_rel, grads_1, plain))) > 1e-2  # the dropout was on
    assert abs(loss_8 - loss_1) / loss_1 <= 1e-5
    errs = jax.tree.map(_rel, grads_8, grads_1)
    assert max(jax.tree.leaves(errs)) <= 1e-5, errs
