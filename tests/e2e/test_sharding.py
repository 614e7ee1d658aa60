"""Sharded loss and gradients equal the single-device ones on DP, FSDP, TP and mixed meshes (8 fake CPU
devices); the compiled data-parallel step reduces each gradient across devices once."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpt1_jax import plan
from gpt1_jax import sharding as shd
from gpt1_jax.attention import query_blocks, resolve_impl
from gpt1_jax.heads import finetune_functions
from gpt1_jax.step import lm_batch, lm_batch_spec, lm_trainer, make_trainer
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


def _reduced_arrays(trainer, batch_spec) -> list[tuple[str, int]]:
    """(shape, bytes) of every array the compiled train step all-reduces or reduce-scatters, once per op."""
    found = []
    for line in trainer.lower(batch_spec).compile().as_text().splitlines():
        m = plan._OP.search(line)
        if m and m.group("op") in ("all-reduce", "reduce-scatter"):
            shapes = [f"{dtype}[{dims}]" for dtype, dims in plan._ARRAY.findall(m.group("shape"))]
            found += zip(shapes, plan._array_bytes(m.group("shape")))
    return found


def test_tied_token_table_gradient_crosses_devices_once_and_the_step_equals_one_device(reference):
    """The token table is both the input embedding and the LM head. On data=8 each use's [V, D] gradient was
    all-reduced on its own and the two added after: f32[512,64] twice among the step's all-reduced arrays,
    670,212 bytes for 547,328 bytes of parameters (the TPU compiler for v5e:2x4 too: 2 all-reduces, 1,172,871
    ring bytes per chip; now 1 and 943,495). GPT1.group_table adds them on each device first."""
    mesh = shd.make_mesh(shd.parse_mesh("data=8"))
    trainer = lm_trainer(TINY, OPTIM, mesh)
    reduced = _reduced_arrays(trainer, lm_batch_spec(16, 32))
    table = f"f32[{TINY.vocab_size},{TINY.d_model}]"
    assert [shape for shape, _ in reduced].count(table) == 1, reduced
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(reference["params"]))
    assert sum(n for _, n in reduced) <= param_bytes + 64, (sum(n for _, n in reduced), param_bytes)

    loss, grads, params = _grads_on(mesh)  # the table's gradient as one device computes it
    assert loss == pytest.approx(reference["loss"], rel=1e-6)
    assert _rel(grads["tokens_embed"]["embedding"], reference["grads"]["tokens_embed"]["embedding"]) <= 1e-6

    one = lm_trainer(TINY, OPTIM, shd.make_mesh(shd.MeshConfig(data=1), jax.devices()[:1]))
    after = {}
    for name, t in (("one", one), ("eight", trainer)):
        state, metrics = t.step(t.state_from_params(reference["params"]), t.put_batch(BATCH))
        after[name] = (float(metrics["loss"]), float(metrics["grad_norm"]), jax.tree.map(np.asarray, state.params))
    assert after["eight"][:2] == pytest.approx(after["one"][:2], rel=1e-6)
    # 1e-4, not 1e-6: the attention keys' bias has a gradient of rounding noise only (softmax ignores a shift),
    # which Adam's first step scales to +-lr whatever its size (1.9e-5 here, the same before GPT1.group_table).
    errs = jax.tree.map(_rel, after["eight"][2], after["one"][2])
    assert max(jax.tree.leaves(errs)) <= 1e-4, errs


@pytest.mark.parametrize("spec, groups", [("data=8", (8, ("data",))), ("fsdp=8", (1, ("data",))),
                                          ("data=2,fsdp=2,tensor=2", (2, ("data",))), ("fsdp=2,tensor=4", (1, ("data",)))])
def test_the_table_is_copied_per_group_of_the_batch_axes_that_do_not_split_it(spec, groups):
    """Over fsdp, which splits the table's embed, each gradient is reduce-scattered to its shard: one copy per fsdp
    group made the TPU compiler all-reduce the whole table there instead (GPT-1 on fsdp=8: 220 MB more per chip)."""
    with jax.set_mesh(shd.make_mesh(shd.parse_mesh(spec))), nn.logical_axis_rules(shd.DEFAULT_RULES):
        assert shd.batch_groups() == groups


def test_fine_tuning_with_its_lm_loss_reduces_the_token_table_once_and_matches_one_device():
    """Fine-tuning's auxiliary LM loss ties the table the same way: twice all-reduced on data=8 (670,744 bytes),
    once since FinetuneModel reads GPT1.group_table (539,672)."""
    init_fn, loss_fn, predict_fn = finetune_functions(TINY, "classify", 2, False, 0.0, 0.5, 1)
    rng = np.random.default_rng(3)
    batch = {"tokens": rng.integers(0, TINY.vocab_size, (16, 1, 32), dtype=np.int32),
             "clf_pos": rng.integers(1, 32, (16, 1), dtype=np.int32), "labels": rng.integers(0, 2, 16, dtype=np.int32),
             "weights": np.ones(16, np.float32), "mask": np.ones((16, 1, 32), np.float32)}
    spec = {k: jax.ShapeDtypeStruct(v.shape, jnp.dtype(v.dtype)) for k, v in batch.items()}
    results = {}
    meshes = (("one", shd.MeshConfig(data=1), jax.devices()[:1]), ("eight", shd.parse_mesh("data=8"), None))
    for name, mesh, devices in meshes:
        trainer = make_trainer(init_fn, loss_fn, OPTIM, mesh, predict_fn=predict_fn, devices=devices)
        if name == "eight":
            shapes = [shape for shape, _ in _reduced_arrays(trainer, spec)]
            assert shapes.count(f"f32[{TINY.vocab_size},{TINY.d_model}]") == 1, shapes
        params = trainer.place_params(results["one"][2] if results else trainer.init(seed=1).params)
        loss, grads, _ = trainer.grads(params, trainer.put_batch(batch))
        results[name] = (float(loss), jax.tree.map(np.asarray, grads), jax.tree.map(np.asarray, params))
    assert results["eight"][0] == pytest.approx(results["one"][0], rel=1e-6)
    errs = jax.tree.map(_rel, results["eight"][1], results["one"][1])
    assert max(jax.tree.leaves(errs)) <= 1e-5, errs
