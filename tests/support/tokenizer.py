"""What tests/unit/test_tokenizer.py and tests/e2e/test_tokenizer.py share."""

from __future__ import annotations
import json
import time
from pathlib import Path

import pytest

from gpt1_jax.tokenizer import GPT1Tokenizer, text_standardize


def _have_original_deps() -> bool:
    try:
        import ftfy  # noqa: F401
        import spacy  # noqa: F401
    except ImportError:
        return False
    return True


needs_original = pytest.mark.skipif(
    not _have_original_deps(), reason="ftfy/spacy not installed (pip install gpt1-jax[original])"
)


# Text columns of GLUE's files (CoLA train/dev have no header: sentence is column 3).
GLUE_TEXT_COLUMNS = {
    "CoLA": ["sentence"],
    "SST-2": ["sentence"],
    "MRPC": ["#1 String", "#2 String"],
    "QNLI": ["question", "sentence"],
    "RTE": ["sentence1", "sentence2"],
    "STS-B": ["sentence1", "sentence2"],
}


def glue_sentences(glue: Path) -> list[str]:
    """Every text field of every train/dev/test TSV: tab-split only, no CSV quoting, BOM dropped."""
    out: list[str] = []
    for task, columns in GLUE_TEXT_COLUMNS.items():
        for split in ("train", "dev", "test"):
            path = glue / task / f"{split}.tsv"
            if not path.is_file():
                continue
            rows = [line.split("\t") for line in path.read_text(encoding="utf-8-sig").split("\n") if line]
            if task == "CoLA" and split != "test":
                idx = [3]
            else:
                idx = [rows[0].index(c) for c in columns]
                rows = rows[1:]
            out.extend(row[i] for row in rows for i in idx)
    return out


def vocab_files(folder: Path) -> tuple[Path, Path]:
    return folder / "encoder_bpe_40000.json", folder / "vocab_40000.bpe"


@pytest.fixture(scope="module")
def vocab(vocab_dir: Path) -> tuple[Path, Path]:
    """tests/fixtures' tiny vocabulary: it splits the words below as OpenAI's does (test_fixtures.py)."""
    return vocab_files(vocab_dir)


@pytest.fixture(scope="module")
def openai_vocab(shared_dir: Path) -> tuple[Path, Path]:
    return vocab_files(shared_dir / "data" / "gpt1_vocab")


@pytest.fixture(scope="module")
def tok(vocab: tuple[Path, Path]) -> GPT1Tokenizer:
    return GPT1Tokenizer.from_original(*vocab)


def parity_with_transformers(vocab: tuple[Path, Path], sentences: list[str]) -> float:
    """The share of sentences that transformers' OpenAIGPTTokenizer encodes to our ids."""
    transformers = pytest.importorskip("transformers")
    tok = GPT1Tokenizer.from_original(*vocab)
    hf = transformers.OpenAIGPTTokenizer(vocab=str(vocab[0]), merges=str(vocab[1]))
    t0 = time.perf_counter()
    ours = tok.encode_batch(sentences)
    t_ours = time.perf_counter() - t0
    theirs = hf(sentences, add_special_tokens=False)["input_ids"]
    same = sum(a == b for a, b in zip(ours, theirs))
    rate = same / len(sentences)
    n_tokens = sum(map(len, ours))
    print(
        f"\nGLUE parity with transformers {transformers.__version__} OpenAIGPTTokenizer: "
        f"{same}/{len(sentences)} sentences identical ({rate:.4%}); "
        f"encode_batch {n_tokens / t_ours:,.0f} tokens/s"
    )
    return rate


class _OriginalTextEncoder:
    """A direct port of finetune-transformer-lm's text_utils.TextEncoder (spacy.blank for the model)."""

    def __init__(self, encoder_path: Path, bpe_path: Path) -> None:
        import ftfy
        import spacy

        self.fix_text, self.nlp = ftfy.fix_text, spacy.blank("en")
        self.encoder = json.loads(encoder_path.read_text(encoding="utf-8"))
        merges = bpe_path.read_text(encoding="utf-8").split("\n")[1:-1]
        self.bpe_ranks = {tuple(m.split()): i for i, m in enumerate(merges)}
        self.cache: dict[str, str] = {}

    def bpe(self, token: str) -> str:
        if token in self.cache:
            return self.cache[token]
        word = tuple(token[:-1]) + (token[-1] + "</w>",)
        pairs = set(zip(word[:-1], word[1:]))
        if not pairs:
            return token + "</w>"
        while True:
            bigram = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word: list[str] = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = set(zip(word[:-1], word[1:]))
        out = " ".join(word)
        if out == "\n  </w>":
            out = "\n</w>"
        self.cache[token] = out
        return out

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for token in self.nlp(text_standardize(self.fix_text(text))):
            ids.extend(self.encoder.get(t, 0) for t in self.bpe(token.text.lower()).split(" "))
        return ids


def assert_matches_port(vocab: tuple[Path, Path], sentences: list[str]) -> None:
    sentences = sentences + ["Line one\nline two\n\n  three", "tab\tseparated  spaces", "¡Olé! — “quotes”"]
    ours = GPT1Tokenizer.from_original(*vocab, mode="original")
    ref = _OriginalTextEncoder(*vocab)
    assert ours.encode_batch(sentences) == [ref.encode(s) for s in sentences]
