"""What tests/unit/test_finetune.py and tests/e2e/test_finetune.py share."""

import dataclasses

import numpy as np
import pytest

from gpt1_jax.config import model_preset
from gpt1_jax.tokenizer import GPT1Tokenizer


WORDS = "the a cat dog sat ran on under mat log quickly slowly big small red blue house tree".split()


def _sentences(n, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(3, 9))) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A small GLUE-layout folder: CoLA (header-less train/dev, test with index) and STS-B."""
    root = tmp_path_factory.mktemp("glue")
    (root / "CoLA").mkdir()
    for name, n, seed in (("train", 40, 0), ("dev", 12, 1)):
        rows = [f"src\t{int('cat' in s)}\t\t{s}\n" for s in _sentences(n, seed)]
        (root / "CoLA" / f"{name}.tsv").write_text("".join(rows))
    (root / "CoLA" / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, s in enumerate(_sentences(9, 2))))
    (root / "STS-B").mkdir()
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    for name, n, seed in (("train", 24, 3), ("dev", 8, 4)):
        a, b = _sentences(n, seed), _sentences(n, seed + 10)
        rows = [f"{i}\tg\tf\ty\t0\tn\tn\t{x}\t{y}\t{(i % 6) * 0.9:.3f}\n" for i, (x, y) in enumerate(zip(a, b))]
        (root / "STS-B" / f"{name}.tsv").write_text(head + "\tscore\n" + "".join(rows))
    return root


@pytest.fixture(scope="module")
def tokenizer(data_dir):
    return GPT1Tokenizer.train([_sentences(200, 9)], vocab_size=120)


def _hf_dir(tmp_path, tok):
    from gpt1_jax import init_params, save_pretrained

    config = dataclasses.replace(model_preset("tiny"), vocab_size=tok.base_vocab_size)  # no marker rows yet
    params = init_params(config, 7)
    return save_pretrained(config, params, tmp_path / "hf"), config, params
