"""Sampling refuses prompt ids outside the vocabulary, and settings it cannot honour, before generating. KV-cache decoding against full
recompute, seeding and the `sample` verb: tests/e2e/test_generate.py."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpt1_jax
from gpt1_jax.config import model_preset
from gpt1_jax.errors import ConfigError, DataError
from gpt1_jax.generate import _choose, sample


def test_prompt_ids_outside_the_vocabulary_are_one_error():
    """An id the embedding table has no row for would be looked up silently; it is refused instead."""
    config = model_preset("tiny")
    params = nn.meta.unbox(gpt1_jax.init_params(config, 0))
    for bad in (512, 40478, -1):
        with pytest.raises(DataError, match=rf"token id {bad} is outside the model's vocabulary of 512 ids"):
            sample(config, params, [1, bad, 2], max_new_tokens=2)
    with pytest.raises(DataError, match=r"token ids must lie in \[0, 512\), got \[1, 600\]"):
        gpt1_jax.lm_logits(config, params, np.asarray([[1, 600]]))


@pytest.mark.parametrize("setting, message", [
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
    ({"temperature": float("inf")}, "temperature must be a finite number >= 0, got inf"),
    ({"top_k": -3}, r"top_k must be >= 0 \(0: the whole vocabulary\), got -3"),
    ({"num_samples": 0}, "num_samples must be >= 1, got 0"),
])
def test_settings_that_would_sample_garbage_are_refused(setting, message):
    """NaN and inf temperatures sampled from NaN logits (`<unk>`, or what looked greedy); a negative top-k, greedy."""
    config = model_preset("tiny")
    params = nn.meta.unbox(gpt1_jax.init_params(config, 0))
    with pytest.raises(ConfigError, match=message):
        sample(config, params, [1, 2], max_new_tokens=2, **setting)


def test_ids_it_is_told_never_to_generate_are_not_generated():
    """A model fine-tuned from the release sampled its markers as text (`_delimiter_` 10 times in 8 samples): the
    `sample` verb passes the markers as `never`. Here a marker's embedding row (tied to the output layer) is made a
    multiple of the row of the token greedy decoding chose first, so the marker's logit there is the largest."""
    config = model_preset("tiny")
    params = nn.meta.unbox(gpt1_jax.init_params(config, 0))
    first = int(np.argmax(gpt1_jax.lm_logits(config, params, np.asarray([[1, 2]]))[0, -1]))
    marker = config.vocab_size - 1
    assert first != marker
    table = params["tokens_embed"]["embedding"]
    logit = gpt1_jax.lm_logits(config, params, np.asarray([[1, 2]]))[0, -1, first]
    params = {**params, "tokens_embed": {"embedding": table.at[marker].set(table[first] * (10 if logit > 0 else -10))}}
    for how in ({"temperature": 0.0}, {"temperature": 1.0, "top_k": 1}):  # the ban comes before top-k
        assert sample(config, params, [1, 2], max_new_tokens=4, **how)[0][0] == marker  # what the ban has to stop
        banned = sample(config, params, [1, 2], max_new_tokens=4, never=[marker, config.vocab_size + 5], **how)
        assert marker not in banned[0]  # an id past the vocabulary is no error: there is nothing to ban
    with pytest.raises(ConfigError, match="leaves no token id to generate"):
        sample(config, params, [1, 2], max_new_tokens=2, never=range(config.vocab_size))


def test_top_k_draws_only_the_k_largest_and_greedy_takes_the_largest():
    """The choice of each token: the threshold comes from lax.top_k (not a sort of the vocabulary) and greedy skips
    the draw; ties at the k-th value stay in, banned ids stay out."""
    logits = jnp.asarray([[0.0, 5.0, 3.0, 3.0, 4.0, -1.0, 4.5]])
    allowed = np.ones(7, bool)
    allowed[1] = False  # the largest is banned: the three largest left are 4.5, 4.0 and a tie of 3.0
    choose = jax.jit(_choose, static_argnums=3)
    drawn = {int(choose(logits, allowed, jnp.float32(50.0), 3, jax.random.key(i))[0]) for i in range(200)}
    assert drawn == {2, 3, 4, 6}
    assert int(choose(logits, allowed, jnp.float32(0.0), 3, jax.random.key(0))[0]) == 6
    everything = {int(choose(logits, allowed, jnp.float32(50.0), 7, jax.random.key(i))[0]) for i in range(200)}
    assert everything == {0, 2, 3, 4, 5, 6}
