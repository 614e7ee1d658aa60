"""tests/fixtures/ stands in for ../shared on a fresh clone: its generated files are current, and where
../shared exists, they agree with the real data on everything the other tests rely on."""

import json

import pytest

from gpt1_jax.tokenizer import GPT1Tokenizer


# The texts whose pieces test_tokenizer.py asserts (round trip: hf mode; hand-checked: original mode).
HF_TEXTS = ["reimplementation tokenization"]


ORIGINAL_TEXTS = [
    "I can't believe it's not butter!", "Wait—what?! He said… “fine”.", "First line.\nSecond",
    "Mr. Smith at 5:30 p.m.", "José’s café", "a<unk>b _start_",
]


def _tokenizer(folder, mode):
    return GPT1Tokenizer.from_original(folder / "encoder_bpe_40000.json", folder / "vocab_40000.bpe", mode=mode)


def test_fixtures_agree_with_the_real_data(vocab_dir, shared_dir):
    real = shared_dir / "data" / "gpt1_vocab"
    assert json.loads((vocab_dir / "params_shapes.json").read_text()) == json.loads((real / "params_shapes.json").read_text())
    pytest.importorskip("ftfy", reason="the original mode needs ftfy and spacy")
    pytest.importorskip("spacy", reason="the original mode needs ftfy and spacy")
    for mode, texts in (("hf", HF_TEXTS), ("original", ORIGINAL_TEXTS)):
        tiny, openai = _tokenizer(vocab_dir, mode), _tokenizer(real, mode)
        for text in texts:
            assert tiny.tokenize(text) == openai.tokenize(text), (mode, text)
