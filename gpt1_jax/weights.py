"""Checkpoint import/export: Hugging Face `openai-gpt` directories, OpenAI's original release, and ours.

Formats `load_pretrained` recognises by the files in the directory:
  hf        config.json + model.safetensors (or pytorch_model.bin)      - transformers' OpenAIGPT*
  original  params_shapes.json + params_0.npy ... params_{n-1}.npy      - openai/finetune-transformer-lm
  jax       config.yaml + params/ (an orbax checkpoint of the tree)     - gpt1-jax's own
  run       config.yaml + checkpoints/<step>/state                      - a pre-training or fine-tuning workdir
Every format goes through one flat, HF-named dict of [in, out] float arrays ("the HF state"), so each
needs only a reader or a writer of that dict, and the layout of our tree lives in two functions.
`load_pretrained` is the one way into a model's weights; `convert` writes them out, tokenizer included.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import yaml
from optax.contrib import ScheduleFreeState
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from gpt1_jax.config import (MODEL_PRESETS, RUNTIME_FIELDS, ConfigError, FinetuneConfig, ModelConfig, PretrainConfig,
                             apply_overrides, given_keys, load_yaml, override_key, read_yaml, save_yaml)
from gpt1_jax.errors import CheckpointFormatError, OutputExistsError
from gpt1_jax.files import some_names, staging_folder
from gpt1_jax.integrity import DIGESTS, checkpoint_steps, record, verify
from gpt1_jax.lockfile import remove_abandoned
from gpt1_jax.model import init_params
from gpt1_jax.optim import eval_params, uses_eval_params
from gpt1_jax.tokenizer import find_tokenizer
from gpt1_jax.workdir import read_record

# orbax, and gpt1_jax.checkpoint built on it, are imported inside the functions that read or write orbax's
# format: orbax takes ~0.5 s to import, and `import gpt1_jax` imports this module.

HEAD_DIM = 64  # GPT-1's head size: the original release stores no head count (docs/gpt1.md)

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
    layers = {int(m.group(1)) for k in state if (m := re.match(r"h\.(\d+)\.", k))}
    if layers and max(layers) >= config.n_layers:  # else dropped without a word
        raise CheckpointFormatError(f"{source}: the weights hold {max(layers) + 1} layers (h.0 ... h.{max(layers)}) "
                                    f"but the config has n_layers={config.n_layers} (config.json: n_layer): fix the "
                                    "config")
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


HF_INT_FIELDS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
HF_FLOAT_FIELDS = ("embd_pdrop", "attn_pdrop", "resid_pdrop", "layer_norm_epsilon", "initializer_range")


def _check_hf_types(hf: Any, source: str) -> None:
    """config.json's sizes are integers and its rates numbers (JSON's true is neither), before ModelConfig compares
    them: a "64" or a null there was a TypeError from deep in its checks."""
    if not isinstance(hf, dict):
        raise CheckpointFormatError(f"{source}/config.json holds a JSON {type(hf).__name__}, not an object of settings")
    for key in HF_INT_FIELDS + HF_FLOAT_FIELDS:
        kinds = (int,) if key in HF_INT_FIELDS else (int, float)
        if key in hf and (isinstance(hf[key], bool) or not isinstance(hf[key], kinds)):
            kind = "an integer" if key in HF_INT_FIELDS else "a number"
            raise ConfigError(f"{source}/config.json: {key} must be {kind}, not {json.dumps(hf[key])[:40]}")


def _config_from_hf(hf: dict, source: str) -> ModelConfig:
    _check_hf_types(hf, source)
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
    return _check_tied(_read_hf_files(path), path)


def _check_tied(state: dict[str, np.ndarray], path: Path) -> dict[str, np.ndarray]:
    """GPT-1 ties its LM head to the token embedding, and so does every gpt1-jax model: an HF folder saved with
    tie_word_embeddings false and a head of its own lost that head without a word (other logits, other losses)."""
    head = state.get("lm_head.weight")
    embedding = state.get("transformer.tokens_embed.weight", state.get("tokens_embed.weight"))
    if head is not None and embedding is not None and not np.array_equal(head, embedding):
        raise CheckpointFormatError(f"{path}: its LM head (lm_head.weight) is not the token embedding "
                                    "(tie_word_embeddings false): GPT-1 ties the two, and gpt1-jax has no untied head")
    return state


def _read_hf_files(path: Path) -> dict[str, np.ndarray]:
    if (path / "model.safetensors").is_file():
        try:
            return load_file(path / "model.safetensors")
        except SafetensorError as e:  # truncated or not a safetensors file at all
            raise CheckpointFormatError(f"{path}/model.safetensors is unreadable ({e}): truncated or corrupt") from None
    if (path / "pytorch_model.bin").is_file():
        try:  # optional: only HF's older pytorch_model.bin needs it
            import torch
        except ImportError:
            raise CheckpointFormatError(f"{path}/pytorch_model.bin needs torch to read: pip install torch") from None
        try:
            state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - unpickling garbage raises anything (KeyError, ...): pickle's docs
            raise CheckpointFormatError(f"{path}/pytorch_model.bin is not a PyTorch state dict ({_torch_reason(e)}): "
                                        "truncated or corrupt") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointFormatError(f"{path}/pytorch_model.bin holds a {type(state).__name__}, not a state dict of "
                                        "tensors")
        return {k: v.float().numpy() for k, v in state.items()}
    raise CheckpointFormatError(f"{path}: has config.json but neither model.safetensors nor pytorch_model.bin")


def _torch_reason(e: Exception) -> str:
    """One line of torch.load's error: its weights-only message is a page whose one useful line follows
    "WeightsUnpickler error:"."""
    text = str(e).split("WeightsUnpickler error:", 1)[-1]
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


# ---------------------------------------------------------------------------------------------------
# OpenAI's original release


def read_original_arrays(path: Path) -> list[np.ndarray]:
    """params_shapes.json + params_{i}.npy -> the list of arrays, split and reshaped as released."""
    try:
        shapes = json.loads((path / "params_shapes.json").read_text())
    except json.JSONDecodeError as e:
        raise CheckpointFormatError(f"{path}/params_shapes.json is not valid JSON: {e}") from None
    _check_shapes(shapes, path)
    indices = sorted(int(m.group(1)) for p in path.glob("params_*.npy") if (m := re.fullmatch(r"params_(\d+)", p.stem)))
    if not indices:
        raise CheckpointFormatError(f"{path}: no params_0.npy ... shards beside params_shapes.json")
    missing = sorted(set(range(max(indices) + 1)) - set(indices))
    if missing:
        raise CheckpointFormatError(f"{path}: shard params_{missing[0]}.npy is missing (found {len(indices)} of {max(indices) + 1})")
    flat = np.concatenate([_read_shard(path / f"params_{i}.npy") for i in range(max(indices) + 1)])
    sizes = [int(np.prod(s)) for s in shapes]
    if sum(sizes) != flat.size:
        raise CheckpointFormatError(
            f"{path}: params_shapes.json describes {sum(sizes):,} values but the shards hold {flat.size:,}"
        )
    return [a.reshape(s) for a, s in zip(np.split(flat, np.cumsum(sizes)[:-1]), shapes)]


def _check_shapes(shapes: Any, path: Path) -> None:
    """params_shapes.json: a list of shapes, each a list of non-negative integers (the release's is 146 of them)."""
    def is_shape(s: Any) -> bool:
        return isinstance(s, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in s)

    if not isinstance(shapes, list):
        raise CheckpointFormatError(f"{path}/params_shapes.json holds {type(shapes).__name__} {shapes!r:.40}, not a "
                                    "list of shapes (lists of sizes): damaged; fetch the release again")
    bad = next((i for i, s in enumerate(shapes) if not is_shape(s)), None)
    if bad is not None:
        raise CheckpointFormatError(f"{path}/params_shapes.json: entry {bad} ({shapes[bad]!r:.40}) is not a shape, a "
                                    "list of non-negative integers: damaged; fetch the release again")


def _read_shard(file: Path) -> np.ndarray:
    """One params_{i}.npy, flat: a float array, never unpickled."""
    try:
        shard = np.load(file, allow_pickle=False)
    except (ValueError, EOFError) as e:  # truncated ("EOF: reading array header"), a text file, an object array
        with open(file, "rb") as f:  # numpy calls all but an .npy "pickled data" and says to load it unsafely
            why = str(e).split(". ")[0] if f.read(6) == b"\x93NUMPY" else "not a .npy file"
        raise CheckpointFormatError(f"{file} is unreadable ({why}): truncated or corrupt; fetch the release "
                                    "again") from None
    if not isinstance(shard, np.ndarray):  # an .npz archive under the shard's name
        raise CheckpointFormatError(f"{file} is not a .npy array but a {type(shard).__name__}: fetch the release again")
    if not np.issubdtype(shard.dtype, np.floating):
        raise CheckpointFormatError(f"{file} holds {shard.dtype} values, not floating-point weights: not a shard of "
                                    "the release; fetch it again")
    return shard.reshape(-1)


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


def _config_from_original(state: dict[str, np.ndarray], overrides: Sequence[str], source: str) -> ModelConfig:
    """The release's shapes give every size but the head count: GPT-1's head size unless `n_heads=` is given."""
    sized = {"tokens_embed.weight": "the token embedding", "positions_embed.weight": "the position embedding",
             "h.0.mlp.c_fc.weight": "the first layer's MLP weight"}
    for key, what in sized.items():
        if key not in state:
            raise CheckpointFormatError(f"{source}/params_shapes.json lists no layer, only the embeddings: damaged; "
                                        "fetch the release again")
        if state[key].ndim != 2:
            raise CheckpointFormatError(f"{source}/params_shapes.json: {what} ({key}) has shape "
                                        f"{list(state[key].shape)}, not a matrix: damaged; fetch the release again")
    V, D = state["tokens_embed.weight"].shape
    shapes = ModelConfig(  # one head divides any width; the real count is decided below
        vocab_size=V, n_positions=state["positions_embed.weight"].shape[0], d_model=D,
        n_layers=sum(1 for k in state if k.endswith(".ln_2.weight")), n_heads=1,
        d_mlp=state["h.0.mlp.c_fc.weight"].shape[1],
    )
    config = apply_overrides(shapes, overrides)
    if "n_heads" in given_keys(overrides):
        return config
    if config.d_model % HEAD_DIM:
        raise ConfigError(f"{source}: d_model={config.d_model} is not a multiple of GPT-1's head size {HEAD_DIM} and "
                          f"the release format stores no head count; give it (convert --n-heads N, or n_heads=N)")
    return dataclasses.replace(config, n_heads=config.d_model // HEAD_DIM)


# ---------------------------------------------------------------------------------------------------
# Run workdirs (pre-training and fine-tuning)


def _run_config(path: Path) -> PretrainConfig | FinetuneConfig:
    """A workdir's config.yaml: a FinetuneConfig when it names a `task`, else a PretrainConfig."""
    try:
        raw = read_yaml((path / "config.yaml").read_text())
    except yaml.YAMLError:
        raw = None  # load_yaml reports it
    return load_yaml(FinetuneConfig if isinstance(raw, dict) and "task" in raw else PretrainConfig, path / "config.yaml")


def _schedule_free_path(tree: Any, path: tuple = ()) -> tuple | None:
    """Where an optimizer state's ScheduleFreeState (b1, z, ...) sits in a checkpoint's metadata tree."""
    if isinstance(tree, dict) and set(ScheduleFreeState._fields) <= set(tree):
        return path
    children = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    for key, child in children:
        if (found := _schedule_free_path(child, path + (key,))) is not None:
            return found
    return None


READ_PATIENCE_S = 60.0  # how long a reader goes on reading a run that deletes each checkpoint as it saves the next


RESULTS_FIX = "restore it, delete it (the run's newest checkpoint is then read), or give the step to read (--step)"


def best_step(path: Path) -> int | None:
    """The checkpoint a finished fine-tuning run's results.json describes (its best epoch's `step`, kept whatever
    keep_checkpoints says); None: the newest is the run's (a pre-training run, a fine-tuning run still training,
    or one whose best checkpoint a version older than pinning had rotated out: `step` null). The newest alone
    was read, and convert, sample, evaluate and finetune --init took another epoch than the scores say."""
    if not (path / "results.json").is_file() or not isinstance(_run_config(path), FinetuneConfig):
        return None
    step = read_record(path / "results.json", RESULTS_FIX).get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise CheckpointFormatError(f"{path}/results.json: step {json.dumps(step)[:40]} is not a checkpoint's step: "
                                    f"damaged; {RESULTS_FIX}")
    return step


def _load_run(path: Path, step: int | None) -> tuple[ModelConfig, dict, int]:
    """`_load_checkpoint` of a run at `step`; None: a finished fine-tuning run's best epoch (`best_step`), else
    the newest. A run may be training now: its newest checkpoint can be deleted
    under the reader as the run saves the next (keep_checkpoints=1), which ended in orbax tracebacks; read
    again from the new newest one, as long as the run keeps moving on. Bounded in time, not in tries: a loaded
    machine lost 5 races in a row to a run saving every step."""
    if step is None:
        step = best_step(path)
    deadline = time.monotonic() + READ_PATIENCE_S
    while True:
        before = _checkpoints_now(path)
        try:
            return _load_checkpoint(path, step)
        except Exception:
            # Any change, not only a newer one: with keep_checkpoints=1 the previous checkpoint is deleted after the
            # next one is finished, so a reader can list both and lose the older one under orbax's listing.
            moved_on = step is None and _checkpoints_now(path) != before
            if not moved_on or time.monotonic() > deadline:
                raise


def _checkpoints_now(path: Path) -> list[int] | None:
    try:
        return checkpoint_steps(path / "checkpoints")
    except OSError:
        return None


def _load_checkpoint(path: Path, step: int | None) -> tuple[ModelConfig, dict, int]:
    """-> (saved model config, transformer params, step). A fine-tuning run's params are
    {"transformer", "head"}: the transformer is returned (`scored_params` reads both)."""
    run = _run_config(path)
    params, step = scored_params(path, run, step, ("params", "transformer") if isinstance(run, FinetuneConfig)
                                 else ("params",))
    return run.model, params, step


def scored_params(path: Path, run: PretrainConfig | FinetuneConfig, step: int | None,
                  model_path: tuple[str, ...] = ("params",)) -> tuple[dict, int]:
    """The params under `model_path` of checkpoint `step` of the run in `path` whose config is `run` -> (params,
    step). Schedule-free runs give their x sequence (`optim.eval_params`), the point they are evaluated and exported
    at, not the gradient point y."""
    from gpt1_jax.checkpoint import restore_params, state_metadata  # orbax: see the note at the top

    (params,), step = restore_params(path / "checkpoints", [model_path], step=step)
    if uses_eval_params(run.optim.name):
        sf_path = _schedule_free_path(state_metadata(path / "checkpoints", step).get("opt_state"), ("opt_state",))
        if sf_path is None:
            raise CheckpointFormatError(f"{path}: optim.name={run.optim.name} but checkpoint {step} holds no "
                                        f"schedule-free optimizer state")
        (b1, z), _ = restore_params(path / "checkpoints", [sf_path + ("b1",), sf_path + ("z",) + model_path[1:]],
                                    step=step)
        sf_state = ScheduleFreeState(b1=b1, weight_sum=None, step_count=None, max_lr=None, base_optimizer_state=None, z=z)
        params = jax.tree.map(lambda x, p: x.astype(p.dtype), eval_params(sf_state, params), params)
    return params, step


# ---------------------------------------------------------------------------------------------------
# Public API


def detect_format(path: Path) -> str:
    if (path / "params_shapes.json").is_file():
        return "original"
    if (path / "config.json").is_file():
        return "hf"
    if (path / "config.yaml").is_file() and (path / "params").is_dir():
        return "jax"
    if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
        return "run"
    if path.name.isdigit() and path.parent.name == "checkpoints" and (path.parent.parent / "config.yaml").is_file():
        run = path.parent.parent
        raise CheckpointFormatError(f"{path} is one checkpoint of the run {run}: give the run and the step (--init {run} "
                                    f"--step {path.name}; `convert {run} DST --step {path.name}`)")
    raise CheckpointFormatError(
        f"{path}: not a GPT-1 checkpoint (expected config.json + model.safetensors, "
        f"params_shapes.json + params_*.npy, config.yaml + params/, or a run's config.yaml + checkpoints/)"
    )


def load_pretrained(path: str | os.PathLike, config: ModelConfig | None = None, *, step: int | None = None,
                    overrides: Sequence[str] = ()) -> tuple[ModelConfig, dict]:
    """`read_model` -> (config, params)."""
    return read_model(path, config, step=step, overrides=overrides)[:2]


def read_model(path: str | os.PathLike, config: ModelConfig | None = None, *, step: int | None = None,
               overrides: Sequence[str] = ()) -> tuple[ModelConfig, dict, int | None]:
    """Reads any of the formats above -> (config, params, the run checkpoint's step read, else None), params as
    plain (unboxed) jax arrays. A run is read at `step`; None: a finished fine-tuning run's best epoch (the step
    its results.json names), else its newest checkpoint.

    The architecture is the one the files record; `config` contributes its RUNTIME_FIELDS (dtype,
    attention, scan_layers, dropout, ...), and the tree is re-laid out for them. Original releases
    record no head count: there `config` is taken whole, or `n_heads=` given in `overrides`.
    `overrides` are `key=value` settings of the model config (run-time fields only, except on an
    original release).
    """
    path = Path(path)
    if not path.is_dir():
        what = ("a file, not a model's folder (a run, an HF folder, OpenAI's release or a convert --to jax folder)"
                if path.is_file() else "no such checkpoint directory")
        raise CheckpointFormatError(f"{path}: {what}")
    fmt = detect_format(path)
    if step is not None and fmt != "run":
        raise ConfigError(f"{path}: step={step} only applies to a run workdir's checkpoints/")
    if fmt == "original":
        state = original_arrays_to_hf_state(read_original_arrays(path), str(path))
        if config is None:
            config = _config_from_original(state, overrides, str(path))
        else:
            config = apply_overrides(config, overrides)
        return config, _check_finite(hf_state_to_params(config, state, source=str(path)), str(path), fmt), None
    if fmt == "hf":
        try:
            saved = _config_from_hf(json.loads((path / "config.json").read_text()), str(path))
        except json.JSONDecodeError as e:
            raise CheckpointFormatError(f"{path}/config.json is not valid JSON: {e}") from None
        final = _runtime_config(saved, config, overrides, str(path))
        return final, _check_finite(hf_state_to_params(final, _read_hf_state(path), source=str(path)), str(path), fmt), None
    if fmt == "jax":
        _check_digests(path)
        saved = load_yaml(ModelConfig, path / "config.yaml")
        params = _read_jax_params(path)
        source = str(path)
    else:
        saved, params, step = _load_run(path, step)
        source = f"{path} step {step}"
    _check_tree(saved, params, source)
    _check_finite(params, source, fmt)
    final = _runtime_config(saved, config, overrides, source)
    if (final.scan_layers, final.param_dtype) != (saved.scan_layers, saved.param_dtype):
        params = hf_state_to_params(final, params_to_hf_state(saved, params), source=source)
    return final, params, step


def _read_index(folder: Path) -> None:
    """Reads an OCDBT checkpoint's index (manifest.ocdbt and the tree under d/) once: orbax reads it once per array,
    all at once, and a damaged one failed them all, the reads still running when the first failure closed orbax's
    event loop echoing "Event loop is closed" as late as the interpreter's exit (past any hook)."""
    import tensorstore as ts  # orbax's own storage layer

    if not (folder / "manifest.ocdbt").is_file():
        return  # not OCDBT (an older orbax's layout): orbax reports whatever is wrong with it
    store = ts.KvStore.open({"driver": "ocdbt", "base": {"driver": "file", "path": f"{folder}/"}}).result()
    if not store.list().result():
        raise ValueError("its index (manifest.ocdbt) lists no arrays")


def _check_digests(path: Path) -> None:
    """`save_jax`'s params/ whose files differ from the digests they were written with are refused: a flipped byte
    in an array file was read as other weights without a word (orbax does not check its data). Folders written
    before the digests are read as they are."""
    if not (path / "params" / DIGESTS).is_file():
        return
    problem = verify(path / "params")
    if problem is not None:
        raise CheckpointFormatError(f"{path}: its weights (params/) are damaged ({problem}); export the model again "
                                    f"(gpt1-jax convert SRC {path} --to jax)")


def _read_jax_params(path: Path) -> dict:
    """`save_jax`'s params/; a damaged one (a file of it truncated, corrupt or deleted) is one error naming the folder,
    not orbax's traceback."""
    import orbax.checkpoint as ocp  # see the note at the top

    from gpt1_jax.checkpoint import orbax_error_line, quiet_orbax_echoes

    quiet_orbax_echoes()  # orbax's reads abandoned when one fails echo as for a run's checkpoint: quieted the same way
    try:
        _read_index(path.absolute() / "params")
        with ocp.StandardCheckpointer() as ckptr:
            return ckptr.restore(path.absolute() / "params")
    except Exception as e:  # noqa: BLE001 - narrowed below: orbax wraps an array's failed read in a bare Exception
        # tensorstore's read errors (NOT_FOUND, DATA_LOSS, OUT_OF_RANGE, ...) and json's are ValueErrors; a missing
        # _METADATA is orbax's FileNotFoundError. Anything else (a permission error, a bug) keeps its own report.
        if not (isinstance(e, (ValueError, FileNotFoundError)) or type(e) is Exception):
            raise
        reason = orbax_error_line(e.__cause__ if type(e) is Exception and e.__cause__ is not None else e)
    # Raised out here, not from the handler, whose exception would hold orbax's abandoned reads up to exit (as its
    # context): they are closed now, while the hook above quiets them, and not echoed at exit past it.
    gc.collect()
    raise CheckpointFormatError(f"{path}: its weights (params/) are damaged and cannot be read ({reason}): truncated "
                                f"or corrupt; export the model again (gpt1-jax convert SRC {path} --to jax)")


def _check_finite(params: dict, source: str, fmt: str) -> dict:
    """Weights that are NaN or inf (a run that diverged, saved before gpt1-jax checked its gradients) made every
    verb go on: sample printed <unk>, evaluate a NaN loss, fine-tuning stopped at step 1 asking for a lower lr."""
    for keys, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not bool(jnp.isfinite(leaf).all()):  # where the array is: no host copy of a large model
            name = "/".join(str(getattr(k, "key", k)) for k in keys)
            fix = {"run": "the run had diverged when this was saved; use an earlier checkpoint (--step)",
                   "original": "the release's files are damaged; fetch them again"}.get(
                fmt, "damaged, or converted from a run that had diverged; convert an earlier checkpoint of that run")
            raise CheckpointFormatError(f"{source}: {name} holds NaN or inf weights: {fix}")
    return params


def _only_runtime(overrides: Sequence[str], source: str) -> None:
    """Architecture fields are refused; a key that is no field at all is left to `apply_overrides`, which names it
    as unknown (it was "records its architecture ... not 'foo'")."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    fixed = [o for o in overrides if override_key(o) not in RUNTIME_FIELDS and override_key(o).split(".")[0] in fields]
    if fixed:
        raise ConfigError(f"{source} records its architecture; only run-time fields ({', '.join(RUNTIME_FIELDS)}) "
                          f"can be set, not {override_key(fixed[0])!r}")


def check_model_sets(path: str | os.PathLike, overrides: Sequence[str], preset: str | None = None) -> None:
    """Model `key=value` settings for the model folder `path`: only run-time fields, since every format but
    OpenAI's release records its architecture (finetune dropped an architecture field without a word); and a
    `--config` `preset` (a YAML file's model fields are `overrides`) only of the architecture `path` records:
    `finetune --config tiny --init R` trained R's model, not tiny's, without a word."""
    path = Path(path)
    if detect_format(path) == "original":  # its architecture is the config's
        return
    _only_runtime(overrides, str(path))
    if preset not in MODEL_PRESETS:
        return
    # The vocabulary is the tokenizer's (and a fine-tuning run's has the 3 markers more): not the preset's choice.
    want, have = MODEL_PRESETS[preset].architecture(), _recorded_architecture(path).architecture()
    differ = [k for k in want if k != "vocab_size" and want[k] != have[k]]
    if differ:
        shown = ", ".join(f"{k}={want[k]} in {preset}, {have[k]} in the files" for k in differ[:3])
        raise ConfigError(f"--config {preset} is another architecture than {path} records ({shown}): leave --config "
                          f"out (only the model's run-time fields, {', '.join(RUNTIME_FIELDS)}, can change), or give "
                          "one of that architecture")


def _recorded_architecture(path: Path) -> ModelConfig:
    """The model a folder of any format but OpenAI's release records, read without its weights."""
    fmt = detect_format(path)
    if fmt == "hf":
        try:
            return _config_from_hf(json.loads((path / "config.json").read_text()), str(path))
        except json.JSONDecodeError as e:
            raise CheckpointFormatError(f"{path}/config.json is not valid JSON: {e}") from None
    return load_yaml(ModelConfig, path / "config.yaml") if fmt == "jax" else _run_config(path).model


def _runtime_config(saved: ModelConfig, config: ModelConfig | None, overrides: Sequence[str], source: str) -> ModelConfig:
    """The recorded architecture, run as `config` runs, then run-time `key=value` overrides."""
    _only_runtime(overrides, source)
    return apply_overrides(saved if config is None else saved.with_runtime_of(config), overrides)


def _check_tree(config: ModelConfig, params, source: str) -> None:
    """One error unless `params` has exactly the names and shapes of `config`'s model."""
    def shapes(tree) -> dict[str, tuple[int, ...]]:
        return {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(tree)}

    want = shapes(nn.meta.unbox(jax.eval_shape(functools.partial(init_params, config), jax.random.key(0))))
    have = shapes(params)
    for key in sorted(set(want) | set(have)):
        if key not in have:
            raise CheckpointFormatError(f"{source}: parameter {key} is missing; the saved config expects it "
                                        f"with shape {want[key]}")
        if key not in want:
            raise CheckpointFormatError(f"{source}: parameter {key} {have[key]} is not in the saved config's model")
        if want[key] != have[key]:
            raise CheckpointFormatError(f"{source}: parameter {key} has shape {have[key]} but the saved config "
                                        f"expects {want[key]}")


def _refuse_overwrite(path: Path, overwrite: bool) -> None:
    """A non-empty `path` is refused, and with `overwrite` too unless it holds a model folder (what
    `save_pretrained`, `save_jax` or HF wrote): never a run's folder, never a folder of anything else."""
    if path.exists() and not path.is_dir():
        raise OutputExistsError(f"{path} is a file, not a folder: pick a new or empty folder")
    held = sorted(p.name for p in path.iterdir()) if path.exists() else []
    if not held:
        return
    if not overwrite:
        raise FileExistsError(f"{path} exists and is not empty; refusing to overwrite it")
    why = "it replaces only a model folder; pick an empty or new folder"
    if marks := [n for n in ("run.json", "checkpoints", "metrics.jsonl") if n in held]:
        raise OutputExistsError(f"{path} holds a gpt1-jax run ({', '.join(marks)}), which --overwrite would delete: {why}")
    if not ((path / "config.json").is_file() or ((path / "config.yaml").is_file() and (path / "params").is_dir())):
        raise OutputExistsError(f"{path} holds {some_names(held)} and no model (no config.json, nor config.yaml with params/), "
                                f"which --overwrite would delete: {why}")


def _destination(path: str | os.PathLike) -> Path:
    """Where a model folder is written: a symbolic link's target (the link stays: replacing the folder would
    have replaced the link, `models/current -> v1`, with a folder, and left the link under a .old- name)."""
    path = Path(path)
    return path.resolve() if path.is_symlink() else path


def _staging_folder(path: Path, overwrite: bool):
    """files.staging_folder beside `path`, for `_commit_dir` once it is complete; the old folders a killed writer
    had moved aside (`_commit_dir`: killed while deleting one, or between its renames) are removed first once
    `path` stands."""
    _refuse_overwrite(path, overwrite)
    if path.exists():  # else a kill between the renames left the old model only under its .old- name: kept
        remove_abandoned(path.parent, f".{path.name}.old-")
    return staging_folder(path)


def _commit_dir(tmp: Path, path: Path):
    """`tmp` becomes `path`; an old `path` is moved aside first and deleted last, so that a kill at any point
    leaves the old folder or the new one in place (or both, the old one under a .old- name)."""
    umask = os.umask(0)
    os.umask(umask)
    # safetensors' 0600 would make the model private to its writer: the umask's, as any file
    for entry in [tmp, *tmp.rglob("*")]:
        entry.chmod((0o777 if entry.is_dir() else 0o666) & ~umask)
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
    tmp.rename(path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_pretrained(config: ModelConfig, params, path: str | os.PathLike, *, overwrite: bool = False,
                    tokenizer=None, dtype: str = "float32") -> Path:
    """Writes a HF directory (config.json + model.safetensors) that `OpenAIGPTLMHeadModel.from_pretrained`
    loads, with `tokenizer` (a GPT1Tokenizer) in the files transformers' tokenizers read. `dtype="bfloat16"`
    stores the weights at half the size (every reader here loads them back as float32)."""
    path = _destination(path)
    hf_config = _config_to_hf(config)
    with _staging_folder(path, overwrite) as tmp:
        state = {k: np.ascontiguousarray(v.astype(dtype)) for k, v in params_to_hf_state(config, params).items()}
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        if tokenizer is not None:
            tokenizer.save_hf(tmp, model_max_length=config.n_positions)
        _commit_dir(tmp, path)
    return path


def save_jax(config: ModelConfig, params, path: str | os.PathLike, *, overwrite: bool = False,
             tokenizer=None) -> Path:
    """Our own format: config.yaml + an orbax checkpoint of the (unboxed) parameter tree, and the
    tokenizer (a GPT1Tokenizer) as tokenizer.json; params/integrity.json holds each of its files' digests."""
    import orbax.checkpoint as ocp  # see the note at the top

    path = _destination(path).absolute()
    with _staging_folder(path, overwrite) as tmp:
        save_yaml(config, tmp / "config.yaml")
        if tokenizer is not None:
            tokenizer.save(tmp / "tokenizer.json")
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(tmp / "params", nn.meta.unbox(params))
            ckptr.wait_until_finished()
        record(tmp / "params")  # each weights file's digest, checked where the folder is read (_check_digests)
        _commit_dir(tmp, path)
    return path


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, to: str = "hf", overwrite: bool = False,
            overrides: Sequence[str] = (), step: int | None = None) -> tuple[ModelConfig, Path, int | None]:
    """Any format `read_model` reads -> a HF folder (`to="hf"`) or ours (`"jax"`), with the tokenizer SRC holds, if
    any -> (config, the folder written, the run checkpoint's step read, else None). `overrides` and `step` are
    read_model's (e.g. `n_heads=N` for a release)."""
    if to not in ("hf", "jax"):
        raise ConfigError(f"convert: to={to!r} is not hf or jax")
    if Path(dst).exists() and Path(dst).resolve() in (Path(src).resolve(), *Path(src).resolve().parents):
        raise ConfigError(f"{dst} is the model converted, or holds it; --overwrite would delete what is read: "
                          "pick a new or empty folder")
    try:
        _refuse_overwrite(_destination(dst), overwrite)  # before reading the weights, which may take a while
    except OutputExistsError:
        raise
    except FileExistsError:
        raise OutputExistsError(f"{dst} is not empty; nothing was written: pass --overwrite to replace what is in "
                                "it, or pick an empty or new folder") from None
    config, params, step = read_model(src, step=step, overrides=overrides)
    tokenizer = find_tokenizer(None, Path(src), model_vocab_size=config.vocab_size)
    save = save_pretrained if to == "hf" else save_jax
    return config, save(config, params, dst, overwrite=overwrite, tokenizer=tokenizer), step
