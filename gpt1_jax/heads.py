"""Task heads over the shared transformer: the classifier and the losses (docs/gpt1.md).

Every example arrives as N sequences of one token layout (gpt1_jax/data/layout.py), so one model function
serves every head: N=1 for classification and entailment, 2 for similarity (both orders, hidden states
added), one per choice for multiple choice.

The classifier reads the final hidden state at the `_classify_` position (recorded per sequence as
`clf_pos`, not searched for), applies dropout, then a linear layer W_y ~ N(0, 0.02), bias 0. For
multiple choice one dropout mask serves all choices of an example, as in the original.

Loss = task loss + lm_coef * LM loss on the same inputs; the LM loss is averaged as the original did:
per sequence over its real tokens after `_start_` (delimiter and classify included), then over sequences.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gpt1_jax.config import ModelConfig
from gpt1_jax.dropout import Dropout
from gpt1_jax.model import GPT1


# ---- the model ---------------------------------------------------------------------------------------

class ClassifierHead(nn.Module):
    """Dropout then W_y on the `_classify_` hidden states h_BND -> [B, n_outputs] (or [B, N] scores)."""

    kind: str
    n_outputs: int
    dropout: float = 0.1
    init_std: float = 0.02
    dtype: str = "float32"

    @nn.compact
    def __call__(self, h_BND: jax.Array, deterministic: bool = True) -> jax.Array:
        dense = nn.Dense(
            1 if self.kind == "multiple_choice" else self.n_outputs,
            dtype=self.dtype,
            kernel_init=nn.with_logical_partitioning(nn.initializers.normal(self.init_std), ("embed", None)),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
            name="linear",
        )
        if self.kind == "multiple_choice":
            # broadcast over the choice axis: one mask per example, shared by its choices
            x_BND = Dropout(self.dropout, broadcast_dims=(1,))(h_BND, deterministic=deterministic)
            return dense(x_BND)[..., 0].astype(jnp.float32)
        h_BD = h_BND.sum(axis=1) if self.kind == "similarity" else h_BND[:, 0]
        x_BD = Dropout(self.dropout)(h_BD, deterministic=deterministic)
        return dense(x_BD).astype(jnp.float32)


class FinetuneModel(nn.Module):
    """GPT-1 (params under `transformer`, the pre-trained tree unchanged) plus one head (`head`)."""

    config: ModelConfig
    kind: str
    n_outputs: int
    clf_dropout: float = 0.1

    def setup(self):
        self.transformer = GPT1(self.config)
        self.head = ClassifierHead(self.kind, self.n_outputs, self.clf_dropout, self.config.init_std, self.config.dtype)

    def __call__(self, tokens_BNT, clf_pos_BN, *, deterministic: bool = True, with_lm: bool = True):
        """-> (head outputs [B, n_outputs] or [B, N], LM logits [B*N, T, V] float32 or None)."""
        B, N, T = tokens_BNT.shape
        table_GVD = self.transformer.group_table() if with_lm else None  # its two gradients reduced once (GPT1.group_table)
        h_STD = self.transformer(tokens_BNT.reshape(B * N, T), deterministic=deterministic, table_GVD=table_GVD)
        idx_S11 = clf_pos_BN.reshape(B * N, 1, 1)
        h_clf_SD = jnp.take_along_axis(h_STD, idx_S11, axis=1)[:, 0]
        out = self.head(h_clf_SD.reshape(B, N, -1), deterministic)
        lm_logits_STV = self.transformer.logits(h_STD, table_GVD) if with_lm else None
        return out, lm_logits_STV


def init_finetune_params(model: FinetuneModel, rng: jax.Array, n_seq: int = 1, seq_len: int = 8):
    """Fresh boxed parameters of the whole model (transformer + head); jit it (callers choose shardings)."""
    tokens = jnp.zeros((1, n_seq, seq_len), jnp.int32)
    clf = jnp.zeros((1, n_seq), jnp.int32)
    return model.init(rng, tokens, clf, with_lm=False)["params"]


# ---- losses ----------------------------------------------------------------------------------------

def lm_losses(logits_STV: jax.Array, tokens_ST: jax.Array, mask_ST: jax.Array) -> jax.Array:
    """The original's auxiliary LM loss per sequence [S]: the mean cross-entropy of predicting each real
    token after `_start_` (mask[:, 1:])."""
    losses_SU = optax.softmax_cross_entropy_with_integer_labels(logits_STV[:, :-1].astype(jnp.float32), tokens_ST[:, 1:])
    m_SU = mask_ST[:, 1:].astype(jnp.float32)
    return jnp.sum(losses_SU * m_SU, axis=1) / jnp.maximum(jnp.sum(m_SU, axis=1), 1.0)


def task_losses(regression: bool, out: jax.Array, labels_B: jax.Array) -> jax.Array:
    """Per example [B]: cross-entropy over classes (or choices), or squared error for regression."""
    if regression:
        return jnp.square(out[:, 0] - labels_B.astype(jnp.float32))
    return optax.softmax_cross_entropy_with_integer_labels(out, labels_B.astype(jnp.int32))


def _weighted_mean(x_B: jax.Array, weights_B: jax.Array) -> jax.Array:
    return jnp.sum(x_B * weights_B) / jnp.maximum(jnp.sum(weights_B), 1.0)


def lm_loss(logits_STV: jax.Array, tokens_ST: jax.Array, mask_ST: jax.Array, weights_S: jax.Array) -> jax.Array:
    """`lm_losses` averaged over sequences (weight 0: padding rows), as the original reports it."""
    return _weighted_mean(lm_losses(logits_STV, tokens_ST, mask_ST), weights_S)


def task_loss(kind: str, regression: bool, out: jax.Array, labels_B: jax.Array, weights_B: jax.Array) -> jax.Array:
    """`task_losses` averaged over real examples."""
    return _weighted_mean(task_losses(regression, out, labels_B), weights_B)


def predictions(kind: str, regression: bool, out: np.ndarray) -> np.ndarray:
    """Head outputs -> predicted class / choice index, or the regression value."""
    out = np.asarray(out)
    return out[:, 0] if regression else out.argmax(-1)


# ---- the fine-tuning objective ------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def finetune_functions(config: ModelConfig, kind: str, n_outputs: int, regression: bool, clf_dropout: float,
                       lm_coef: float, n_seq: int):
    """(init_fn, loss_fn, predict_fn) for gpt1_jax.step.Trainer: the head's loss plus lm_coef x the
    auxiliary LM loss, as per-example sums (each example's LM part is the mean over its sequences).
    Cached, so equal setups share compilations."""
    model = FinetuneModel(config, kind, n_outputs, clf_dropout)

    def init_fn(rng):
        return init_finetune_params(model, rng, n_seq=n_seq)

    def loss_fn(params, batch, rng, deterministic):
        tokens_BNT = batch["tokens"]
        B, N, T = tokens_BNT.shape
        out, logits_STV = model.apply({"params": params}, tokens_BNT, batch["clf_pos"], deterministic=deterministic,
                                      with_lm=lm_coef > 0, rngs={} if deterministic else {"dropout": rng})
        w_B = batch["weights"]
        task_B = task_losses(regression, out, batch["labels"])
        if lm_coef > 0:
            lm_B = lm_losses(logits_STV, tokens_BNT.reshape(B * N, T), batch["mask"].reshape(B * N, T)).reshape(B, N).mean(1)
        else:
            lm_B = jnp.zeros_like(task_B)
        return (jnp.sum(w_B * (task_B + lm_coef * lm_B)), jnp.sum(w_B),
                {"task_loss": jnp.sum(w_B * task_B), "lm_loss": jnp.sum(w_B * lm_B)})

    def predict_fn(params, batch):
        out, _ = model.apply({"params": params}, batch["tokens"], batch["clf_pos"], deterministic=True, with_lm=False)
        return out

    return init_fn, loss_fn, predict_fn
