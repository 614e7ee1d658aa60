"""What tests/unit/test_layer_stats.py and tests/e2e/test_layer_stats.py share."""

import jax
import numpy as np


def numpy_stats(params, grads, updates, n_layers) -> dict[str, float]:
    """The groups by hand, in float64: embeddings, each block's attention / MLP / LayerNorms."""
    def flat(tree):
        return {jax.tree_util.keystr(k): np.asarray(v, np.float64) for k, v in jax.tree_util.tree_leaves_with_path(tree)}

    out = {}
    for name, tree in (("param_norm", params), ("grad_norm", grads), ("update_norm", updates)):
        leaves = flat(tree)
        groups = {"embed/tokens": [], "embed/positions": []}
        for i in range(n_layers):
            groups.update({f"block{i}/attn": [], f"block{i}/mlp": [], f"block{i}/ln": []})
        for key, x in leaves.items():
            if "tokens_embed" in key:
                groups["embed/tokens"].append(x.ravel())
            elif "positions_embed" in key:
                groups["embed/positions"].append(x.ravel())
            else:
                part = "attn" if "'attn'" in key else "mlp" if "'mlp'" in key else "ln"
                if key.startswith("['h']"):  # scanned: [L, ...]
                    for i in range(n_layers):
                        groups[f"block{i}/{part}"].append(x[i].ravel())
                else:
                    groups[f"block{int(key.split(']')[0][4:-1])}/{part}"].append(x.ravel())
        for g, parts in groups.items():
            out[f"stats/{g}/{name}"] = float(np.sqrt(sum(np.sum(p * p) for p in parts)))
    for key in [k for k in out if k.endswith("/param_norm")]:
        g = key.removesuffix("/param_norm")
        out[f"{g}/update_ratio"] = out[f"{g}/update_norm"] / out[key]
    return out
