"""Optimizers and learning-rate schedules, built only from optax's own transforms.

The GPT-1 optimizer (docs/gpt1.md): global-norm clipping at 1.0, then Adam (b1 0.9, b2 0.999, eps 1e-8)
with decoupled weight decay 0.01 on weight matrices and embeddings only. optax.adamw multiplies the
decay by the scheduled lr, exactly as the original's `p -= lr_t * (m_hat/(sqrt(v_hat)+eps) + 0.01 p)`.

Optimizers and schedules are chosen by name from registries, so adding lion/adafactor/... is one entry here
and its row in gpt1_jax/config.py's OPTIMIZER_READS (what a config may say, and which of its fields the builder
reads: a field given to an optimizer that ignores it is refused), a schedule's name in SCHEDULE_NAMES.

Registered optimizers (all optax; each builds on the real, scanned parameter tree):
  gpt1_adam      clip + AdamW with the paper's constants pinned
  adamw          clip + AdamW, every constant from the config
  lion           clip + optax.lion (b1, b2 from the config: Lion's own defaults are b1 0.9, b2 0.99)
  adafactor      clip + optax.adafactor (factored second moments; updates scaled by parameter RMS), lr
                 applied after its weight decay
  sgd            clip + SGD with (heavy-ball) momentum; weight decay is coupled L2: weight_decay x param added to
                 the gradient (masked) before the momentum, which accumulates it (not the AdamWs' decoupled decay)
  sgd_nesterov   the same with Nesterov momentum
  muon           clip + optax.contrib.muon on the blocks' weight matrices, AdamW on the rest
                 (embeddings decayed, biases/LayerNorm not); see `muon_dimension_numbers`
  schedule_free_adamw  clip + optax.contrib.schedule_free around RMS scaling (= schedule_free_adamw with
                 the decay mask); evaluate at `eval_params(opt_state, params)`, not at `params`
  lamb           clip + optax.lamb (layer-wise trust ratio), decay mask as AdamW
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, ScheduleFreeState, schedule_free, schedule_free_eval_params
from optax.contrib import muon as optax_muon

from gpt1_jax.config import GPT1_ADAM, OPTIMIZER_NAMES, ConfigError, OptimConfig


# ---- schedules: step -> lr ------------------------------------------------------------------------
# Each takes the peak lr apart from the config: the compiled step passes it as a traced scalar, so runs that
# differ only in lr (a sweep's grid) share one program (gpt1_jax/step.py).

Peak = Any  # a float, or a traced float32 scalar inside the compiled step


def _warmup(cfg: OptimConfig, lr: Peak) -> optax.Schedule:
    return optax.linear_schedule(0.0, lr, cfg.warmup_steps)


def _warmup_then(cfg: OptimConfig, lr: Peak, after: optax.Schedule) -> optax.Schedule:
    if cfg.warmup_steps == 0:  # optax.linear_schedule(…, 0) would hold 0.0 forever
        return after
    return optax.join_schedules([_warmup(cfg, lr), after], [cfg.warmup_steps])


def warmup_linear(cfg: OptimConfig, lr: Peak) -> optax.Schedule:
    """0 -> lr over warmup, then linearly to 0 at total_steps (the fine-tuning schedule)."""
    return _warmup_then(cfg, lr, optax.linear_schedule(lr, 0.0, cfg.total_steps - cfg.warmup_steps))


def warmup_cosine(cfg: OptimConfig, lr: Peak) -> optax.Schedule:
    """0 -> lr over warmup, then cosine to 0 at total_steps (the pre-training schedule). The parts of
    optax.warmup_cosine_decay_schedule, which cannot take a traced peak (it compares it with 0)."""
    return _warmup_then(cfg, lr, optax.cosine_decay_schedule(lr, cfg.total_steps - cfg.warmup_steps, alpha=0.0))


def warmup_constant(cfg: OptimConfig, lr: Peak) -> optax.Schedule:
    return _warmup_then(cfg, lr, optax.constant_schedule(lr))


def constant(cfg: OptimConfig, lr: Peak) -> optax.Schedule:
    return optax.constant_schedule(lr)


SCHEDULES: dict[str, Callable[[OptimConfig, Peak], optax.Schedule]] = {
    "warmup_linear": warmup_linear,
    "warmup_cosine": warmup_cosine,
    "warmup_constant": warmup_constant,
    "constant": constant,
}


def make_schedule(cfg: OptimConfig, lr: Peak | None = None) -> optax.Schedule:
    """`cfg`'s schedule peaking at `lr` (default `cfg.lr`)."""
    return SCHEDULES[cfg.schedule](cfg, cfg.lr if lr is None else lr)


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
    """The paper's optimizer: Adam's constants pinned (b1 0.9, b2 0.999, eps 1e-8; a config saying otherwise is
    refused); lr, schedule, weight decay and clipping come from the config."""
    return _clipped(cfg, optax.adamw(schedule, *GPT1_ADAM, weight_decay=cfg.weight_decay, mask=decay_mask(params)))


def adamw(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    """AdamW with every constant from the config (e.g. b2 0.95 for larger-batch pre-training)."""
    return _clipped(cfg, optax.adamw(schedule, cfg.b1, cfg.b2, cfg.eps, weight_decay=cfg.weight_decay,
                                     mask=decay_mask(params)))


def lion(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    return _clipped(cfg, optax.lion(schedule, cfg.b1, cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask(params)))


def adafactor(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    """optax.adafactor with its defaults (factored second moments, updates scaled by each parameter's
    RMS, so `lr` is relative; update clipping at 1.0), decay_rate and momentum from the config.

    The lr is applied last, so that weight decay is lr x weight_decay x param as in every other
    optimizer here: optax.adafactor adds its decay after its lr, an lr-independent shrink each step that
    overpowers the decaying updates late in a schedule (docs/stack.md, "Optimizers")."""
    base = optax.adafactor(None, decay_rate=cfg.adafactor_decay_rate, momentum=cfg.adafactor_momentum or None,
                           weight_decay_rate=cfg.weight_decay or None, weight_decay_mask=decay_mask(params))
    return _clipped(cfg, optax.chain(base, optax.scale_by_learning_rate(schedule, flip_sign=False)))


def sgd(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    return _clipped(cfg, optax.chain(optax.add_decayed_weights(cfg.weight_decay, decay_mask(params)),
                                     optax.sgd(schedule, momentum=cfg.momentum or None)))


def sgd_nesterov(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    """SGD with Nesterov momentum `cfg.momentum`; weight decay as sgd's (coupled L2, masked)."""
    return _clipped(cfg, optax.chain(optax.add_decayed_weights(cfg.weight_decay, decay_mask(params)),
                                     optax.sgd(schedule, momentum=cfg.momentum or None, nesterov=cfg.momentum > 0)))


def lamb(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    """LAMB: Adam's direction, rescaled per leaf by ||param|| / ||update|| (trust ratio)."""
    return _clipped(cfg, optax.lamb(schedule, cfg.b1, cfg.b2, cfg.eps, weight_decay=cfg.weight_decay,
                                    mask=decay_mask(params)))


# ---- Muon -----------------------------------------------------------------------------------------

# How each weight matrix is seen by Muon, as (reduction axes, output axes) counted from the END, so the
# same numbers hold with and without scan_layers: every other (leading) axis is a batch axis, i.e. each
# layer's matrix is orthogonalised on its own. c_attn [(L,) D, 3, H, K]: input D against output H*K,
# batched over (L, qkv), so q, k and v are three separate D x D matrices per layer (as modded-nanogpt
# splits the fused QKV); attn c_proj [(L,) H, K, D]: H*K x D; mlp c_fc [(L,) D, F], c_proj [(L,) F, D].
_MUON_AXES: dict[tuple[str, str], tuple[tuple[int, ...], tuple[int, ...]]] = {
    ("attn", "c_attn"): ((-4,), (-2, -1)),
    ("attn", "c_proj"): ((-3, -2), (-1,)),
    ("mlp", "c_fc"): ((-2,), (-1,)),
    ("mlp", "c_proj"): ((-2,), (-1,)),
}


def _dict_keys(path) -> tuple[str, ...]:
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def muon_dimension_numbers(params) -> Any:
    """A tree like `params`: optax MuonDimensionNumbers for the transformer blocks' kernels, None for
    everything else (embeddings, biases, LayerNorm, task heads: those go to AdamW)."""
    def spec(path, leaf):
        keys = _dict_keys(path)
        if not keys or keys[-1] != "kernel":
            return None
        if keys[-3:-1] not in _MUON_AXES:
            return None  # e.g. a fine-tuning head [D, n_outputs]: AdamW, as the embeddings
        red, out = _MUON_AXES[keys[-3:-1]]
        if len(red) + len(out) > leaf.ndim:
            raise ConfigError(f"muon: kernel {'/'.join(keys)} of rank {leaf.ndim} is too small for {red}, {out}")
        return MuonDimensionNumbers(reduction_axis=red, output_axis=out)

    return jax.tree_util.tree_map_with_path(spec, params)


def muon(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    """Muon (optax.contrib.muon) on the blocks' kernels, AdamW on the rest (embeddings, biases,
    LayerNorm, a fine-tuning head).

    optax's muon has its own AdamW branch for the non-matrix leaves but without a decay mask (it
    would decay biases and LayerNorm), so the tree is partitioned here instead: the kernels go to
    optax.contrib.muon (all of its leaves are matrices, its inner Adam branch stays empty) with
    decoupled decay `weight_decay` x lr, and the rest to optax.adamw with `decay_mask` (embeddings
    decayed, biases and LayerNorm not) at lr x muon_adam_lr_ratio."""
    dims = muon_dimension_numbers(params)
    labels = jax.tree.map(lambda d: "adam" if d is None else "muon", dims, is_leaf=lambda d: d is None or
                          isinstance(d, tuple))
    matrix_tx = optax_muon(
        schedule, ns_steps=cfg.muon_ns_steps, beta=cfg.muon_beta, eps=cfg.eps, weight_decay=cfg.weight_decay,
        nesterov=True, consistent_rms=cfg.muon_consistent_rms or None,
        muon_weight_dimension_numbers=lambda p: muon_dimension_numbers(p),
    )
    ratio = cfg.muon_adam_lr_ratio
    adam_lr = schedule if ratio == 1.0 else (lambda step: ratio * schedule(step))
    rest_tx = optax.adamw(adam_lr, cfg.b1, cfg.b2, cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask(params))
    return _clipped(cfg, optax.partition({"muon": matrix_tx, "adam": rest_tx}, labels))


# ---- schedule-free --------------------------------------------------------------------------------

def schedule_free_adamw(cfg: OptimConfig, schedule: optax.Schedule, params) -> optax.GradientTransformation:
    """optax.contrib.schedule_free_adamw, built from the same parts so the decay can be masked: RMS
    scaling (b2, eps; no first moment: the y/x/z interpolation replaces momentum), masked decoupled
    decay, lr, wrapped in optax.contrib.schedule_free(b1=sf_b1). Use a schedule without decay
    (`warmup_constant` or `constant`); the gradient is taken at y (= TrainState.params) and the model to
    evaluate or keep is x = `eval_params(opt_state, params)`."""
    base = optax.chain(
        optax.scale_by_rms(decay=cfg.b2, eps=cfg.eps, eps_in_sqrt=False, bias_correction=True),
        optax.add_decayed_weights(cfg.weight_decay, decay_mask(params)),
        optax.scale_by_learning_rate(schedule),
    )
    return _clipped(cfg, schedule_free(base, learning_rate=schedule, b1=cfg.sf_b1,
                                       weight_lr_power=cfg.sf_weight_lr_power))


def _is_sf_state(x) -> bool:
    return isinstance(x, ScheduleFreeState)


def eval_params(opt_state, params):
    """The parameters to evaluate and to export: `params` itself for every optimizer except the
    schedule-free ones, whose x sequence (optax.contrib.schedule_free_eval_params) is returned.
    Works on any nesting of the state (clipping chains, partitions); pure, so it can run under jit."""
    found = [s for s in jax.tree_util.tree_leaves(opt_state, is_leaf=_is_sf_state) if _is_sf_state(s)]
    if not found:
        return params
    if len(found) > 1:
        raise ValueError("eval_params: more than one ScheduleFreeState in the optimizer state")
    return schedule_free_eval_params(found[0], params)


def uses_eval_params(name: str) -> bool:
    """True when `eval_params` differs from the training params for optimizer `name`."""
    return name.startswith("schedule_free")


def abstract_state(cfg: OptimConfig, params) -> Any:
    """`make_optimizer(cfg, params).init(params)` abstractly evaluated (shapes and dtypes: nothing allocated)."""
    return jax.eval_shape(make_optimizer(cfg, params).init, nn.meta.unbox(params))


def optimizer_state_bytes(cfg: OptimConfig, params) -> int:
    """Bytes of the optimizer's state on `params` (`abstract_state`), the number the optimizer study reports."""
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract_state(cfg, params))))


OPTIMIZERS: dict[str, Callable[[OptimConfig, optax.Schedule, Any], optax.GradientTransformation]] = {
    "gpt1_adam": gpt1_adam,
    "adamw": adamw,
    "lion": lion,
    "adafactor": adafactor,
    "sgd": sgd,
    "sgd_nesterov": sgd_nesterov,
    "muon": muon,
    "schedule_free_adamw": schedule_free_adamw,
    "lamb": lamb,
}


assert tuple(OPTIMIZERS) == OPTIMIZER_NAMES, "each optimizer has its row in config.py's OPTIMIZER_READS, in order"


def make_optimizer(cfg: OptimConfig, params, lr: Peak | None = None) -> optax.GradientTransformation:
    """The optimizer named by `cfg.name`, its masks derived from `params` (real, abstract or boxed:
    only the tree's structure, names and ranks are read; boxes are stripped first), its float state
    stored in `cfg.state_dtype`, its schedule peaking at `lr` (default `cfg.lr`). The state's layout does
    not depend on the lr: one `init` serves every lr."""
    tx = OPTIMIZERS[cfg.name](cfg, make_schedule(cfg, lr), nn.meta.unbox(params))
    return tx if cfg.state_dtype == "float32" else stored_as(tx, jnp.dtype(cfg.state_dtype))


# The state a narrower dtype may hold: first moments (optax's `mu`: Adam's, LAMB's, Lion's, Muon's; `trace`: SGD's
# momentum; `ema`: Adafactor's, with adafactor_momentum), which decay by ~0.9 a step. Not second moments: bf16
# keeps 8 bits, so nu's 0.999 decay rounds back to nu and it stops falling (a constant gradient's Adam steps came
# out 1.8x too large); nor schedule-free's z, which is the weights themselves (LayerNorm gains near 1 stopped
# moving), nor its scalars (b1 0.9 became 0.8984375).
NARROWED_STATE = ("mu", "trace", "ema")


def stored_as(tx: optax.GradientTransformation, dtype) -> optax.GradientTransformation:
    """`tx` with its first moments (NARROWED_STATE) kept in `dtype` between steps: each update widens them back
    to the dtypes `tx` made them in, runs `tx` unchanged, and narrows the new ones. Everything else stays as `tx`
    keeps it. Memory, not arithmetic: every optimizer's maths stays in float32."""
    def narrow(state):
        def leaf(path, x):
            field = next((k.name for k in reversed(path) if isinstance(k, jax.tree_util.GetAttrKey)), None)
            return x.astype(dtype) if field in NARROWED_STATE and jnp.issubdtype(x.dtype, jnp.floating) else x
        return jax.tree_util.tree_map_with_path(leaf, state)

    def init(params):
        return narrow(tx.init(params))

    def update(updates, state, params=None):
        wide = jax.eval_shape(tx.init, params if params is not None else updates)
        state = jax.tree.map(lambda x, w: x.astype(w.dtype), state, wide)
        updates, state = tx.update(updates, state, params)
        return updates, narrow(state)

    return optax.GradientTransformation(init, update)
