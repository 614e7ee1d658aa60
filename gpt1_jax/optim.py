"""Optimizers and learning-rate schedules, built only from optax's own transforms.

The GPT-1 optimizer (REFERENCE.md): global-norm clipping at 1.0, then Adam (b1 0.9, b2 0.999, eps 1e-8)
with decoupled weight decay 0.01 on weight matrices and embeddings only. optax.adamw multiplies the
decay by the scheduled lr, exactly as the original's `p -= lr_t * (m_hat/(sqrt(v_hat)+eps) + 0.01 p)`.

Optimizers and schedules are chosen by name from registries, so adding lion/adafactor/... is one entry.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import optax

from gpt1_jax.config import ConfigError


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    name: str = "gpt1_adam"
    lr: float = 2.5e-4  # peak lr (pre-training value; fine-tuning used 6.25e-5)
    schedule: str = "warmup_cosine"
    warmup_steps: int = 2000
    total_steps: int = 100_000
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    clip_norm: float = 1.0  # 0 disables clipping
    momentum: float = 0.9  # sgd only

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ConfigError(f"optim.name={self.name!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"optim.schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.lr < 0 or self.weight_decay < 0 or self.clip_norm < 0 or self.eps < 0:
            raise ConfigError("optim.lr, weight_decay, clip_norm and eps must be >= 0")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            raise ConfigError(f"optim.b1/b2 must lie in [0, 1), got {self.b1}, {self.b2}")
        if self.warmup_steps < 0 or self.total_steps < 1:
            raise ConfigError(f"optim.warmup_steps must be >= 0 and total_steps >= 1")
        if self.schedule != "constant" and self.warmup_steps > self.total_steps:
            raise ConfigError(f"optim.warmup_steps={self.warmup_steps} exceeds total_steps={self.total_steps}")


# ---- schedules: step -> lr ------------------------------------------------------------------------

def _warmup(cfg: OptimConfig) -> optax.Schedule:
    return optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)


def _warmup_then(cfg: OptimConfig, after: optax.Schedule) -> optax.Schedule:
    if cfg.warmup_steps == 0:  # optax.linear_schedule(…, 0) would hold 0.0 forever
        return after
    return optax.join_schedules([_warmup(cfg), after], [cfg.warmup_steps])


def warmup_linear(cfg: OptimConfig) -> optax.Schedule:
    """0 -> lr over warmup, then linearly to 0 at total_steps (the fine-tuning schedule)."""
    return _warmup_then(cfg, optax.linear_schedule(cfg.lr, 0.0, cfg.total_steps - cfg.warmup_steps))


def warmup_cosine(cfg: OptimConfig) -> optax.Schedule:
    """0 -> lr over warmup, then cosine to 0 at total_steps (the pre-training schedule)."""
    return optax.warmup_cosine_decay_schedule(0.0, cfg.lr, cfg.warmup_steps, cfg.total_steps, end_value=0.0)


def warmup_constant(cfg: OptimConfig) -> optax.Schedule:
    return _warmup_then(cfg, optax.constant_schedule(cfg.lr))


def constant(cfg: OptimConfig) -> optax.Schedule:
    return optax.constant_schedule(cfg.lr)


SCHEDULES: dict[str, Callable[[OptimConfig], optax.Schedule]] = {
    "warmup_linear": warmup_linear,
    "warmup_cosine": warmup_cosine,
    "warmup_constant": warmup_constant,
    "constant": constant,
}


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
    return SCHEDULES[cfg.schedule](cfg)


# ---- which leaves decay ---------------------------------------------------------------------------

DECAYED_LEAF_NAMES = ("kernel", "embedding")


def _leaf_name(path) -> str:
    # Last dict key; nn.Partitioned boxes add an attribute key (`.value`) after it.
    keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    return str(keys[-1]) if keys else ""


def decay_mask(params) -> Any:
    """True for weight matrices (`kernel`) and embeddings (`embedding`); False for biases and LayerNorm.

    By name, not rank: with scan_layers every bias and LayerNorm vector has a leading layer axis, so
    the common "ndim >= 2" rule would wrongly decay them."""
    return jax.tree_util.tree_map_with_path(lambda path, _: _leaf_name(path) in DECAYED_LEAF_NAMES, params)


# ---- optimizers: (cfg, schedule, params) -> GradientTransformation ---------------------------------

def _clipped(cfg: OptimConfig, tx: optax.GradientTransformation) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx) if cfg.clip_norm > 0 else tx


def gpt1_adam(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    """The paper's optimizer: Adam's constants pinned (b1 0.9, b2 0.999, eps 1e-8) whatever the config
    says; lr, schedule, weight decay and clipping still come from it."""
    return _clipped(cfg, optax.adamw(schedule, 0.9, 0.999, 1e-8, weight_decay=cfg.weight_decay,
                                     mask=decay_mask(params)))


def adamw(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    """AdamW with every constant from the config (e.g. b2 0.95 for larger-batch pre-training)."""
    return _clipped(cfg, optax.adamw(schedule, cfg.b1, cfg.b2, cfg.eps, weight_decay=cfg.weight_decay,
                                     mask=decay_mask(params)))


def lion(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    return _clipped(cfg, optax.lion(schedule, cfg.b1, cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask(params)))


def adafactor(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    return _clipped(cfg, optax.adafactor(schedule, weight_decay_rate=cfg.weight_decay or None,
                                         weight_decay_mask=decay_mask(params)))


def sgd(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    return _clipped(cfg, optax.chain(optax.add_decayed_weights(cfg.weight_decay, decay_mask(params)),
                                     optax.sgd(schedule, momentum=cfg.momentum or None)))


OPTIMIZERS: dict[str, Callable[[OptimConfig, optax.Schedule, Any], optax.GradientTransformation]] = {
    "gpt1_adam": gpt1_adam,
    "adamw": adamw,
    "lion": lion,
    "adafactor": adafactor,
    "sgd": sgd,
}


def make_optimizer(cfg: OptimConfig, params) -> optax.GradientTransformation:
    """The optimizer named by `cfg.name`, its masks derived from `params` (real, abstract or boxed:
    only the tree's structure, names and ranks are read; boxes are stripped first)."""
    import flax.linen as nn

    return OPTIMIZERS[cfg.name](cfg, make_schedule(cfg), nn.meta.unbox(params))
