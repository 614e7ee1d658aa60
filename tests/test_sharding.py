"""Sharded loss and gradients equal the single-device ones on DP, FSDP, TP and mixed meshes (8 fake
CPU devices); FSDP really spreads params and optimizer state; mesh parsing and rules fail clearly."""

import dataclasses
import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from gpt1_jax import sharding as shd
from gpt1_jax.config import ConfigError, model_preset
from gpt1_jax.optim import OptimConfig
from gpt1_jax.step import lm_batch, lm_trainer, state_bytes

# Dropout off: the comparison is about partitioning, not RNG streams.
TINY = dataclasses.replace(model_preset("tiny"), embd_dropout=0.0, attn_dropout=0.0, resid_dropout=0.0)
OPTIM = OptimConfig(schedule="constant", warmup_steps=0)
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


def test_fsdp_spreads_params_and_optimizer_state():
    # Shapes divisible by 8 everywhere it matters; only small biases stay replicated.
    config = dataclasses.replace(TINY, vocab_size=1024, d_model=128, d_mlp=512)
    trainer = lm_trainer(config, OPTIM, shd.make_mesh(shd.parse_mesh("fsdp=8")))
    state = trainer.init()
    total, per_device = state_bytes(state)
    assert per_device <= total / 8 * 1.05, (per_device, total / 8)
    emb = state.opt_state[1][0].mu["tokens_embed"]["embedding"]  # Adam's first moment
    assert emb.sharding.shard_shape(emb.shape) == (1024, 128 // 8)


def test_pure_data_parallel_replicates_params():
    trainer = lm_trainer(TINY, OPTIM, shd.make_mesh(shd.parse_mesh("data=8")))
    total, per_device = state_bytes(trainer.init())
    assert per_device == total


def test_parse_mesh_and_sizes():
    assert shd.parse_mesh("data=2,fsdp=2,tensor=2").axis_sizes(8) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert shd.parse_mesh("").axis_sizes(8) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert shd.parse_mesh("fsdp=-1,tensor=2").axis_sizes(8) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert shd.parse_mesh("tensor=2").axis_sizes(8) == {"data": 4, "fsdp": 1, "tensor": 2}
    for bad in ("data=3", "pipe=2", "data=x", "data=-1,fsdp=-1"):
        with pytest.raises(ConfigError):
            shd.parse_mesh(bad).axis_sizes(8)


def test_rules_overridable_in_one_place():
    rules = dict(shd.logical_rules({"vocab": None, "embed": "data,fsdp"}))
    assert rules["vocab"] is None and rules["embed"] == ("data", "fsdp")
    assert rules["heads"] == "tensor"
    with pytest.raises(ConfigError):
        shd.logical_rules({"embed": "pipeline"})
    with pytest.raises(ConfigError):
        shd.MeshConfig(rules={"nope": "data"})


def test_undivisible_dimension_falls_back_to_replicated():
    mesh = shd.make_mesh(shd.parse_mesh("tensor=8"))
    assert shd._fit_spec(P("tensor", None), (40478, 768), mesh) == P(None, None)
    assert shd._fit_spec(P("tensor", None), (40480, 768), mesh) == P("tensor", None)
