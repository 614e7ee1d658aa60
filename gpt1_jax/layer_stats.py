"""Per-layer training statistics (config `stats_every`): for each parameter group, the norms of the parameters,
the gradients and the optimizer's update, and the update/parameter ratio, computed inside the jitted step
(gpt1_jax/step.py), so only the scalars reach the host.

Groups: `embed/tokens`, `embed/positions`; per block `blockK/attn` (c_attn and c_proj), `blockK/mlp` (c_fc and
c_proj) and `blockK/ln` (ln_1 and ln_2), K from 0; `head` (fine-tuning's classifier). Scanned blocks (params
stacked on a leading layer axis) give the same groups as unrolled ones. A fine-tuning tree's `transformer`
level is looked through. Metric names: `stats/<group>/{param_norm,grad_norm,update_norm,update_ratio}`.

Under FSDP or tensor sharding the sums of squares are global reductions that XLA's partitioner turns into
collectives; nothing here names a device.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

def _keys(path) -> list[str]:
    keys = [str(getattr(k, "key", k)) for k in path]
    return keys[1:] if keys and keys[0] == "transformer" else keys


def _block_part(name: str) -> str:
    return "ln" if name.startswith("ln") else name  # attn, mlp, ln_1/ln_2 -> ln


def _groups(path, leaf) -> list[tuple[str, jax.Array]]:
    """(group, this leaf's sum of squares in float32) for each group the leaf belongs to (a scanned block's leaf:
    one per layer)."""
    keys = _keys(path)
    squares = jnp.square(leaf.astype(jnp.float32))
    if keys[0] == "h":  # scanned: [L, ...]
        per_layer = jnp.sum(squares, axis=tuple(range(1, squares.ndim)))
        return [(f"block{i}/{_block_part(keys[1])}", per_layer[i]) for i in range(leaf.shape[0])]
    if m := re.fullmatch(r"h_(\d+)", keys[0]):
        return [(f"block{m.group(1)}/{_block_part(keys[1])}", jnp.sum(squares))]
    if keys[0].endswith("_embed"):
        return [(f"embed/{keys[0].removesuffix('_embed')}", jnp.sum(squares))]
    return [(keys[0], jnp.sum(squares))]


def _sums(tree) -> dict[str, jax.Array]:
    out: dict[str, jax.Array] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        for group, s in _groups(path, leaf):
            out[group] = out[group] + s if group in out else s
    return out


def layer_stats(params, grads, updates) -> dict[str, jax.Array]:
    """{"stats/<group>/<norm>": float32 scalar} for the params before the update, their gradients and the update."""
    stats = {}
    p, g, u = _sums(params), _sums(grads), _sums(updates)
    for group in p:
        pn, gn, un = jnp.sqrt(p[group]), jnp.sqrt(g[group]), jnp.sqrt(u[group])
        stats.update({f"stats/{group}/param_norm": pn, f"stats/{group}/grad_norm": gn,
                      f"stats/{group}/update_norm": un, f"stats/{group}/update_ratio": un / jnp.maximum(pn, 1e-30)})
    return stats
