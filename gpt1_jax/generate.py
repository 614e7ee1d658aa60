"""Sampling from the LM: temperature and top-k, one compiled loop over a fixed-length token buffer.

Without a KV cache each new token re-reads the whole buffer (O(T^2) per sequence): fine for looking
at what a checkpoint learned, not for serving. Causality makes the unused tail of the buffer harmless.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from gpt1_jax.config import ModelConfig
from gpt1_jax.model import GPT1


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 6))
def _sample_loop(config: ModelConfig, params, buffer_BL, start: int, stop: int, temperature, top_k, rng):
    model = GPT1(config)

    def body(t, carry):
        buffer_BL, rng = carry
        rng, step_rng = jax.random.split(rng)
        h_BLD = model.apply({"params": params}, buffer_BL)
        h_BD = jax.lax.dynamic_index_in_dim(h_BLD, t - 1, axis=1, keepdims=False)
        logits_BV = model.apply({"params": params}, h_BD, method=GPT1.logits)
        kth_BV = jnp.sort(logits_BV, axis=-1)[:, -top_k][:, None]
        logits_BV = jnp.where(logits_BV < kth_BV, -jnp.inf, logits_BV)
        greedy_B = jnp.argmax(logits_BV, axis=-1)
        sampled_B = jax.random.categorical(step_rng, logits_BV / jnp.maximum(temperature, 1e-6), axis=-1)
        next_B = jnp.where(temperature > 0, sampled_B, greedy_B).astype(buffer_BL.dtype)
        return buffer_BL.at[:, t].set(next_B), rng

    buffer_BL, _ = jax.lax.fori_loop(start, stop, body, (buffer_BL, rng))
    return buffer_BL


def sample(
    config: ModelConfig,
    params,
    prompt_ids: list[int],
    *,
    max_new_tokens: int = 50,
    temperature: float = 1.0,
    top_k: int = 40,
    seed: int = 0,
    num_samples: int = 1,
) -> list[list[int]]:
    """Continuations (new tokens only) of `prompt_ids`; temperature 0 is greedy."""
    if not prompt_ids:
        raise ValueError("the prompt is empty: give at least one token")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    total = min(len(prompt_ids) + max_new_tokens, config.n_positions)
    if len(prompt_ids) >= total:
        raise ValueError(f"a prompt of {len(prompt_ids)} tokens leaves no room in the context of {config.n_positions}")
    top_k = max(1, min(top_k or config.vocab_size, config.vocab_size))
    buffer = jnp.zeros((num_samples, total), jnp.int32).at[:, : len(prompt_ids)].set(jnp.asarray(prompt_ids))
    out = _sample_loop(config, params, buffer, len(prompt_ids), total, jnp.float32(temperature), top_k,
                       jax.random.key(seed))
    return [row[len(prompt_ids):] for row in jax.device_get(out).tolist()]
