"""Sharding rules in process: FSDP really spreads params and optimizer state, pure data parallel replicates
them, meshes parse, rules are overridable in one place, a mesh axis that does not divide what it splits is one
line (the vocabulary alone stays whole).
Sharded loss and gradients against one device on every mesh: tests/e2e/test_sharding.py."""

import dataclasses

import pytest
from jax.sharding import PartitionSpec as P

from gpt1_jax import sharding as shd
from gpt1_jax.config import ConfigError
from gpt1_jax.step import lm_functions, lm_trainer, make_trainer, state_bytes
from tests.support.sharding import OPTIM, TINY


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
    with pytest.raises(ConfigError, match="--mesh auto is plan's"):  # pretrain said "not AXIS=SIZE"
        shd.parse_mesh("auto")


def test_rules_overridable_in_one_place():
    rules = dict(shd.logical_rules({"vocab": None, "embed": "data,fsdp"}))
    assert rules["vocab"] is None and rules["embed"] == ("data", "fsdp")
    assert rules["heads"] == "tensor"
    with pytest.raises(ConfigError):
        shd.logical_rules({"embed": "pipeline"})
    with pytest.raises(ConfigError):
        shd.MeshConfig(rules={"nope": "data"})


def test_mesh_flag_sets_the_axis_sizes_and_set_still_wins():
    """`--mesh fsdp=8 --set 'mesh.rules={embed: null}'` planned and trained with the default rules: --mesh replaced
    the whole mesh config after --set had been applied."""
    from gpt1_jax.config import PretrainConfig, resolve

    config = resolve(PretrainConfig, "tiny", mesh="fsdp=8", overrides=["mesh.rules={embed: null}"])
    assert (config.mesh.fsdp, config.mesh.data, dict(config.mesh.rules)) == (8, -1, {"embed": None})
    assert resolve(PretrainConfig, "tiny", mesh="data=8", overrides=["mesh.fsdp=2"]).mesh.fsdp == 2


def test_dcn_sizes_on_devices_of_one_slice_are_one_line():
    """A Python traceback from mesh_utils ("Device cpu:0 does not have attribute slice_index"), exit 1."""
    with pytest.raises(ConfigError, match=r"^mesh dcn sizes \(2, 1, 1\) split the mesh over 2 slices, and these devices "
                                          r"are one slice: set the dcn_\* sizes"):
        shd.make_mesh(shd.parse_mesh("data=8,dcn_data=2"))


def test_tensor_that_does_not_divide_the_heads_is_one_line_not_replicated_heads():
    """tiny has 4 heads: tensor=8 split the MLP and left attention whole on every device, silently (c_attn's kernel
    came out P('fsdp', None, None, None)); a mesh asked for is a mesh got, or one line naming the dimension."""
    with pytest.raises(ConfigError, match=r"^mesh tensor=8 does not divide h_0/attn/c_attn/\w+'s heads dimension \(4\): "
                                          r"choose a size that divides 4, or --set 'mesh.rules=\{heads: null\}'"):
        lm_trainer(TINY, OPTIM, shd.make_mesh(shd.parse_mesh("tensor=8")))
    told = make_trainer(*lm_functions(TINY), OPTIM, shd.MeshConfig(data=1, tensor=8, rules={"heads": None}))
    assert told.param_shardings["h_0"]["attn"]["c_attn"]["kernel"].spec == P("fsdp", None, None, None)
    assert told.param_shardings["h_0"]["mlp"]["c_fc"]["kernel"].spec == P("fsdp", "tensor")


def test_fsdp_that_does_not_divide_d_model_is_one_line():
    config = dataclasses.replace(TINY, d_model=36, n_heads=4)
    with pytest.raises(ConfigError, match=r"^mesh fsdp=8 does not divide \S+'s embed dimension \(36\)"):
        lm_trainer(config, OPTIM, shd.make_mesh(shd.parse_mesh("fsdp=8")))


def test_vocab_alone_stays_whole_where_tensor_does_not_divide_it():
    """The tokenizer sets the vocabulary's size (GPT-1's 40478 + 3 markers, odd): no tensor size could split it."""
    mesh = shd.make_mesh(shd.parse_mesh("tensor=4"))
    sizes = dict(mesh.shape)
    assert shd._fit_spec(("vocab", "embed"), P("tensor", None), (40481, 768), sizes, "e") == P(None, None)
    assert shd._fit_spec(("vocab", "embed"), P("tensor", None), (40480, 768), sizes, "e") == P("tensor", None)
    trainer = lm_trainer(dataclasses.replace(TINY, vocab_size=510), OPTIM, mesh)
    assert trainer.param_shardings["tokens_embed"]["embedding"].spec == P(None, "fsdp")
    assert trainer.param_shardings["h_0"]["attn"]["c_attn"]["kernel"].spec == P("fsdp", None, "tensor", None)
