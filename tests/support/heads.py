"""What tests/unit/test_heads.py and tests/e2e/test_heads.py share."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from gpt1_jax import heads
from gpt1_jax.config import model_preset
from gpt1_jax.data.layout import Markers


M = Markers(start=500, delimiter=501, classify=502)


TINY = dataclasses.replace(model_preset("tiny"), embd_dropout=0.0, attn_dropout=0.0, resid_dropout=0.0)


def _apply(model, params, tokens, clf_pos, **kw):
    """Jitted: eager flax ops cost more than one small compilation."""
    rngs = kw.pop("rngs", None)
    fn = jax.jit(lambda p, t, c, r: model.apply({"params": p}, t, c, rngs=r, **kw))
    return fn(params, jnp.asarray(tokens), jnp.asarray(clf_pos), rngs)


def _model(kind, n_out, clf_dropout=0.0, config=TINY):
    model = heads.FinetuneModel(config, kind, n_out, clf_dropout)
    n_seq = 2 if kind == "similarity" else 1
    params = jax.tree.map(np.asarray, __import__("flax").linen.meta.unbox(
        jax.jit(lambda r: heads.init_finetune_params(model, r, n_seq=n_seq))(jax.random.key(0))))
    return model, params
