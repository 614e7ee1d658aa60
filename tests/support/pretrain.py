"""What tests/unit/test_pretrain.py, tests/e2e/test_pretrain.py and the other pre-training runs (Ctrl-C, checkpoints) share."""

import sys

import numpy as np
import pytest


def cli(*args, workdir, cache):
    """argv for a tiny pre-training run on the embedded corpus, the token cache kept per test session."""
    return [sys.executable, "-m", "gpt1_jax.cli", *args, "--workdir", str(workdir), "--set", f"data.cache_dir={cache}"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("token-cache")


def assert_same_tree(a, b):
    import jax

    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
