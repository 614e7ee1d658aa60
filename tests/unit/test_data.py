"""Pre-training data pipeline: sources, token cache, packing, split, per-process iterator, resume."""

from __future__ import annotations
import functools
import gzip
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from gpt1_jax.data import (
    BatchIterator,
    DataConfig,
    PackedWindows,
    build_pipeline,
    eod_id,
    open_source,
    split_windows,
    tokenize_to_cache,
    tokenizer_for,
)
from gpt1_jax.data import tokens as tokens_mod
from gpt1_jax.data.pipeline import check_process_share
from gpt1_jax.errors import ConfigError, DataError
from gpt1_jax.tokenizer import GPT1Tokenizer
from tests.support.data import DOCS_A, DOCS_B, _windows, write_corpus


@pytest.fixture(scope="session")
def tok_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~300-token BPE trained on the pydoc corpus: realistic text, trains in well under a second."""
    tok = GPT1Tokenizer.train(open_source("default").documents(), vocab_size=300)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(path)
    return path


@pytest.fixture(scope="session")
def tok(tok_path: Path) -> GPT1Tokenizer:
    return GPT1Tokenizer.load(tok_path)


# --- sources ---------------------------------------------------------------------------------------
def test_default_corpus_offline() -> None:
    src = open_source("default")
    docs = list(src.documents())
    assert len(docs) > 50 and all(d.strip() for d in docs)
    assert sum(map(len, docs)) > 200_000  # ~465k characters on CPython 3.11
    assert list(open_source("pydoc").documents()) == docs
    assert src.fingerprint() == open_source("default").fingerprint()


def test_files_globs_and_gzip(tmp_path: Path) -> None:
    a, b = write_corpus(tmp_path / "c")
    assert list(open_source(str(a)).documents()) == DOCS_A
    assert list(open_source(str(b)).documents()) == DOCS_B
    both = DOCS_A + DOCS_B  # sorted path order: a.txt, b.txt.gz
    assert list(open_source(str(tmp_path / "c" / "*.txt*")).documents()) == both
    assert list(open_source(str(tmp_path / "c")).documents()) == both  # a directory skips notes.md
    assert list(open_source(str(tmp_path / "**" / "*.txt")).documents()) == DOCS_A

    fp = open_source(str(a)).fingerprint()
    a.write_text(a.read_text() + "\n\nnew document\n")
    assert open_source(str(a)).fingerprint() != fp


@pytest.mark.parametrize(
    "spec, exc",
    [
        ("", ConfigError),
        ("/nonexistent/corpus.txt", FileNotFoundError),
        ("/nonexistent/dir/*.txt.gz", FileNotFoundError),
        ("tfds:", ConfigError),
        ("tfds:a/b/c", ConfigError),
        ("tfds:lm1b?colour=red", ConfigError),
    ],
)
def test_bad_specs_fail_clearly(spec: str, exc: type[Exception]) -> None:
    with pytest.raises(exc) as e:
        open_source(spec)
    msg = str(e.value)
    assert "\n" not in msg and (repr(spec) in msg or spec == "")


def test_a_pipe_is_refused_as_not_a_regular_file(tmp_path: Path) -> None:
    """`--data <(zcat corpus.gz)` names a pipe: it exists, and is read once (it used to be "no such file")."""
    fifo = tmp_path / "corpus.fifo"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="not a regular file .* write it to a file first"):
        open_source(str(fifo))


def test_empty_directory_and_empty_glob(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no \\*.txt"):
        open_source(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="glob matches no files"):
        open_source(str(tmp_path / "*.txt"))


# --- packing and split -----------------------------------------------------------------------------
def test_packing_windows_are_shifted_and_cover_the_stream() -> None:
    stream = (np.arange(1003) * 7 % 251).astype(np.uint16)
    T = 16
    w = PackedWindows(stream, T)
    assert len(w) == (1003 - 1) // T
    rows = w.gather(np.arange(len(w)))
    assert rows.shape == (len(w), T + 1) and rows.dtype == np.int32
    # Every token is an input exactly once, in order; targets are the inputs shifted by one.
    np.testing.assert_array_equal(rows[:, :-1].reshape(-1), stream[: len(w) * T])
    np.testing.assert_array_equal(rows[:, 1:].reshape(-1), stream[1 : len(w) * T + 1])
    # Gather order follows the request, not file order.
    np.testing.assert_array_equal(w.gather(np.array([5, 2, 5])), rows[[5, 2, 5]])

    it = BatchIterator(w, np.arange(len(w)), global_batch_size=len(w) // 4, seed=3, process_index=0, process_count=1)
    for _ in range(it.batches_per_epoch):
        batch = next(it)
        np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
        assert batch["inputs"].flags.c_contiguous and batch["weights"].min() == 1.0
    order = it.epoch_order(0)
    assert len(np.unique(order)) == len(order) == len(w)


def test_epoch_visits_each_window_once() -> None:
    w = PackedWindows(np.arange(10 * 8 + 1, dtype=np.uint32), 8)  # window k starts with token 8k
    it = BatchIterator(w, np.arange(10), global_batch_size=5, seed=0, process_index=0, process_count=1)
    ep0 = np.concatenate([next(it)["inputs"][:, 0] // 8 for _ in range(2)])
    ep1 = np.concatenate([next(it)["inputs"][:, 0] // 8 for _ in range(2)])
    assert sorted(ep0.tolist()) == sorted(ep1.tolist()) == list(range(10))
    assert not np.array_equal(ep0, ep1)  # reshuffled per epoch
    assert it.epoch == 1


def test_val_split_disjoint_and_deterministic() -> None:
    train, val = split_windows(10_000, 0.1, split_seed=0)
    assert np.intersect1d(train, val).size == 0
    np.testing.assert_array_equal(np.union1d(train, val), np.arange(10_000))
    assert 850 < val.size < 1150
    t2, v2 = split_windows(10_000, 0.1, split_seed=0)
    np.testing.assert_array_equal(v2, val)
    assert not np.array_equal(split_windows(10_000, 0.1, split_seed=1)[1], val)
    # Growing the corpus keeps the earlier windows' assignment.
    v3 = split_windows(12_000, 0.1, split_seed=0)[1]
    np.testing.assert_array_equal(v3[v3 < 10_000], val)
    # Tiny corpora still get both splits.
    t, v = split_windows(3, 0.01)
    assert t.size == 2 and v.size == 1
    assert split_windows(5, 0.0)[1].size == 0


# --- tokenizer and cache -------------------------------------------------------------------------
def test_tokenizer_for_trains_once(tmp_path: Path) -> None:
    src = open_source("default")
    t1 = tokenizer_for(src, tmp_path, vocab_size=300)
    path = tmp_path / "tokenizer.json"
    mtime = path.stat().st_mtime_ns
    t2 = tokenizer_for(src, tmp_path, vocab_size=300)
    assert path.stat().st_mtime_ns == mtime and t2.vocab_size == t1.vocab_size
    (tmp_path / "checkpoints" / "7").mkdir(parents=True)  # a checkpoint uses it: another size is refused
    with pytest.raises(ValueError, match="vocab_size=300"):
        tokenizer_for(src, tmp_path, vocab_size=400)
    with pytest.raises(FileNotFoundError, match="nope"):
        tokenizer_for(src, tmp_path, tokenizer=str(tmp_path / "nope"))


def test_runs_on_one_corpus_train_the_same_bpe(tmp_path: Path) -> None:
    """Three workdirs, three trainings of the embedded corpus's 8k BPE: three different tokenizer.json files
    before training was deterministic (gpt1_jax/tokenizer.py `_fit_bpe`), one now."""
    src = open_source("default")
    for run in "abc":
        tokenizer_for(src, tmp_path / run, vocab_size=8189)
    assert len({(tmp_path / run / "tokenizer.json").read_bytes() for run in "abc"}) == 1


def test_tokenizer_trains_on_documents_that_look_like_paths(tmp_path: Path) -> None:
    # A 300-character line without '/' makes Path(doc).is_file() raise; a document naming an existing
    # file must stay text. Both reach the trainer as documents, not as files to open.
    corpus = tmp_path / "c.txt"
    corpus.write_text("word " * 60 + "\n\n" + str(corpus) + "\n", encoding="utf-8")
    tok = tokenizer_for(open_source(str(corpus)), tmp_path / "run", vocab_size=100)
    assert tok.encode("word word") and (tmp_path / "run" / "tokenizer.json").is_file()


def test_cache_content_reuse_and_key(tmp_path: Path, tok: GPT1Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = write_corpus(tmp_path / "c")
    src = open_source(str(tmp_path / "c"))
    calls = []
    real = tokens_mod.encode_documents
    monkeypatch.setattr(tokens_mod, "encode_documents", lambda *a, **k: calls.append(1) or real(*a, **k))

    s1 = tokenize_to_cache(src, tok, tmp_path / "cache", progress=False)
    assert not s1.from_cache and len(calls) == 1
    sep = eod_id(tok)
    expected = [i for d in DOCS_A + DOCS_B for i in tok.encode(d) + [sep]]
    np.testing.assert_array_equal(s1.tokens, expected)
    assert s1.tokens.dtype == np.uint16 and s1.meta["n_docs"] == 4
    assert not list((tmp_path / "cache").glob(".tmp-*"))  # no temp left behind

    npy = s1.path / "tokens.npy"
    mtime = npy.stat().st_mtime_ns
    # A build killed (here: a dead pid's folder, quiet for a minute) while another finished this cache was never
    # swept: later reads of the cache left its gigabytes for good.
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = s1.path.with_name(f".tmp-{s1.path.name}-{dead.pid}-0123abcd")
    left.mkdir()
    (left / "tokens.bin").write_bytes(b"\0" * 64)
    for p in (left / "tokens.bin", left):
        os.utime(p, (time.time() - 60, time.time() - 60))
    s2 = tokenize_to_cache(open_source(str(tmp_path / "c")), tok, tmp_path / "cache", progress=False)
    assert s2.from_cache and len(calls) == 1 and s2.path == s1.path and npy.stat().st_mtime_ns == mtime
    assert not left.exists()

    # Keyed on the files: a changed file gives a new cache entry.
    a.write_text(a.read_text() + "\n\nanother document\n")
    os.utime(a, ns=(mtime + 10**9, mtime + 10**9))
    s3 = tokenize_to_cache(open_source(str(tmp_path / "c")), tok, tmp_path / "cache", progress=False)
    assert not s3.from_cache and s3.path != s1.path and len(s3) > len(s1)
    # ... and on the tokenizer.
    other = GPT1Tokenizer.train(iter(DOCS_A * 5), vocab_size=120)
    s4 = tokenize_to_cache(open_source(str(tmp_path / "c")), other, tmp_path / "cache", progress=False)
    assert not s4.from_cache and s4.path not in (s1.path, s3.path) and len(calls) == 3


def test_processes_together_make_the_global_batch() -> None:
    w = _windows()
    idx = np.arange(len(w))
    one = BatchIterator(w, idx, 8, seed=5, process_index=0, process_count=1)
    two = [BatchIterator(w, idx, 8, seed=5, process_index=p, process_count=2) for p in range(2)]
    for _ in range(3 * one.batches_per_epoch + 1):  # across epoch boundaries
        g = next(one)
        parts = [next(it) for it in two]
        for k in g:
            assert parts[0][k].shape[0] == 4
            np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), g[k])
    with pytest.raises(ValueError, match="not divisible"):
        BatchIterator(w, idx, 9, process_index=0, process_count=2)


def test_a_batch_the_processes_do_not_share_evenly_is_refused_without_data() -> None:
    """The rule BatchIterator applies, asked alone: `gpt1-jax evaluate` asks it before its pipeline, which tokenized
    --data first in every process (tests/e2e/test_multihost.py has the 2-process run)."""
    check_process_share(12, 4)
    check_process_share(3, 1)
    with pytest.raises(ConfigError) as e:
        check_process_share(3, 2)
    assert str(e.value) == ("global batch 3 is not divisible by the 2 processes (each reads an equal share of every "
                            "batch): give a batch size that is a multiple of 2")


def test_state_restore_gives_same_batches() -> None:
    w = _windows()
    idx = np.arange(len(w))
    it = BatchIterator(w, idx, 4, seed=1, process_index=0, process_count=1)
    for _ in range(it.batches_per_epoch + 3):  # mid-epoch of epoch 1
        next(it)
    state = json.loads(json.dumps(it.state()))
    assert state["epoch"] == 1 and state["index"] == 3
    expected = [next(it) for _ in range(2 * it.batches_per_epoch)]
    fresh = BatchIterator(w, idx, 4, seed=1, process_index=0, process_count=1)
    fresh.restore(state)
    for e in expected:
        got = next(fresh)
        for k in e:
            np.testing.assert_array_equal(got[k], e[k])
    with pytest.raises(ValueError, match="seed"):
        BatchIterator(w, idx, 4, seed=2, process_index=0, process_count=1).restore(state)


def test_val_iterator_covers_each_window_once_with_padding() -> None:
    w = PackedWindows(np.arange(11 * 4 + 1, dtype=np.uint32), 4)
    it = BatchIterator(w, np.arange(11), 4, shuffle=False, repeat=False, pad_last=True, process_index=0, process_count=1)
    batches = list(it)
    assert len(batches) == 3
    weights = np.concatenate([b["weights"][:, 0] for b in batches])
    firsts = np.concatenate([b["inputs"][:, 0] for b in batches])[weights > 0]
    assert weights.sum() == 11 and list(firsts // 4) == list(range(11))
    assert batches[-1]["weights"][3:].sum() == 0


def test_global_array_from_process_local_batch() -> None:
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    w = _windows()
    batch = next(BatchIterator(w, np.arange(len(w)), 8, process_index=0, process_count=1))
    g = {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}  # as Trainer.put_batch
    assert g["inputs"].shape == (8, 8) and g["inputs"].sharding == sharding
    np.testing.assert_array_equal(np.asarray(g["targets"]), batch["targets"])


def test_build_pipeline_end_to_end(tmp_path: Path, tok_path: Path) -> None:
    cfg = DataConfig(source="default", seq_len=64, global_batch_size=8, val_fraction=0.05,
                     tokenizer=str(tok_path), cache_dir=str(tmp_path / "cache"), progress=False)
    data = build_pipeline(cfg, tmp_path / "run")
    info = data.info
    assert info["documents"] > 50 and info["tokens"] > 100_000
    assert info["train_windows"] + info["val_windows"] == info["windows"] == (info["tokens"] - 1) // 64
    b = next(data.train_iter(process_index=0, process_count=1))
    assert b["inputs"].shape == (8, 64) and b["inputs"].max() < data.tokenizer.vocab_size
    assert sum(v["weights"][:, 0].sum() for v in data.val_iter(0, 1)) == info["val_windows"]
    assert build_pipeline(cfg, tmp_path / "run").stream.from_cache


# --- tensorflow-datasets ---------------------------------------------------------------------------
@functools.cache
def _tiny_builder_cls() -> type:
    tfds = pytest.importorskip("tensorflow_datasets", reason="tensorflow-datasets is not installed")

    class Gpt1JaxTinyText(tfds.core.GeneratorBasedBuilder):
        """Two splits of short documents with a 'text' and a 'title' feature."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self) -> tfds.core.DatasetInfo:
            # DatasetInfo directly: dataset_info_from_configs looks for package metadata files.
            feats = tfds.features.FeaturesDict({"text": tfds.features.Text(), "title": tfds.features.Text()})
            info = tfds.core.DatasetInfo(builder=self, features=feats)
            info.initialize_from_bucket = lambda: None  # its empty temp folder, left behind (gpt1_jax/data/glue.py)
            return info

        def _split_generators(self, dl_manager):  # noqa: ANN001, ANN202
            return {"train": self._generate_examples(12), "test": self._generate_examples(3)}

        def _generate_examples(self, n: int):  # noqa: ANN202
            for i in range(n):
                yield i, {"text": f"document {i}: the cat sat on the mat.", "title": f"title {i}"}

    return Gpt1JaxTinyText


def test_tfds_source_without_tensorflow(tmp_path: Path, tok_path: Path) -> None:
    pytest.importorskip("array_record", reason="array_record is not installed")
    builder = _tiny_builder_cls()(data_dir=str(tmp_path / "tfds"), file_format="array_record")
    builder.download_and_prepare()
    dd = tmp_path / "tfds"

    src = open_source(f"tfds:gpt1_jax_tiny_text?data_dir={dd}")
    docs = list(src.documents())
    assert sorted(docs) == sorted(f"document {i}: the cat sat on the mat." for i in range(12))
    assert docs == list(src.documents())  # stable order
    assert sorted(open_source(f"tfds:gpt1_jax_tiny_text:test?feature=title&data_dir={dd}").documents()) == [
        f"title {i}" for i in range(3)
    ]
    assert len(list(open_source(f"tfds:gpt1_jax_tiny_text:train[:50%]?data_dir={dd}").documents())) == 6

    for spec, match in [
        (f"tfds:gpt1_jax_tiny_text:validation?data_dir={dd}", "no split 'validation'"),
        (f"tfds:gpt1_jax_tiny_text?feature=body&data_dir={dd}", "no feature 'body'"),
        (f"tfds:no_such_dataset_xyz?data_dir={dd}", "not found"),
    ]:
        with pytest.raises(ValueError, match=match) as e:
            open_source(spec)
        assert repr(spec) in str(e.value) and "\n" not in str(e.value)

    cfg = DataConfig(source=f"tfds:gpt1_jax_tiny_text?data_dir={dd}", seq_len=8, global_batch_size=2,
                     tokenizer=str(tok_path), cache_dir=str(tmp_path / "cache"), progress=False)
    data = build_pipeline(cfg, tmp_path / "run")
    assert data.info["documents"] == 12 and next(data.train_iter(0, 1))["inputs"].shape == (2, 8)


def test_a_tfds_dataset_not_prepared_is_one_line_and_leaves_no_temp_folder(tmp_path: Path, capfd, caplog,
                                                                            monkeypatch) -> None:
    """lm1b (registered, never prepared here) said a WARNING about its folder before the error, and each try left an
    empty /tmp/tmp*tfds behind (tfds' folder for GCS metadata it does not fetch)."""
    pytest.importorskip("tensorflow_datasets", reason="tensorflow-datasets is not installed")
    scratch = tmp_path / "system-temp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(DataError, match=r"lm1b/\S+ is not prepared in .*download_and_prepare\(\)$") as e:
        open_source(f"tfds:lm1b?data_dir={tmp_path / 'tfds'}")
    assert "\n" not in str(e.value)
    assert not list(scratch.iterdir())
    _, err = capfd.readouterr()
    assert "Variant folder" not in err + caplog.text, (err, caplog.text)


def _long_document(shared_dir: Path, n_chars: int, long_word: int) -> str:
    """One paragraph of real text with line breaks, plus what the pipelines treat specially around whitespace."""
    with gzip.open(shared_dir / "data" / "corpus" / "english_mixed.txt.gz", "rt", encoding="utf-8") as f:
        lines = [line for line in f.read(n_chars).split("\n") if line.strip()]
    odd = ["AT&T &amp; R&D", "a <b>tag</b> &lt;", "＆ａｍｐ； fullwidth", "café naïve “quoted” — dash…",
           "Ã© mojibake", "tab\there  two  spaces", "carriage\rreturn", "ctrl\x01char", "中文字符 text",
           "e\u0301 \u0301x", "ΟΔΟΣ ς", "don't (e.g. U.S.) ?! -- ...", "x" * long_word, "  leading", "trailing  ",
           "\u2028sep\x85nel", "<3 :)"]
    step = max(1, len(lines) // (3 * len(odd)))
    for i, extra in enumerate(odd * 3):
        lines.insert((i + 1) * step, extra)
    return "\n".join(lines)


@pytest.mark.parametrize(("mode", "n_chars", "piece_chars"), [("hf", 2_000_000, None), ("original", 300_000, 8192)])
def test_long_documents_encode_in_pieces_to_the_ids_of_the_whole(shared_dir: Path, mode: str, n_chars: int,
                                                                 piece_chars: int | None) -> None:
    """A document longer than the piece bound is encoded in pieces (a 10 MB one no longer costs gigabytes at once);
    the ids must be exactly those of the whole, with OpenAI's vocabulary in both modes, a "word" longer than the
    bound included. (Mode "original" runs spaCy in Python: less text, a smaller bound, the same cuts.)"""
    if mode == "original":
        pytest.importorskip("ftfy")
        pytest.importorskip("spacy")
    vocab = shared_dir / "data" / "gpt1_vocab"
    tok = GPT1Tokenizer.from_original(vocab / "encoder_bpe_40000.json", vocab / "vocab_40000.bpe", mode=mode)
    bound = piece_chars or tokens_mod._PIECE_CHARS
    doc = _long_document(shared_dir, n_chars, long_word=bound + 1000)
    pieces = list(tokens_mod._pieces([doc, "short one"], bound, mode))
    assert len(pieces) > 10 and "".join(p for p, _ in pieces) == doc + "short one"
    if mode == "original":  # cuts inside lines, cuts at line ends, pieces after a "<": all three are exercised
        flags = [f for _, f in pieces[:-2]]
        assert 0 in flags and any(f & tokens_mod._NEWLINE for f in flags)
        assert any(f & tokens_mod._AFTER_LT for f in flags)

    sep = eod_id(tok)
    whole = tok.encode(doc) + [sep] + tok.encode("short one") + [sep]
    extra = {} if piece_chars is None else {"piece_chars": piece_chars}
    parts = list(tokens_mod.encode_documents([doc, "short one"], tok, np.dtype(np.uint16), sep, **extra))
    assert np.concatenate([a for a, _ in parts]).tolist() == whole
    assert sum(n for _, n in parts) == 2

    if mode == "hf":  # BPE training (GPT1Tokenizer.train runs mode "hf") gets the same pieces: the same words
        texts = [t for batch in tokens_mod._chunks([doc], tokens_mod._CHUNK_CHARS) for t in batch]
        assert texts == [p for p, _ in tokens_mod._pieces([doc], bound, "hf")]
        assert max(len(t) for t in texts if "x" * bound not in t) <= bound


def test_a_bpe_of_a_tasks_text_is_trained_once_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """finetune --init none trained a BPE in each run folder: HF's trainer gives another at each training, so two
    runs of one task and seed read other ids (4 identical commands, 2 different tokenizers)."""
    texts = (DOCS_A + DOCS_B) * 3
    trained = []
    real = GPT1Tokenizer.train
    monkeypatch.setattr(GPT1Tokenizer, "train", staticmethod(lambda *a, **k: trained.append(1) or real(*a, **k)))
    first = tokens_mod.bpe_of_texts(texts, 120, tmp_path / "cache", "cola training text")
    again = tokens_mod.bpe_of_texts(list(texts), 120, tmp_path / "cache", "cola training text")
    assert again.same_as(first) and trained == [1]
    other = tokens_mod.bpe_of_texts(texts[:-1], 120, tmp_path / "cache", "cola training text")
    assert trained == [1, 1] and other.vocab_size <= 123  # other text: its own BPE


def _frames(err: str) -> list[str]:
    """A bar's frames (and the lines between them), one per item."""
    return [f for f in err.replace("\r", "\n").splitlines() if f.strip()]


class _Streamed:
    """A source that cannot tell its size before it is read, as a tfds or HF dataset."""

    spec = "streamed"

    def documents(self):
        return iter(DOCS_A)

    def fingerprint(self) -> str:
        return "streamed"


def test_the_token_cache_bar_counts_a_file_sources_bytes_of_their_size(tmp_path: Path, tok: GPT1Tokenizer,
                                                                      capsys: pytest.CaptureFixture) -> None:
    """The bar had no total or ETA ("tokenizing ...: 10.8Mtok [00:15, 632ktok/s]": 36 min at BooksCorpus size). Of
    files it counts the bytes read (a .gz's compressed ones) of their size, the tokens and their rate beside; a
    source that cannot tell its size keeps counting tokens. The cache is what it was."""
    from gpt1_jax.metrics import Bar

    a, b = write_corpus(tmp_path / "c")
    source = open_source(str(tmp_path / "c"))
    told: list[int] = []
    assert list(source.documents(on_read=told.append)) == DOCS_A + DOCS_B
    assert sum(told) == source.total_bytes() == a.stat().st_size + b.stat().st_size
    stream = tokenize_to_cache(source, tok, tmp_path / "cache", progress=True)
    size = Bar.format_sizeof(source.total_bytes())
    last = _frames(capsys.readouterr().err)[-1]
    assert last.startswith(f"tokenizing {source.spec}: 100%|██████████| {size}/{size} ["), last
    assert re.search(rf", {Bar.format_sizeof(len(stream))}tok, \S+tok/s\]$", last), last
    expected = [t for arr, _ in tokens_mod.encode_documents(DOCS_A + DOCS_B, tok, stream.tokens.dtype, eod_id(tok))
                for t in arr]
    assert stream.tokens.tolist() == expected
    tokenize_to_cache(_Streamed(), tok, tmp_path / "cache", progress=True)
    assert re.match(r"tokenizing streamed: \S+tok \[", _frames(capsys.readouterr().err)[-1])
    tokenize_to_cache(open_source(str(b)), tok, tmp_path / "cache", progress=False)
    assert capsys.readouterr().err == ""


def test_a_bpe_of_a_tasks_text_shows_its_training(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """finetune --init none on SST-2 sat silent 6.9 s while its BPE trained; a BPE kept from before is at once."""
    texts = (DOCS_A + DOCS_B) * 3
    tokens_mod.bpe_of_texts(texts, 120, tmp_path / "cache", "cola training text", progress=True)
    frames = _frames(capsys.readouterr().err)
    assert frames[-2].startswith("BPE: counting words: 100%") and "computing the merges" in frames[-1], frames
    tokens_mod.bpe_of_texts(texts, 120, tmp_path / "cache", "cola training text", progress=True)
    assert capsys.readouterr().err == ""


def test_every_throughput_line_of_the_data_bench_names_the_cpu(tmp_path, capsys):
    """`python -m gpt1_jax.data`'s tokens/s and seconds came without the CPU's flags, which every other speed
    record carries (gpt1_jax/bench.py, experiments/scale/data_bench.py)."""
    from gpt1_jax.data import bench
    from gpt1_jax.flops import cpu_flags

    bench.main(["--workdir", str(tmp_path / "w"), "--cache-dir", str(tmp_path / "cache"), "--vocab-size", "300",
                "--seq-len", "32", "--batch-size", "4", "--batches", "3", "--no-progress"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["stage"] for line in lines] == ["tokenizer", "tokenize", "iterator"]
    assert all(line["cpu_flags"] == cpu_flags() for line in lines)
