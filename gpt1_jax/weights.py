"""Checkpoint import/export: Hugging Face `openai-gpt` directories, OpenAI's original release, and ours.

Formats `load_pretrained` recognises by the files in the directory:
  hf        config.json + model.safetensors (or pytorch_model.bin)      - transformers' OpenAIGPT*
  original  params_shapes.json + params_0.npy ... params_{n-1}.npy      - openai/finetune-transformer-lm
  jax       config.yaml + params/ (an orbax checkpoint of the tree)     - gpt1-jax's own
All three go through one flat, HF-named dict of [in, out] float arrays ("the HF state"), so each
format needs only a reader or a writer of that dict, and the layout of our tree lives in two functions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from gpt1_jax.config import ConfigError, ModelConfig, load_yaml, save_yaml
from gpt1_jax.errors import CheckpointFormatError

HF_BLOCK_KEYS = (
    "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_1.weight", "ln_1.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
    "ln_2.weight", "ln_2.bias",
)  # also the order of a block's arrays in the original release


# ---------------------------------------------------------------------------------------------------
# Our tree <-> the HF state


def _block_to_hf(c: ModelConfig, b: dict) -> dict[str, np.ndarray]:
    D, F = c.d_model, c.d_mlp
    return {
        "attn.c_attn.weight": b["attn"]["c_attn"]["kernel"].reshape(D, 3 * D),
        "attn.c_attn.bias": b["attn"]["c_attn"]["bias"].reshape(3 * D),
        "attn.c_proj.weight": b["attn"]["c_proj"]["kernel"].reshape(D, D),
        "attn.c_proj.bias": b["attn"]["c_proj"]["bias"],
        "ln_1.weight": b["ln_1"]["scale"],
        "ln_1.bias": b["ln_1"]["bias"],
        "mlp.c_fc.weight": b["mlp"]["c_fc"]["kernel"].reshape(D, F),
        "mlp.c_fc.bias": b["mlp"]["c_fc"]["bias"],
        "mlp.c_proj.weight": b["mlp"]["c_proj"]["kernel"].reshape(F, D),
        "mlp.c_proj.bias": b["mlp"]["c_proj"]["bias"],
        "ln_2.weight": b["ln_2"]["scale"],
        "ln_2.bias": b["ln_2"]["bias"],
    }


def _block_from_hf(c: ModelConfig, s: dict[str, np.ndarray]) -> dict:
    H, K, D, F = c.n_heads, c.head_dim, c.d_model, c.d_mlp
    return {
        "attn": {
            "c_attn": {"kernel": s["attn.c_attn.weight"].reshape(D, 3, H, K), "bias": s["attn.c_attn.bias"].reshape(3, H, K)},
            "c_proj": {"kernel": s["attn.c_proj.weight"].reshape(H, K, D), "bias": s["attn.c_proj.bias"]},
        },
        "ln_1": {"scale": s["ln_1.weight"], "bias": s["ln_1.bias"]},
        "mlp": {
            "c_fc": {"kernel": s["mlp.c_fc.weight"].reshape(D, F), "bias": s["mlp.c_fc.bias"]},
            "c_proj": {"kernel": s["mlp.c_proj.weight"].reshape(F, D), "bias": s["mlp.c_proj.bias"]},
        },
        "ln_2": {"scale": s["ln_2.weight"], "bias": s["ln_2.bias"]},
    }


def params_to_hf_state(config: ModelConfig, params) -> dict[str, np.ndarray]:
    """Our parameter tree (boxed or not, scanned or not) -> HF's flat `OpenAIGPTModel` state dict."""
    p = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), nn.meta.unbox(params))
    state = {"tokens_embed.weight": p["tokens_embed"]["embedding"], "positions_embed.weight": p["positions_embed"]["embedding"]}
    for i in range(config.n_layers):
        block = jax.tree_util.tree_map(lambda x: x[i], p["h"]) if config.scan_layers else p[f"h_{i}"]
        state.update({f"h.{i}.{k}": v for k, v in _block_to_hf(config, block).items()})
    return state


def expected_hf_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    D, F = c.d_model, c.d_mlp
    block = {
        "attn.c_attn.weight": (D, 3 * D), "attn.c_attn.bias": (3 * D,), "attn.c_proj.weight": (D, D),
        "attn.c_proj.bias": (D,), "ln_1.weight": (D,), "ln_1.bias": (D,), "mlp.c_fc.weight": (D, F),
        "mlp.c_fc.bias": (F,), "mlp.c_proj.weight": (F, D), "mlp.c_proj.bias": (D,), "ln_2.weight": (D,),
        "ln_2.bias": (D,),
    }
    shapes = {"tokens_embed.weight": (c.vocab_size, D), "positions_embed.weight": (c.n_positions, D)}
    for i in range(c.n_layers):
        shapes.update({f"h.{i}.{k}": v for k, v in block.items()})
    return shapes


def hf_state_to_params(config: ModelConfig, state: dict[str, np.ndarray], source: str = "checkpoint"):
    """HF's flat state dict -> our (unboxed) parameter tree, after checking every name and shape."""
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    for key, shape in expected_hf_shapes(config).items():
        if key not in state:
            raise CheckpointFormatError(f"{source}: missing tensor {key!r}")
        if tuple(state[key].shape) != shape:
            raise ConfigError(
                f"{source}: tensor {key!r} has shape {tuple(state[key].shape)} but the config expects {shape}"
            )
    dtype = np.dtype(config.param_dtype) if config.param_dtype != "bfloat16" else jax.numpy.bfloat16
    state = {k: np.asarray(v, np.float32).astype(dtype) for k, v in state.items()}
    blocks = [_block_from_hf(config, {k: state[f"h.{i}.{k}"] for k in HF_BLOCK_KEYS}) for i in range(config.n_layers)]
    params = {
        "tokens_embed": {"embedding": state["tokens_embed.weight"]},
        "positions_embed": {"embedding": state["positions_embed.weight"]},
    }
    if config.scan_layers:
        params["h"] = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *blocks)
    else:
        params.update({f"h_{i}": b for i, b in enumerate(blocks)})
    return jax.tree_util.tree_map(jax.numpy.asarray, params)


# ---------------------------------------------------------------------------------------------------
# Hugging Face directories


def _config_from_hf(hf: dict, source: str) -> ModelConfig:
    if hf.get("afn", "gelu") not in ("gelu", "gelu_new"):
        raise ConfigError(f"{source}: activation {hf['afn']!r} is not GPT-1's tanh GELU")
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"], n_positions=hf["n_positions"], d_model=hf["n_embd"],
            n_layers=hf["n_layer"], n_heads=hf["n_head"], d_mlp=4 * hf["n_embd"],
            embd_dropout=hf.get("embd_pdrop", 0.1), attn_dropout=hf.get("attn_pdrop", 0.1),
            resid_dropout=hf.get("resid_pdrop", 0.1), layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            init_std=hf.get("initializer_range", 0.02),
        )
    except KeyError as e:
        raise CheckpointFormatError(f"{source}: config.json lacks {e.args[0]!r}") from None


def _config_to_hf(c: ModelConfig) -> dict:
    if c.d_mlp != 4 * c.d_model:
        raise ConfigError(f"HF's OpenAIGPT fixes d_mlp = 4*d_model; this model has d_mlp={c.d_mlp}, d_model={c.d_model}")
    return {
        "architectures": ["OpenAIGPTLMHeadModel"], "model_type": "openai-gpt", "afn": "gelu",
        "vocab_size": c.vocab_size, "n_positions": c.n_positions, "n_embd": c.d_model, "n_layer": c.n_layers,
        "n_head": c.n_heads, "embd_pdrop": c.embd_dropout, "attn_pdrop": c.attn_dropout,
        "resid_pdrop": c.resid_dropout, "layer_norm_epsilon": c.layer_norm_eps, "initializer_range": c.init_std,
        "tie_word_embeddings": True,
    }


def _read_hf_state(path: Path) -> dict[str, np.ndarray]:
    if (path / "model.safetensors").is_file():
        from safetensors.numpy import load_file

        return load_file(path / "model.safetensors")
    if (path / "pytorch_model.bin").is_file():
        try:
            import torch
        except ImportError:
            raise CheckpointFormatError(f"{path}/pytorch_model.bin needs torch to read: pip install torch") from None
        state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    raise CheckpointFormatError(f"{path}: has config.json but neither model.safetensors nor pytorch_model.bin")


# ---------------------------------------------------------------------------------------------------
# OpenAI's original release


def read_original_arrays(path: Path) -> list[np.ndarray]:
    """params_shapes.json + params_{i}.npy -> the list of arrays, split and reshaped as released."""
    try:
        shapes = json.loads((path / "params_shapes.json").read_text())
    except json.JSONDecodeError as e:
        raise CheckpointFormatError(f"{path}/params_shapes.json is not valid JSON: {e}") from None
    indices = sorted(int(m.group(1)) for p in path.glob("params_*.npy") if (m := re.fullmatch(r"params_(\d+)", p.stem)))
    if not indices:
        raise CheckpointFormatError(f"{path}: no params_0.npy ... shards beside params_shapes.json")
    missing = sorted(set(range(max(indices) + 1)) - set(indices))
    if missing:
        raise CheckpointFormatError(f"{path}: shard params_{missing[0]}.npy is missing (found {len(indices)} of {max(indices) + 1})")
    flat = np.concatenate([np.load(path / f"params_{i}.npy").reshape(-1) for i in range(max(indices) + 1)])
    sizes = [int(np.prod(s)) for s in shapes]
    if sum(sizes) != flat.size:
        raise CheckpointFormatError(
            f"{path}: params_shapes.json describes {sum(sizes):,} values but the shards hold {flat.size:,}"
        )
    return [a.reshape(s) for a, s in zip(np.split(flat, np.cumsum(sizes)[:-1]), shapes)]


def original_arrays_to_hf_state(arrays: list[np.ndarray], source: str) -> dict[str, np.ndarray]:
    n_block = len(HF_BLOCK_KEYS)
    if len(arrays) < 2 or (len(arrays) - 2) % n_block:
        raise CheckpointFormatError(f"{source}: {len(arrays)} arrays is not 2 embeddings + {n_block} per layer")
    state = {"positions_embed.weight": arrays[0], "tokens_embed.weight": arrays[1]}
    for i in range((len(arrays) - 2) // n_block):
        for j, key in enumerate(HF_BLOCK_KEYS):
            a = arrays[2 + i * n_block + j]
            state[f"h.{i}.{key}"] = a[0] if a.ndim == 3 else a  # conv weights are [1, in, out]
    return state


def _config_from_original(state: dict[str, np.ndarray], head_dim: int = 64) -> ModelConfig:
    V, D = state["tokens_embed.weight"].shape
    n_layers = sum(1 for k in state if k.endswith(".ln_2.weight"))
    if D % head_dim:
        raise ConfigError(f"d_model={D} is not a multiple of GPT-1's head size {head_dim}; pass config= explicitly")
    return ModelConfig(
        vocab_size=V, n_positions=state["positions_embed.weight"].shape[0], d_model=D, n_layers=n_layers,
        n_heads=D // head_dim, d_mlp=state["h.0.mlp.c_fc.weight"].shape[1],
    )


# ---------------------------------------------------------------------------------------------------
# Public API


def detect_format(path: Path) -> str:
    if (path / "params_shapes.json").is_file():
        return "original"
    if (path / "config.json").is_file():
        return "hf"
    if (path / "config.yaml").is_file() and (path / "params").is_dir():
        return "jax"
    raise CheckpointFormatError(
        f"{path}: not a GPT-1 checkpoint (expected config.json + model.safetensors, "
        f"params_shapes.json + params_*.npy, or config.yaml + params/)"
    )


def load_pretrained(path: str | os.PathLike, config: ModelConfig | None = None) -> tuple[ModelConfig, dict]:
    """Reads any of the three formats -> (config, params). Parameters come back as plain jax arrays.

    `config` overrides the architecture read from the files (needed for original releases whose head
    count is not 12 per 768, as the release format stores no head count); run-time fields such as
    dtype, attention and scan_layers are taken from it too.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointFormatError(f"{path}: no such checkpoint directory")
    fmt = detect_format(path)
    if fmt == "jax":
        return _load_jax(path, config)
    if fmt == "hf":
        try:
            file_config = _config_from_hf(json.loads((path / "config.json").read_text()), str(path))
        except json.JSONDecodeError as e:
            raise CheckpointFormatError(f"{path}/config.json is not valid JSON: {e}") from None
        state = _read_hf_state(path)
    else:
        state = original_arrays_to_hf_state(read_original_arrays(path), str(path))
        file_config = _config_from_original(state) if config is None else config
    config = config or file_config
    return config, hf_state_to_params(config, state, source=str(path))


def _atomic_dir(path: Path, overwrite: bool):
    """A temporary sibling directory, renamed onto `path` by the caller once it is complete."""
    if path.exists() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(f"{path} exists and is not empty; refusing to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))


def _commit_dir(tmp: Path, path: Path):
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def save_pretrained(config: ModelConfig, params, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Writes a HF directory (config.json + model.safetensors) that `OpenAIGPTLMHeadModel.from_pretrained` loads."""
    from safetensors.numpy import save_file

    path = Path(path)
    hf_config = _config_to_hf(config)
    tmp = _atomic_dir(path, overwrite)
    try:
        state = {k: np.ascontiguousarray(v) for k, v in params_to_hf_state(config, params).items()}
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        _commit_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def save_jax(config: ModelConfig, params, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Our own format: config.yaml + an orbax checkpoint of the (unboxed) parameter tree."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    tmp = _atomic_dir(path, overwrite)
    try:
        save_yaml(config, tmp / "config.yaml")
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(tmp / "params", nn.meta.unbox(params))
            ckptr.wait_until_finished()
        _commit_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _load_jax(path: Path, config: ModelConfig | None):
    import orbax.checkpoint as ocp

    file_config = load_yaml(ModelConfig, path / "config.yaml")
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(path.absolute() / "params")
    if config is not None and dataclasses.replace(config, **_runtime_fields(file_config)) != file_config:
        raise ConfigError(f"{path}: the checkpoint's architecture differs from the config given")
    if config is not None and config.scan_layers != file_config.scan_layers:
        state = params_to_hf_state(file_config, params)
        return config, hf_state_to_params(config, state, source=str(path))
    return config or file_config, params


def _runtime_fields(c: ModelConfig) -> dict:
    """Fields that change how a model runs, not which weights it has."""
    names = ("dtype", "param_dtype", "attention", "scan_layers", "remat", "embd_dropout", "attn_dropout", "resid_dropout")
    return {n: getattr(c, n) for n in names}
