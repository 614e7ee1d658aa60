"""What tests/unit/test_sharding.py and tests/e2e/test_sharding.py share."""

import dataclasses


from gpt1_jax.config import model_preset
from gpt1_jax.optim import OptimConfig


# Dropout off: the comparison is about partitioning, not RNG streams.
TINY = dataclasses.replace(model_preset("tiny"), embd_dropout=0.0, attn_dropout=0.0, resid_dropout=0.0)


OPTIM = OptimConfig(schedule="constant", warmup_steps=0)
