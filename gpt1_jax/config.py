"""Typed configuration: the model's dataclass, its named presets, YAML files and `key=value` overrides.

Every config is a frozen dataclass, so a config is a value: it can be hashed, passed to `jax.jit` as a
static argument and written to a workdir as YAML. Bad values fail here, with one line naming the
field, instead of as a shape error deep inside a compiled program.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLS = ("auto", "xla", "dot_product", "cudnn")


class ConfigError(ValueError):
    """A config value that cannot work; the message is one line meant for the user."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """GPT-1's hyper-parameters (REFERENCE.md). Field names follow the paper, not HF's `n_*` names."""

    vocab_size: int = 40478
    n_positions: int = 512
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_mlp: int = 3072
    embd_dropout: float = 0.1
    attn_dropout: float = 0.1
    resid_dropout: float = 0.1
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02
    dtype: str = "float32"  # compute dtype of matmuls and activations
    param_dtype: str = "float32"  # storage dtype of parameters (and so of the optimizer state)
    attention: str = "auto"  # see gpt1_jax.attention.causal_attention
    scan_layers: bool = True  # one compiled block, scanned: compile time no longer grows with depth
    remat: str = "none"  # rematerialisation policy per block: none | full | dots

    def __post_init__(self):
        positive = ("vocab_size", "n_positions", "d_model", "n_layers", "n_heads", "d_mlp")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}")
        for name in ("embd_dropout", "attn_dropout", "resid_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ConfigError(f"model.{name}={getattr(self, name)!r} is not one of {', '.join(DTYPES)}")
        if self.attention not in ATTENTION_IMPLS:
            raise ConfigError(f"model.attention={self.attention!r} is not one of {', '.join(ATTENTION_IMPLS)}")
        if self.remat not in ("none", "full", "dots"):
            raise ConfigError(f"model.remat={self.remat!r} is not one of none, full, dots")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def num_params(self) -> int:
        """All parameters (embeddings included), as the release counts them: 116,534,784 for `gpt1`."""
        d, f, L = self.d_model, self.d_mlp, self.n_layers
        block = (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 4 * d
        return self.vocab_size * d + self.n_positions * d + L * block


MODEL_PRESETS: dict[str, ModelConfig] = {
    # The released 117M model.
    "gpt1": ModelConfig(),
    # A few million parameters: CPU pre-training experiments with a corpus-trained 8k BPE.
    "small": ModelConfig(vocab_size=8192, n_positions=256, d_model=256, n_layers=4, n_heads=4, d_mlp=1024),
    # Tests: compiles and runs in seconds.
    "tiny": ModelConfig(vocab_size=512, n_positions=64, d_model=64, n_layers=2, n_heads=4, d_mlp=256),
}


def model_preset(name: str) -> ModelConfig:
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}") from None


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Turns a YAML/CLI value into the field's declared type (strings from `key=value` included)."""
    kind = typing.get_origin(annotation) or annotation
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        return from_dict(kind, value, prefix=f"{key}.")
    if isinstance(value, str) and kind in (int, float):
        try:  # YAML 1.1 reads "1e-4" as a string; Python's parsers do not
            value = kind(value)
        except ValueError:
            raise ConfigError(f"{key} must be {kind.__name__}, got {value!r}") from None
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (int, float, str) and not (isinstance(value, kind) and not isinstance(value, bool)):
        raise ConfigError(f"{key} must be {kind.__name__}, got {value!r}")
    return value


def from_dict(cls: type[T], values: dict[str, Any], prefix: str = "") -> T:
    """Builds `cls` from a plain mapping, naming the first unknown or ill-typed key."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            raise ConfigError(f"unknown config key {prefix}{key!r}; known: {', '.join(sorted(names))}")
    return cls(**{k: _coerce(v, hints[k], prefix + k) for k, v in values.items()})


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def apply_overrides(config: T, overrides: list[str] | tuple[str, ...]) -> T:
    """`["d_model=128", "optim.lr=1e-3"]` -> a new config; dotted keys reach nested dataclasses."""
    values = to_dict(config)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        *parents, leaf = key.strip().split(".")
        node = values
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"unknown config key {key!r}")
            node = node[part]
        if leaf not in node:
            raise ConfigError(f"unknown config key {key!r}; known: {', '.join(sorted(node))}")
        node[leaf] = yaml.safe_load(raw) if raw.strip() else raw
    return from_dict(type(config), values)


def load_yaml(cls: type[T], path: str | Path) -> T:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must hold a mapping at its top level")
    return from_dict(cls, values)


def save_yaml(config: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def resolve_model_config(spec: str) -> ModelConfig:
    """A preset name (`tiny`, `small`, `gpt1`) or a YAML file of ModelConfig fields."""
    if spec in MODEL_PRESETS:
        return MODEL_PRESETS[spec]
    if spec.endswith((".yaml", ".yml")) or Path(spec).exists():
        return load_yaml(ModelConfig, spec)
    raise ConfigError(f"unknown model config {spec!r}: not a preset ({', '.join(MODEL_PRESETS)}) nor a YAML file")
