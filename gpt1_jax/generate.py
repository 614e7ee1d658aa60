"""Sampling from the LM with a KV cache: one prefill of the prompt, then one token per step, all in one
compiled program (a `fori_loop`). Temperature, top-k, greedy (temperature 0)."""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gpt1_jax.config import ModelConfig
from gpt1_jax.errors import ConfigError, DataError
from gpt1_jax.model import GPT1


def init_cache(config: ModelConfig, batch: int):
    """Zeroed keys/values for every layer and all n_positions slots (the "cache" collection)."""
    model = GPT1(config)
    shapes = jax.eval_shape(
        lambda: model.init(jax.random.key(0), jnp.zeros((batch, 1), jnp.int32), decode=True)["cache"]
    )
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _choose(logits_BV, allowed_V, temperature, top_k: int, rng):
    logits_BV = jnp.where(allowed_V, logits_BV, -jnp.inf)

    def sampled():
        kept_BV = logits_BV
        if top_k < logits_BV.shape[-1]:
            # The k-th largest from lax.top_k: a sort of the whole vocabulary took 18% of a generated token's time
            # (experiments/bench/README.md, 2026-12-02).
            kth_B1 = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
            kept_BV = jnp.where(logits_BV < kth_B1, -jnp.inf, logits_BV)
        return jax.random.categorical(rng, kept_BV / jnp.maximum(temperature, 1e-6), axis=-1).astype(jnp.int32)

    # Greedy takes the largest logit, which top-k keeps: it needs neither the threshold nor the draw.
    return jax.lax.cond(temperature > 0, sampled, lambda: jnp.argmax(logits_BV, axis=-1).astype(jnp.int32))


@functools.partial(jax.jit, static_argnums=(0, 3, 6))
def _generate(config: ModelConfig, params, prompt_BP, total: int, allowed_V, temperature, top_k: int, rng):
    model = GPT1(config)
    B, P = prompt_BP.shape

    def forward(cache, tokens_BT, start):
        h_BTD, variables = model.apply({"params": params, "cache": cache}, tokens_BT, decode=True, start=start,
                                       mutable=["cache"])
        return variables["cache"], model.apply({"params": params}, h_BTD[:, -1], method=GPT1.logits)

    cache, logits_BV = forward(init_cache(config, B), prompt_BP, 0)  # prefill
    out_BL = jnp.zeros((B, total), jnp.int32).at[:, :P].set(prompt_BP)

    def body(t, carry):  # choose the token at position t, then feed it to get the logits for t + 1
        cache, logits_BV, out_BL, rng = carry
        rng, step_rng = jax.random.split(rng)
        next_B = _choose(logits_BV, allowed_V, temperature, top_k, step_rng)
        cache, logits_BV = forward(cache, next_B[:, None], t)
        return cache, logits_BV, out_BL.at[:, t].set(next_B), rng

    _, _, out_BL, _ = jax.lax.fori_loop(P, total, body, (cache, logits_BV, out_BL, rng))
    return out_BL


def check_room(config: ModelConfig, prompt_len: int, max_new_tokens: int, flag: str = "max_new_tokens=") -> None:
    """Refuse, in one line and before anything compiles, a prompt plus `max_new_tokens` that does not fit the model's
    context: the answer would silently be shorter than asked. `flag` spells the setting as the caller's user wrote
    it."""
    n = config.n_positions
    if prompt_len >= n:
        raise DataError(f"a prompt of {prompt_len} tokens leaves no room in the context of {n}")
    if prompt_len + max_new_tokens > n:
        raise ConfigError(f"{flag}{max_new_tokens} with a {prompt_len}-token prompt needs "
                          f"{prompt_len + max_new_tokens} positions; the model's context is {n} (n_positions): ask for "
                          f"at most {n - prompt_len}")


def generate(config: ModelConfig, params, prompts, *, max_new_tokens: int = 50, temperature: float = 1.0,
             top_k: int = 40, seed: int = 0, never: Sequence[int] = ()) -> jax.Array:
    """Token ids [B, P + new] continuing each row of `prompts` ([B, P] ids, one length for all rows);
    temperature 0 is greedy. P + max_new_tokens must fit the context (n_positions): see `check_room`. Ids in
    `never` are not generated (the fine-tuning markers: not text; ids past the model's vocabulary are ignored)."""
    prompts = np.asarray(prompts, np.int32)  # checked on the host: ids come from a tokenizer there
    if prompts.ndim != 2 or prompts.shape[1] == 0:
        raise DataError(f"prompts must be ids [batch, length >= 1], got shape {list(prompts.shape)}")
    # Out-of-range ids would not fail: a compiled embedding lookup answers them with a made-up row.
    outside = prompts[(prompts < 0) | (prompts >= config.vocab_size)]
    if outside.size:
        raise DataError(f"prompt token id {outside[0]} is outside the model's vocabulary of {config.vocab_size} ids "
                        f"(0..{config.vocab_size - 1}): the tokenizer does not belong to this model")
    if not 0 <= temperature < math.inf:  # NaN included: it would sample from NaN logits
        raise ConfigError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k < 0:
        raise ConfigError(f"top_k must be >= 0 (0: the whole vocabulary), got {top_k}")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    P = prompts.shape[1]
    check_room(config, P, max_new_tokens)
    total = P + max_new_tokens
    top_k = max(1, min(top_k or config.vocab_size, config.vocab_size))
    allowed = np.ones(config.vocab_size, bool)
    allowed[[i for i in never if 0 <= i < config.vocab_size]] = False
    if not allowed.any():
        raise ConfigError("never= leaves no token id to generate")
    return _generate(config, params, prompts, total, allowed, jnp.float32(temperature), top_k, jax.random.key(seed))


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
    never: Sequence[int] = (),
) -> list[list[int]]:
    """`num_samples` continuations (new tokens only) of one prompt; temperature 0 is greedy; ids in `never` are
    not generated."""
    if not prompt_ids:
        raise DataError("the prompt is empty: give at least one token")
    if num_samples < 1:
        raise ConfigError(f"num_samples must be >= 1, got {num_samples}")
    prompts = [list(prompt_ids)] * num_samples
    out = generate(config, params, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                   seed=seed, never=never)
    return [row[len(prompt_ids):] for row in jax.device_get(out).tolist()]
