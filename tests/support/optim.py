"""What tests/unit/test_optim.py and tests/e2e/test_optim.py share."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest

from gpt1_jax.config import model_preset
from gpt1_jax.model import init_params


@pytest.fixture(scope="module")
def params():
    # The scanned layout: every per-layer array has a leading layer axis (the harder case for the masks).
    scanned = dataclasses.replace(model_preset("tiny"), scan_layers=True)
    return jax.tree.map(np.asarray, nn.meta.unbox(init_params(scanned, 0)))
