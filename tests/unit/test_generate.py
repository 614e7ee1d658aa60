"""Sampling refuses prompt ids outside the vocabulary before generating. KV-cache decoding against full
recompute, seeding and the `sample` verb: tests/e2e/test_generate.py."""

import flax.linen as nn
import numpy as np
import pytest

import gpt1_jax
from gpt1_jax.config import model_preset
from gpt1_jax.errors import DataError
from gpt1_jax.generate import sample


def test_prompt_ids_outside_the_vocabulary_are_one_error():
    """An id the embedding table has no row for would be looked up silently; it is refused instead."""
    config = model_preset("tiny")
    params = nn.meta.unbox(gpt1_jax.init_params(config, 0))
    for bad in (512, 40478, -1):
        with pytest.raises(DataError, match=rf"token id {bad} is outside the model's vocabulary of 512 ids"):
            sample(config, params, [1, bad, 2], max_new_tokens=2)
    with pytest.raises(DataError, match=r"token ids must lie in \[0, 512\), got \[1, 600\]"):
        gpt1_jax.lm_logits(config, params, np.asarray([[1, 600]]))
