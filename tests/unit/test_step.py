"""The train step's loss: next-token cross-entropy with weights. Accumulation, resume determinism, mixed
precision and remat, each a compiled step or several: tests/e2e/test_step.py."""

import jax.numpy as jnp
import numpy as np

from gpt1_jax.step import lm_loss_sums


def test_lm_loss_is_weighted_next_token_cross_entropy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float64)
    targets = rng.integers(0, 7, (2, 5))
    weights = rng.integers(0, 2, (2, 5)).astype(np.float32)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    s, w = lm_loss_sums(jnp.asarray(logits, jnp.float32), jnp.asarray(targets), jnp.asarray(weights))
    np.testing.assert_allclose(float(s), (nll * weights).sum(), rtol=1e-5)
    assert float(w) == weights.sum()
    s, w = lm_loss_sums(jnp.asarray(logits, jnp.float32), jnp.asarray(targets), jnp.ones((2, 5)))
    np.testing.assert_allclose(float(s) / float(w), nll.mean(), rtol=1e-5)
