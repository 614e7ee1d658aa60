"""The device mesh and the one table that maps the model's logical axis names onto it.

Parallelism is chosen by mesh shape alone; the model never names a mesh axis:
  data=N            pure data parallelism (params replicated, batch split)
  fsdp=N            ZeRO-3 style: batch split *and* params + optimizer state split along `embed`
  tensor=N          Megatron style: heads, MLP hidden and vocab split; activations exchanged per block
  any product       e.g. data=2,fsdp=2,tensor=2 on 8 devices
The batch is always split over data x fsdp.

Multi-slice (ICI within a slice, DCN between slices) is planned for: `MeshConfig.dcn_*` give each axis's
split across slices and `make_mesh` then builds a hybrid mesh (jax.experimental.mesh_utils); with all
dcn_* = 1 (the default) the mesh is a plain one over the local devices.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import PartitionSpec

from gpt1_jax.config import MESH_AXES, ConfigError, MeshAxes, MeshConfig, parse_mesh, rule_axes  # noqa: F401 (re-exported)

Rules = tuple[tuple[str, MeshAxes], ...]

# Order matters: flax assigns rules first to last and never reuses a mesh axis within one array. So an
# activation [batch, length, embed] takes fsdp for `batch` and leaves `embed` whole, while a parameter
# [vocab, embed] (no batch axis) gets `embed` split over fsdp: FSDP falls out of one table. One entry per
# name of config.LOGICAL_AXES, the names `mesh.rules` is checked against.
DEFAULT_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("positions", None),
    ("length", None),
    ("qkv", None),
    ("kv", None),
    ("layers", None),
)


def logical_rules(overrides: Sequence[tuple[str, Any]] | Mapping[str, Any] = ()) -> Rules:
    """DEFAULT_RULES with some entries replaced; the single place rules are built."""
    items = overrides.items() if isinstance(overrides, Mapping) else overrides
    replaced = {name: rule_axes(axes) for name, axes in items}
    return tuple((name, replaced.get(name, axes)) for name, axes in DEFAULT_RULES)


def make_mesh(config: MeshConfig, devices: Sequence[Any] | None = None):
    """A jax.sharding.Mesh over `devices` (default all) with axes (data, fsdp, tensor), Auto axis types.

    Auto, not Explicit: flax's logical constraints are hints for GSPMD and fail under Explicit axes
    (docs/stack.md). `tensor` is the innermost (fastest-varying) axis so its all-reduces stay between
    neighbouring devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = config.axis_sizes(len(devices))
    shape = tuple(sizes[a] for a in MESH_AXES)
    dcn = (config.dcn_data, config.dcn_fsdp, config.dcn_tensor)
    if math.prod(dcn) > 1:
        if any(s % d for s, d in zip(shape, dcn)):
            raise ConfigError(f"mesh dcn sizes {dcn} must divide the axis sizes {shape}")
        slices = {getattr(d, "slice_index", None) for d in devices}
        if None in slices or len(slices) != math.prod(dcn):
            raise ConfigError(f"mesh dcn sizes {dcn} split the mesh over {math.prod(dcn)} slices, and these devices are "
                              f"{'one slice' if None in slices or len(slices) == 1 else f'{len(slices)} slices'}: "
                              "set the dcn_* sizes to the slices a multi-slice job has (plan: --num-slices N)")
        ici = tuple(s // d for s, d in zip(shape, dcn))
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices, allow_split_physical_axes=True)
    elif devices[0].platform != "cpu" and (len(devices) == len(jax.devices()) or devices[0] not in jax.devices()):
        # topology-aware on TPU/GPU: all visible chips, or all of a compile-only TPU topology (plan.py)
        grid = mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True)
    else:
        grid = np.asarray(devices, dtype=object).reshape(shape)
    return jax.sharding.Mesh(grid, MESH_AXES)


# The one logical axis a mesh axis may leave whole where it does not divide: the tokenizer sets the vocabulary's
# size (GPT-1's 40478 BPE tokens + 3 fine-tuning markers = 40481, odd), so no tensor size could split it. The
# table then sits whole on every chip, which `gpt1-jax plan` lists among its replicated state tensors.
MAY_STAY_WHOLE = frozenset({"vocab"})


def _mesh_axes(axes) -> tuple[str, ...]:
    return (axes,) if isinstance(axes, str) else tuple(axes or ())


def _fit_spec(logical, spec, shape: tuple[int, ...], sizes: Mapping[str, int], where: str):
    """The mesh spec of one array: each dimension split over the mesh axes the rules give it. A mesh axis that
    does not divide its dimension is a ConfigError naming both, except on a MAY_STAY_WHOLE axis (e.g. vocab 40481
    over tensor=4), which is left whole there instead: a mesh asked for is a mesh got, never silently less."""
    fitted = []
    pad = (None,) * (len(shape) - len(spec))
    for dim, name, axes in zip(shape, tuple(logical) + pad, tuple(spec) + pad):
        kept = []
        for axis in _mesh_axes(axes):
            if dim % (math.prod(sizes[a] for a in kept) * sizes[axis]) == 0:
                kept.append(axis)
            elif name not in MAY_STAY_WHOLE and sizes[axis] > 1:
                split = " x ".join(f"{a}={sizes[a]}" for a in kept + [axis])
                raise ConfigError(f"mesh {split} does not divide {where}'s {name} dimension ({dim}): choose a size that "
                                  f"divides {dim}, or --set 'mesh.rules={{{name}: null}}' to keep {name} whole")
        fitted.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*fitted)


def fitted_specs(boxed_tree, sizes: Mapping[str, int], rules: Rules):
    """PartitionSpecs for a tree of nn.Partitioned boxes (concrete or from jax.eval_shape) on a mesh of these
    axis sizes; ConfigError where a mesh axis does not divide a dimension the rules split over it (_fit_spec)."""
    logical = nn.get_partition_spec(boxed_tree)
    mesh_specs = nn.logical_to_mesh(logical, rules)
    is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
    flat_logical = jax.tree.leaves(logical, is_leaf=is_spec)
    flat_mesh = jax.tree.leaves(mesh_specs, is_leaf=is_spec)
    paths_values, treedef = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(boxed_tree))
    specs = [_fit_spec(names, spec, tuple(v.shape), sizes, "/".join(_dict_keys(path)))
             for (path, v), names, spec in zip(paths_values, flat_logical, flat_mesh)]
    return jax.tree_util.tree_unflatten(treedef, specs)


def logical_shardings(boxed_tree, mesh, rules: Rules):
    """NamedShardings for a tree of nn.Partitioned boxes (concrete or from jax.eval_shape)."""
    specs = fitted_specs(boxed_tree, dict(mesh.shape), rules)
    return jax.tree.map(lambda s: jax.sharding.NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def replicated(mesh):
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


# ---- the tied token table, one copy per batch group (GPT1.group_table) ----------------------------------------

def batch_groups() -> tuple[int, tuple[str, ...]]:
    """(groups, their mesh axes) under the mesh and rules being traced: the batch's mesh axes that do not split the
    token table too; (1, ()) outside a mesh. Over an axis that splits the table (fsdp: embed) each use's gradient is
    reduce-scattered to its shard, and one copy per group would all-reduce the whole table instead (GPT-1 on
    fsdp=8 for the TPU compiler: 220 MB more all-reduced per chip, 265 MB more sent in all)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1, ()
    # one name a call: flax never gives one array a mesh axis twice, and the batch would take fsdp from embed
    batch, vocab, embed = (nn.logical_to_mesh_axes((name,))[0] for name in ("batch", "vocab", "embed"))
    table = {a for axes in (vocab, embed) for a in _mesh_axes(axes)}
    axes = tuple(a for a in _mesh_axes(batch) if a not in table)
    return math.prod(mesh.shape[a] for a in axes), axes


def split_groups(x_B: jax.Array, groups: int) -> jax.Array:
    """[B, ...] -> [G, B/G, ...]: group g holds the rows the batch's sharding gives group g (rows split in order, data
    the outer batch axis)."""
    return on_groups(x_B.reshape(groups, x_B.shape[0] // groups, *x_B.shape[1:]), batch_groups()[1])


def on_groups(x_G: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """Group g on batch shard g's devices; the other dimensions as the compiler propagates them (the table's vocab
    over tensor, its embed gathered as FSDP's forward does)."""
    rest = (PartitionSpec.UNCONSTRAINED,) * (x_G.ndim - 1)
    return jax.lax.with_sharding_constraint(x_G, PartitionSpec(axes, *rest))


def batch_sharding(mesh, ndim: int = 2):
    """Leading (batch) dimension over data x fsdp, the rest whole."""
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp"), *([None] * (ndim - 1))))


def batch_divisor(mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


@functools.lru_cache(maxsize=None)
def batch_rows_shared_by_processes(mesh) -> bool:
    """Whether two processes hold the same rows of a batch laid over data x fsdp (a mesh whose batch axes do not
    span the processes, e.g. tensor=4 over 2 processes of 2 devices). Every process reads rows of its own
    (gpt1_jax/data/pipeline.py), so such a mesh would train each step on a part of its batch."""
    rows = batch_divisor(mesh)
    holders: dict[tuple, set] = {}
    for device, index in batch_sharding(mesh, 1).devices_indices_map((rows,)).items():
        holders.setdefault(index[0].indices(rows)[:2], set()).add(device.process_index)
    return any(len(processes) > 1 for processes in holders.values())


def like_params_shardings(abstract_tree, abstract_params, param_shardings, mesh):
    """Shardings for a tree holding copies of the params (optimizer moments): a leaf whose path ends
    with a parameter's path and has that parameter's shape takes its sharding; the rest (step counts,
    factored statistics) are replicated. Works for any optax state without knowing its classes."""
    flat_params = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    flat_shardings = jax.tree.leaves(param_shardings)
    by_path = {_dict_keys(path): (tuple(p.shape), s) for (path, p), s in zip(flat_params, flat_shardings)}

    def pick(path, leaf):
        keys = _dict_keys(path)
        for start in range(len(keys)):
            shape, sharding = by_path.get(keys[start:], (None, None))
            if sharding is not None and shape == tuple(leaf.shape):
                return sharding
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, abstract_tree)


def _dict_keys(path) -> tuple[str, ...]:
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
