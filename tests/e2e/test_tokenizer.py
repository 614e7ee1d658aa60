"""Tests for gpt1_jax.tokenizer.

Most tests use the tiny vocabulary and GLUE rows of tests/fixtures/; the few that check OpenAI's
own vocabulary (its ids, parity over all of GLUE) read ../shared and skip without it.
"""

from __future__ import annotations
import random
from pathlib import Path

from tests.support.tokenizer import assert_matches_port, glue_sentences, needs_original, openai_vocab, parity_with_transformers  # noqa: F401 (pytest fixtures)


def test_glue_parity_with_transformers(openai_vocab: tuple[Path, Path], shared_dir: Path) -> None:
    sentences = glue_sentences(shared_dir / "data" / "glue")
    assert len(sentences) > 100_000  # all text fields of train/dev/test, not a sample
    assert parity_with_transformers(openai_vocab, sentences) >= 0.995


@needs_original
def test_original_mode_matches_port_on_glue(openai_vocab: tuple[Path, Path], shared_dir: Path) -> None:
    # A seeded sample keeps this ~2 s; on all 142,943 GLUE sentences the agreement was 100%.
    assert_matches_port(openai_vocab, random.Random(0).sample(glue_sentences(shared_dir / "data" / "glue"), 4000))
