"""Tests for gpt1_jax.tokenizer.

Most tests use the tiny vocabulary and GLUE rows of tests/fixtures/; the few that check OpenAI's
own vocabulary (its ids, parity over all of GLUE) read ../shared and skip without it.
"""

from __future__ import annotations
import gzip
import json
import random
import sys
from pathlib import Path

import pytest

from gpt1_jax.errors import ConfigError, DataError
from gpt1_jax.tokenizer import EOW_SUFFIX, SPECIAL_TOKENS, GPT1Tokenizer, find_tokenizer, text_standardize
from tests.support.tokenizer import assert_matches_port, glue_sentences, needs_original, openai_vocab, parity_with_transformers, tok, vocab  # noqa: F401 (pytest fixtures)


@pytest.fixture(scope="module")
def tok_original(vocab: tuple[Path, Path]) -> GPT1Tokenizer:
    return GPT1Tokenizer.from_original(*vocab, mode="original")


# --- the released vocabulary ---------------------------------------------------------------------
def test_vocabulary_layout_and_special_ids(openai_vocab: tuple[Path, Path]) -> None:
    tok = GPT1Tokenizer.from_original(*openai_vocab)
    assert tok.base_vocab_size == 40478
    assert tok.vocab_size == len(tok) == 40481
    assert (tok.start_id, tok.delimiter_id, tok.classify_id) == (40478, 40479, 40480)
    assert tok.special_ids == (40478, 40479, 40480)
    assert [tok.id_to_token(i) for i in tok.special_ids] == list(SPECIAL_TOKENS)
    assert tok.id_to_token(0) == "<unk>" and tok.unk_id == 0
    assert tok.id_to_token(40477) == "\n</w>"
    assert tok.id_to_token(239) == ".</w>"  # base symbols 1-238, the same with </w> from 239
    assert tok.token_to_id("th") == 477  # first merge "t h"


def test_encode_decode_round_trip(tok: GPT1Tokenizer) -> None:
    text = "the quick brown fox jumps over the lazy dog , twice ."
    ids = tok.encode(text)
    assert all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text
    # Normalisation is lossy by design: lowercase, punctuation split off.
    assert tok.decode(tok.encode("Hello, World!")) == "hello , world !"
    assert tok.tokenize("reimplementation tokenization") == [
        "re", "imple", "mentation</w>", "to", "ken", "ization</w>"
    ]
    assert tok.encode("") == []


def test_specials_never_come_from_text(tok: GPT1Tokenizer) -> None:
    for text in ("_start_", "a _delimiter_ b", "_classify_"):
        assert not set(tok.encode(text)) & set(tok.special_ids)
    ids = [tok.start_id, *tok.encode("premise"), tok.delimiter_id, *tok.encode("hypothesis"), tok.classify_id]
    assert tok.decode(ids) == "_start_ premise _delimiter_ hypothesis _classify_"
    assert tok.decode(ids, skip_special_tokens=True) == "premise hypothesis"


def test_encode_batch_matches_encode(tok: GPT1Tokenizer) -> None:
    texts = ["First sentence.", "", "Another one, with punctuation!?", "numbers 1.5 and 10:30"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


@pytest.mark.parametrize("mode", ["hf", pytest.param("original", marks=needs_original)])
def test_save_load_gives_identical_encodings(tmp_path: Path, vocab: tuple[Path, Path], mode: str) -> None:
    tok = GPT1Tokenizer.from_original(*vocab, mode=mode)
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    loaded = GPT1Tokenizer.load(path)
    texts = ["Mr. Smith can't come — he's ill…", "Line one\nline two", "José’s café _start_ <unk>"]
    assert loaded.mode == mode
    assert loaded.special_ids == tok.special_ids and loaded.vocab_size == tok.vocab_size
    assert loaded.encode_batch(texts) == tok.encode_batch(texts)
    # One plain tokenizers JSON: the Rust library alone can read it.
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(path)).get_vocab_size() == tok.vocab_size


def test_parity_with_transformers(vocab: tuple[Path, Path], glue_dir: Path) -> None:
    assert parity_with_transformers(vocab, glue_sentences(glue_dir)) == 1.0


# --- training --------------------------------------------------------------------------------------
def _tiny_corpus(n_lines: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["low", "lower", "lowest", "new", "newer", "newest", "wide", "wider", "widest", "slow"]
    return [" ".join(rng.choice(words) for _ in range(10)) + "." for _ in range(n_lines)]


def test_train_tiny_bpe_has_gpt1_layout_and_eow_semantics() -> None:
    tok = GPT1Tokenizer.train(_tiny_corpus(), vocab_size=60)
    assert tok.id_to_token(0) == "<unk>"
    assert tok.base_vocab_size <= 60
    assert tok.special_ids == tuple(range(tok.base_vocab_size, tok.base_vocab_size + 3))
    symbols = [tok.id_to_token(i) for i in range(1, 13)]  # "." d e i l n o r s t w, then with </w>
    assert symbols[:11] == sorted(".deilnorstw")
    assert tok.id_to_token(12) == "." + EOW_SUFFIX
    # Every known symbol has both forms, whether or not the corpus had it word-finally ("s").
    assert tok.token_to_id("s") is not None and tok.token_to_id("s" + EOW_SUFFIX) is not None

    pieces = tok.tokenize("lowest slow Lowest")
    assert pieces[0] == pieces[2] == "lowest</w>"  # frequent word: one piece, lowercased
    # "est" inside a word is not the word-final "est</w>": only a word's last piece has the suffix.
    inner, final = tok.tokenize("estlow"), tok.tokenize("lowest")
    assert inner[-1].endswith(EOW_SUFFIX) and not any(p.endswith(EOW_SUFFIX) for p in inner[:-1])
    assert final == ["lowest</w>"] and "est</w>" not in inner
    assert tok.decode(tok.encode("newest wider")) == "newest wider"
    assert tok.encode("zzz") == [0, 0, 0]  # unseen symbols: one <unk> each


@pytest.mark.parametrize("mode", ["hf", pytest.param("original", marks=needs_original)])
def test_training_twice_on_the_same_texts_gives_the_same_bpe(mode: str) -> None:
    """"ab".."az", each seen twice: 25 pairs tie. tokenizers' trainer broke the tie by the numbers it gave the
    end-of-word forms in hash-map order, so each training learned other merges (5 different first merges in 6)."""
    texts = [" ".join("a" + c for c in "bcdefghijklmnopqrstuvwxyz")] * 2
    size = 1 + 2 * 26 + 3  # <unk>, a..z with and without </w>, three merges
    trained = [GPT1Tokenizer.train(texts, vocab_size=size, mode=mode) for _ in range(5)]
    assert len({t.backend.to_str() for t in trained}) == 1
    merges = [trained[0].id_to_token(i) for i in range(1 + 2 * 26, size)]
    assert merges == ["ab</w>", "ac</w>", "ad</w>"]  # the tie goes to the first symbols


def test_train_from_gz_file_matches_iterator(tmp_path: Path) -> None:
    corpus = _tiny_corpus()
    path = tmp_path / "corpus.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(corpus) + "\n")
    from_file = GPT1Tokenizer.train(path, vocab_size=50)
    from_iter = GPT1Tokenizer.train(iter(corpus), vocab_size=50)
    assert from_file.backend.get_vocab() == from_iter.backend.get_vocab()
    saved = tmp_path / "trained.json"
    from_file.save(saved)
    assert GPT1Tokenizer.load(saved).encode("the lowest newer") == from_file.encode("the lowest newer")


@pytest.mark.parametrize("mode", ["hf", pytest.param("original", marks=needs_original)])
def test_train_on_long_texts_and_batches(mode: str) -> None:
    # A text longer than a file name may be (255) must not be mistaken for a path, nor crash.
    long_docs = [" ".join(_tiny_corpus(40, seed=s)) for s in range(5)]
    assert len(long_docs[0]) > 1000
    a = GPT1Tokenizer.train(long_docs, vocab_size=50, mode=mode)
    b = GPT1Tokenizer.train(iter([long_docs[:2], long_docs[2:]]), vocab_size=50, mode=mode)  # batches
    assert a.mode == b.mode == mode
    assert a.backend.get_vocab() == b.backend.get_vocab()
    assert a.tokenize("lowest")[-1].endswith(EOW_SUFFIX)


@pytest.mark.parametrize("mode", ["hf", pytest.param("original", marks=needs_original)])
def test_training_shows_each_read_on_a_bar_with_a_total_and_then_the_merges(mode: str, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """tokenizers' own bars (train_from_iterator without a length) read "Pre-processing sequences 58576 / 0", then
    "Compute merges 3356 / 509" (started at the count of the bar before). Ours: the first read counts the
    characters, the total of the read that trains, then a status line for the merges; the same BPE as without."""
    from gpt1_jax.metrics import Bar

    corpus = _tiny_corpus(600)
    shown = Bar.format_sizeof(sum(map(len, corpus)))
    trained = GPT1Tokenizer.train(iter([corpus[:100], corpus[100:]]), vocab_size=60, mode=mode, show_progress=True)
    frames = [f for f in capsys.readouterr().err.replace("\r", "\n").splitlines() if f.strip()]
    assert any(f.startswith(f"BPE: reading the text: {shown}char [") for f in frames), frames
    assert frames[-2].startswith(f"BPE: counting words: 100%|██████████| {shown}/{shown} ["), frames
    assert frames[-1] == "gpt1-jax: BPE: computing the merges of a 60-token vocabulary"
    assert trained.backend.to_str() == GPT1Tokenizer.train(corpus, vocab_size=60, mode=mode).backend.to_str()
    assert capsys.readouterr().err == ""  # show_progress=False: nothing, tokenizers' bars neither
    if mode == "hf":  # files the trainer reads itself: a status line
        (tmp_path / "corpus.txt").write_text("\n".join(corpus) + "\n")
        GPT1Tokenizer.train(tmp_path / "corpus.txt", vocab_size=60, show_progress=True)
        assert capsys.readouterr().err.splitlines()[-1] == ("gpt1-jax: BPE: counting the words of 1 file(s) and "
                                                            "computing the merges")


def test_train_missing_file_fails_before_training(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        GPT1Tokenizer.train(tmp_path / "nope.txt")


# --- bad input -------------------------------------------------------------------------------------
@pytest.fixture
def tiny_files(tmp_path: Path) -> tuple[Path, Path]:
    enc = {"<unk>": 0, "a": 1, "b": 2, "a</w>": 3, "b</w>": 4, "ab</w>": 5}
    (tmp_path / "enc.json").write_text(json.dumps(enc))
    (tmp_path / "merges.bpe").write_text("#version: 0.2\na b</w>\n")
    return tmp_path / "enc.json", tmp_path / "merges.bpe"


def test_tiny_files_load(tiny_files: tuple[Path, Path]) -> None:
    tok = GPT1Tokenizer.from_original(*tiny_files)
    assert tok.encode("ab ba") == [5, 2, 3]
    assert tok.special_ids == (6, 7, 8)


def test_missing_file_errors(tiny_files: tuple[Path, Path], tmp_path: Path) -> None:
    enc, merges = tiny_files
    with pytest.raises(FileNotFoundError, match="missing.json"):
        GPT1Tokenizer.from_original(tmp_path / "missing.json", merges)
    with pytest.raises(FileNotFoundError, match="missing.bpe"):
        GPT1Tokenizer.from_original(enc, tmp_path / "missing.bpe")
    with pytest.raises(FileNotFoundError, match="missing_tok.json"):
        GPT1Tokenizer.load(tmp_path / "missing_tok.json")


def test_merges_without_merges(tiny_files: tuple[Path, Path]) -> None:
    enc, merges = tiny_files
    merges.write_text("#version: 0.2\n\n")
    with pytest.raises(DataError, match=r"merges\.bpe: contains no merges"):
        GPT1Tokenizer.from_original(enc, merges)


def test_malformed_merge_line(tiny_files: tuple[Path, Path]) -> None:
    enc, merges = tiny_files
    merges.write_text("#version: 0.2\na b</w>\na b c\n")
    with pytest.raises(DataError, match=r"merges\.bpe:3: expected 'left right'"):
        GPT1Tokenizer.from_original(enc, merges)


def test_merge_outside_vocabulary(tiny_files: tuple[Path, Path]) -> None:
    enc, merges = tiny_files
    merges.write_text("#version: 0.2\nb a</w>\n")  # "ba</w>" is not in the encoder
    with pytest.raises(DataError, match="merges do not fit"):
        GPT1Tokenizer.from_original(enc, merges)


@pytest.mark.parametrize(
    "content, message",
    [
        ('["a", "b"]', "mapping token strings to integer ids"),
        ('{"<unk>": 0, "a": "1"}', "mapping token strings to integer ids"),
        ("{}", "mapping token strings to integer ids"),
        ("not json", "not valid UTF-8 JSON"),
        ('{"<unk>": 0, "a": 2}', "ids must be exactly 0..1"),
        ('{"a": 0, "<unk>": 1}', "'<unk>' must have id 0"),
    ],
)
def test_bad_encoder_json(tiny_files: tuple[Path, Path], content: str, message: str) -> None:
    enc, merges = tiny_files
    enc.write_text(content)
    with pytest.raises(DataError, match=message) as info:
        GPT1Tokenizer.from_original(enc, merges)
    assert str(enc) in str(info.value) and "\n" not in str(info.value)


def test_load_rejects_foreign_json(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(DataError, match="not a tokenizer saved by GPT1Tokenizer.save"):
        GPT1Tokenizer.load(path)


def test_unknown_mode(tiny_files: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError, match="mode must be one of"):
        GPT1Tokenizer.from_original(*tiny_files, mode="spacy")


def test_find_tokenizer_and_the_model_it_fits(tiny_files: tuple[Path, Path], tmp_path: Path) -> None:
    """--tokenizer first, else the source folder's own, else None; a table of another size is one error."""
    enc, merges = tiny_files
    tok = GPT1Tokenizer.from_original(enc, merges)
    (tmp_path / "run").mkdir()
    tok.save(tmp_path / "run" / "tokenizer.json")
    assert find_tokenizer(None, tmp_path / "run").vocab_size == tok.vocab_size
    assert find_tokenizer(str(tmp_path / "run" / "tokenizer.json"), tmp_path / "nowhere").vocab_size == tok.vocab_size
    assert find_tokenizer(None, tmp_path) is None and find_tokenizer(None, None) is None
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        find_tokenizer(str(tmp_path / "nothing"), tmp_path / "run")
    # A table with the markers' rows, or without them (HF's and OpenAI's releases), fits.
    for rows in (tok.vocab_size, tok.base_vocab_size):
        assert find_tokenizer(None, tmp_path / "run", model_vocab_size=rows) is not None
    with pytest.raises(ConfigError, match=rf"has {tok.base_vocab_size} tokens \+ 3 markers but the model's "
                                          r"embedding table has 512 rows"):
        find_tokenizer(None, tmp_path / "run", model_vocab_size=512)


def test_original_mode_names_the_extra_when_deps_missing(
    tiny_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ftfy", None)  # makes `import ftfy` raise ImportError
    with pytest.raises(ImportError, match=r"pip install gpt1-jax\[original\]"):
        GPT1Tokenizer.from_original(*tiny_files, mode="original")


# --- original (OpenAI-faithful) mode ---------------------------------------------------------------
def test_text_standardize() -> None:
    # Runs of one character are padded as a unit ("--"), mixed runs ("?!") are split.
    assert text_standardize("Wait—what?!  He said…") == "Wait - what ? ! He said..."
    assert text_standardize("a\n\n  b´s") == "a \n b's"
    assert text_standardize("(x)--[y]") == "( x ) -- [ y ]"


@needs_original
@pytest.mark.parametrize(
    "text, pieces",
    [
        # spaCy's English contractions, where HF gives "can ' t" / "it ' s".
        (
            "I can't believe it's not butter!",
            "i</w> ca</w> n't</w> believe</w> it</w> 's</w> not</w> butter</w> !</w>",
        ),
        # text_standardize maps the em dash and ellipsis, ftfy uncurls quotes; HF gives <unk> for all 4.
        (
            "Wait—what?! He said… “fine”.",
            'wait</w> -</w> what</w> ?</w> !</w> he</w> said</w> ...</w> "</w> fine</w> "</w> .</w>',
        ),
        # A newline is a token of its own (id 40477), which HF drops.
        ("First line.\nSecond", "first</w> line</w> .</w> \n</w> second</w>"),
        # spaCy keeps abbreviations and times together; accents are kept (HF strips them).
        ("Mr. Smith at 5:30 p.m.", "mr.</w> smith</w> at</w> 5 :30</w> p.m.</w>"),
        ("José’s café", "jo s é</w> 's</w> café</w>"),
        # Literal marker/unk text stays text.
        ("a<unk>b _start_", "a</w> <</w> unk</w> ></w> b</w> _</w> start</w> _</w>"),
    ],
)
def test_original_mode_hand_checked(tok_original: GPT1Tokenizer, text: str, pieces: str) -> None:
    assert tok_original.tokenize(text) == pieces.split(" ")


@needs_original
def test_original_mode_matches_port_of_openai_encoder(vocab: tuple[Path, Path], glue_dir: Path) -> None:
    assert_matches_port(vocab, glue_sentences(glue_dir))


def test_a_run_folders_tokenizer_must_be_the_one_it_recorded(tmp_path: Path) -> None:
    """Another run's tokenizer.json copied into a run folder was caught only on the validation-split path:
    sample, evaluate --data and convert read other ids with the run's weights and exited 0."""
    import hashlib

    trained = GPT1Tokenizer.train([["the cat sat on the mat"] * 20], vocab_size=60)
    other = GPT1Tokenizer.train([["a dog ran in the park"] * 20], vocab_size=60)
    trained.save(tmp_path / "tokenizer.json")
    digest = hashlib.sha256((tmp_path / "tokenizer.json").read_bytes()).hexdigest()
    (tmp_path / "tokenizer.meta.json").write_text(json.dumps({"vocab_size": 60, "sha256": digest}))
    assert find_tokenizer(None, tmp_path).vocab_size == trained.vocab_size
    other.save(tmp_path / "tokenizer.json")
    with pytest.raises(DataError, match=r"tokenizer.json is damaged \(it no longer matches the sha256 in "
                                        r"tokenizer.meta.json\)"):
        find_tokenizer(None, tmp_path)
    find_tokenizer(str(tmp_path / "tokenizer.json"), None)  # a file named by --tokenizer is the user's choice
