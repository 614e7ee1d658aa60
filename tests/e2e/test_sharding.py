"""Sharded loss and gradients equal the single-device ones on DP, FSDP, TP and mixed meshes (8 fake CPU
devices)."""

import functools

import jax
import numpy as np
import pytest

from gpt1_jax import sharding as shd
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
