"""GPT-1 byte-pair-encoding tokenizer on top of Hugging Face `tokenizers` (Rust).

Two pre-tokenisation modes share one BPE model (lowercase, `</w>` end-of-word suffix):

* ``"hf"`` (default): exactly the pipeline of transformers' ``OpenAIGPTTokenizer``
  (BERT normaliser: clean text, lowercase, strip accents; BERT pre-tokeniser: split on
  whitespace and every punctuation character). Runs fully in Rust.
* ``"original"``: the pipeline of OpenAI's finetune-transformer-lm (``ftfy.fix_text`` ->
  ``text_standardize`` -> spaCy English tokenizer -> lowercase) done in Python, the BPE
  step in Rust. Needs the ``original`` extra (ftfy, spacy).

Vocabulary layout (OpenAI's files): 0 ``<unk>``, base symbols, the same with ``</w>``, one
token per merge, ``\\n</w>``; then the fine-tuning markers ``_start_``, ``_delimiter_``,
``_classify_`` appended (40478, 40479, 40480 for the released vocabulary).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import re
import warnings
from collections.abc import Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Callable

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from gpt1_jax.errors import ConfigError, DataError
from gpt1_jax.files import atomic_write_text
from gpt1_jax.metrics import Bar, say

__all__ = ["GPT1Tokenizer", "SPECIAL_TOKENS", "UNK_TOKEN", "EOW_SUFFIX", "MODES", "find_tokenizer", "text_standardize"]

UNK_TOKEN = "<unk>"
EOW_SUFFIX = "</w>"
SPECIAL_TOKENS = ("_start_", "_delimiter_", "_classify_")
MODES = ("hf", "original")
_META_KEY = "gpt1_jax"  # lives inside the JSON's "model" section, which tokenizers ignores on load
_INSTALL_HINT = "pip install gpt1-jax[original]"

# The original's punctuation padding (finetune-transformer-lm/text_utils.py); it exists because
# spaCy glued runs such as "--" or "?!" to neighbouring words in BooksCorpus.
_PUNCT_RUNS = re.compile(r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)""")
_NEWLINES = re.compile(r"\s*\n\s*")
_SPACES = re.compile(r"[^\S\n]+")


def text_standardize(text: str) -> str:
    """The original's text_standardize: unify dashes/ellipsis/acute, pad punctuation, squash spaces."""
    text = text.replace("—", "-").replace("–", "-").replace("―", "-")
    text = text.replace("…", "...").replace("´", "'")
    text = _PUNCT_RUNS.sub(r" \1 ", text)
    text = _NEWLINES.sub(" \n ", text)
    text = _SPACES.sub(" ", text)
    return text.strip()


def _load_original_pipeline() -> tuple[Callable[[str], str], Any]:
    """Import ftfy and spaCy only when the original mode is used: they are heavy optional deps."""
    try:
        import ftfy
        import spacy
    except ImportError as e:
        missing = f"{e.name} is missing"
        raise ImportError(f'mode="original" needs ftfy and spacy ({missing}): {_INSTALL_HINT}') from None
    # A blank English pipeline carries the same tokenizer rules as the 'en' model OpenAI loaded,
    # without a model download.
    return ftfy.fix_text, spacy.blank("en").tokenizer


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except (OSError, ValueError):  # name too long, embedded NUL: not a file either
        return False


def _check_file(path: str | Path, what: str) -> Path:
    p = Path(path)
    if not _is_file(p):
        raise FileNotFoundError(f"{p}: {what} not found")
    return p


def _read_encoder(path: str | Path) -> dict[str, int]:
    p = _check_file(path, "encoder JSON (token -> id)")
    try:
        enc = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{p}: not valid UTF-8 JSON ({e})") from None
    if not isinstance(enc, dict) or not enc or not all(
        isinstance(k, str) and type(v) is int for k, v in enc.items()
    ):
        raise DataError(f"{p}: expected a non-empty JSON object mapping token strings to integer ids")
    if sorted(enc.values()) != list(range(len(enc))):
        raise DataError(f"{p}: token ids must be exactly 0..{len(enc) - 1}, each used once")
    if enc.get(UNK_TOKEN) != 0:
        raise DataError(f"{p}: {UNK_TOKEN!r} must have id 0")
    return enc


def _read_merges(path: str | Path) -> list[tuple[str, str]]:
    p = _check_file(path, "BPE merges file")
    try:
        lines = p.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not valid UTF-8 ({e})") from None
    merges: list[tuple[str, str]] = []
    for lineno, line in enumerate(lines, 1):
        if (lineno == 1 and line.startswith("#version")) or not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise DataError(f"{p}:{lineno}: expected 'left right' merge, got {line!r}")
        merges.append((parts[0], parts[1]))
    if not merges:
        raise DataError(f"{p}: contains no merges")
    return merges


def _build_backend(vocab: dict[str, int], merges: list[tuple[str, str]], mode: str) -> Tokenizer:
    """The Rust tokenizer: HF's OpenAIGPTTokenizer setup plus the three markers in the vocab."""
    vocab = dict(vocab)
    clash = [s for s in SPECIAL_TOKENS if s in vocab]
    if clash:
        raise DataError(f"vocabulary already contains {clash}; specials are appended by GPT1Tokenizer")
    base = len(vocab)
    for i, tok in enumerate(SPECIAL_TOKENS):
        # Plain vocab entries, not added tokens: BPE can never produce them (no merge builds them),
        # so text like "_start_" is tokenised as text, as in both the original and HF.
        vocab[tok] = base + i
    backend = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            unk_token=UNK_TOKEN,
            continuing_subword_prefix="",
            end_of_word_suffix=EOW_SUFFIX,
            fuse_unk=False,  # one <unk> per unknown symbol, like the original's encoder.get(t, 0)
            dropout=None,
        )
    )
    backend.add_special_tokens([UNK_TOKEN])  # as HF does (it makes a literal "<unk>" in text id 0)
    if mode == "hf":
        backend.normalizer = normalizers.BertNormalizer(lowercase=True)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # In "original" mode words arrive pre-split and lowercased from Python (spaCy), so the Rust
    # side must not split again: a whitespace splitter would drop the "\n" word (id of "\n</w>").
    backend.decoder = decoders.BPEDecoder(suffix=EOW_SUFFIX)
    return backend


def _gpt1_layout(
    trained: dict[str, int], merges: list[tuple[str, str]], vocab_size: int
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Re-number a trained vocabulary like OpenAI's: <unk>, symbols, symbols+</w>, merges in order.

    GPT-1's vocabulary has both forms of every symbol ("c", "c</w>"), so a known character is never <unk>
    whatever its position (`_fit_bpe` gives the trainer every "c</w>"; its own would only be those it saw
    word-finally). Trailing merges are dropped if the symbols would push the vocabulary past ``vocab_size``.
    """
    stems = (t.removesuffix(EOW_SUFFIX) for t in trained if t != UNK_TOKEN)
    symbols = sorted({s for s in stems if len(s) == 1})  # the trainer's alphabet
    base = [UNK_TOKEN, *symbols, *(c + EOW_SUFFIX for c in symbols)]
    merges = merges[: max(0, vocab_size - len(base))]
    tokens = base + [a + b for a, b in merges]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}, merges


def _training_files(source: str | Path | Iterable[str | Path]) -> list[Path] | None:
    """The files to train on, or None when ``source`` holds the texts themselves.

    A str/Path, or a list/tuple whose first item is a Path or names an existing file, means files
    (all must exist: a mistyped path must not silently become training text).
    """
    if isinstance(source, (str, Path)):
        names: Sequence[str | Path] = [source]
    elif isinstance(source, (list, tuple)) and source and _names_file(source[0]):
        names = source
    else:
        return None
    return [_check_file(name, "training text file") for name in names]


def _names_file(x: object) -> bool:
    # Only the first item is checked: stat-ing every text of a large list costs seconds.
    if isinstance(x, Path):
        return True
    return isinstance(x, str) and "\n" not in x and len(x) < 4096 and _is_file(Path(x))


_HF_NORMALIZER = normalizers.BertNormalizer(lowercase=True)
_HF_PRE_TOKENIZER = pre_tokenizers.BertPreTokenizer()


def _hf_words(text: str) -> list[str]:
    """The words "hf" mode trains on: transformers' OpenAIGPTTokenizer's normaliser, then its pre-tokeniser."""
    return [word for word, _ in _HF_PRE_TOKENIZER.pre_tokenize_str(_HF_NORMALIZER.normalize_str(text))]


def _raw_chars(texts: Iterable[str | list[str]]) -> set[str]:
    """Every character of the texts (an item may be a batch, a list of texts)."""
    chars: set[str] = set()
    for item in texts:
        for text in [item] if isinstance(item, str) else item:
            chars.update(text)
    return chars


_SLICE = 256  # texts the trainer takes from an iterator at a time (tokenizers' PyBufferedIterator): a bar's step


def _counted(items: Iterable[Any], make_bar: Callable[[], Bar]) -> Generator[Any, None, int]:
    """`items` (texts, or lists of texts) counted in characters on a bar -> their characters. A list comes in slices
    of _SLICE texts, the same texts to the trainer, so that the bar moves as the trainer takes them. The bar is made
    with the first item: a text that cannot be read at all is one error line, without a bar before it."""
    bar = None
    try:
        for item in items:
            if bar is None:
                bar = make_bar()
            for part in [item] if isinstance(item, str) else _slices(item):
                bar.update(len(part) if isinstance(part, str) else sum(map(len, part)))
                yield part
    finally:
        if bar is not None:
            bar.close()
    return 0 if bar is None else bar.n


def _slices(texts: Iterable[str]) -> Iterator[Sequence[str]]:
    texts = texts if isinstance(texts, (list, tuple)) else list(texts)
    return (texts[i: i + _SLICE] for i in range(0, len(texts), _SLICE))


class _ShownReads:
    """The reads of the texts, each on a bar of their characters (stderr). tokenizers' own bars are left off: without
    a length its first counts up to a total of 0 ("58576 / 0"), and its merges bar starts at the count of the bar
    before it ("3356 / 509"). The first read (the alphabet) counts the characters, the total of the reads that
    train; after each of those a status line, since the trainer then computes its merges in silence."""

    def __init__(self, texts: Callable[[], Iterable[Any]], vocab_size: int):
        self.texts, self.vocab_size = texts, vocab_size
        self.chars: int | None = None
        self.trainings = 0

    def first(self) -> Iterator[Any]:
        self.chars = yield from _counted(self.texts(), lambda: Bar(desc="BPE: reading the text", unit="char",
                                                                   unit_scale=True))

    def __call__(self) -> Iterator[Any]:
        self.trainings += 1
        again = " again (its alphabet grew)" if self.trainings > 1 else ""
        if (yield from _counted(self.texts(), lambda: Bar(total=self.chars, desc=f"BPE: counting words{again}",
                                                          unit="char", unit_scale=True))):
            say(f"BPE: computing the merges of a {self.vocab_size}-token vocabulary")


def _fit_bpe(texts: Callable[[], Iterable[Any]], files: list[Path] | None,
             original_words: Callable[[str], list[str]] | None, symbols: set[str], *, vocab_size: int,
             min_frequency: int, limit_alphabet: int | None, show_progress: bool) -> dict[str, Any]:
    """tokenizers' BPE trainer on `texts()` (or `files`) -> its model (vocab, merges), the same in every process.

    The trainer numbers each symbol's end-of-word form ("c</w>") when it first meets it, walking a hash map whose
    order changes from one training to the next, and it breaks ties between pairs seen equally often by those
    numbers: two trainings on the same texts learned different merges (huggingface/tokenizers issue 1794). Given
    as special tokens in sorted order, the forms of `symbols` (the alphabet it will find) are numbered before it
    starts, so every tie is broken the same way. `original_words`: "original" mode's words, made in Python.
    `show_progress`: a status line where the trainer reads `files` itself (texts() shows its own bars)."""
    options: dict[str, Any] = {} if limit_alphabet is None else {"limit_alphabet": limit_alphabet}
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[UNK_TOKEN, *sorted(c + EOW_SUFFIX for c in symbols)],  # <unk> first, so it gets id 0
        end_of_word_suffix=EOW_SUFFIX,
        show_progress=False,  # _ShownReads says why
        **options,
    )
    scratch = Tokenizer(BPE(unk_token=UNK_TOKEN, end_of_word_suffix=EOW_SUFFIX))
    if original_words is None:
        scratch.normalizer = _HF_NORMALIZER
        scratch.pre_tokenizer = _HF_PRE_TOKENIZER
        if files is not None and not any(p.suffix == ".gz" for p in files):
            if show_progress:
                say(f"BPE: counting the words of {len(files)} file(s) and computing the merges")
            scratch.train([str(p) for p in files], trainer=trainer)  # Rust reads files in parallel
        else:
            scratch.train_from_iterator(texts(), trainer=trainer)
    else:
        # Without a Rust pre-tokeniser each string of a yielded list is one word.
        def words(item: str | list[str]) -> list[str]:  # an item may be a batch of texts
            return original_words(item) if isinstance(item, str) else [w for t in item for w in original_words(t)]

        scratch.train_from_iterator((words(t) for t in texts()), trainer=trainer)
    return json.loads(scratch.to_str())["model"]


def _read_lines(paths: list[Path]) -> Iterator[str]:
    for p in paths:
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt", encoding="utf-8") as f:
            yield from f


class GPT1Tokenizer:
    """GPT-1 BPE tokenizer; see the module docstring for the modes and the vocabulary layout."""

    def __init__(self, backend: Tokenizer, mode: str = "hf") -> None:
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        ids = [backend.token_to_id(s) for s in SPECIAL_TOKENS]
        if None in ids or backend.token_to_id(UNK_TOKEN) != 0:
            raise DataError(f"tokenizer lacks {UNK_TOKEN!r} at id 0 or one of {SPECIAL_TOKENS}")
        self._backend = backend
        self._mode = mode
        self._special_ids = tuple(ids)
        # "original" never treats "<unk>" in text as the unk token; HF does. The flag is not
        # serialised by tokenizers, hence set here.
        backend.encode_special_tokens = mode == "original"
        # Fail at construction, not at the first encode, when ftfy/spacy are missing.
        self._words: Callable[[str], list[str]] | None = None
        if mode == "original":
            self._words = self._original_words_fn()

    # construction ---------------------------------------------------------------------------------
    @classmethod
    def from_original(
        cls, encoder_json: str | Path, bpe_merges: str | Path, mode: str = "hf"
    ) -> GPT1Tokenizer:
        """Load OpenAI's ``encoder_bpe_40000.json`` and ``vocab_40000.bpe``."""
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        vocab, merges = _read_encoder(encoder_json), _read_merges(bpe_merges)
        try:
            backend = _build_backend(vocab, merges, mode)
        except Exception as e:  # tokenizers raises a bare Exception for merges outside the vocab
            raise DataError(f"{bpe_merges}: merges do not fit {encoder_json}: {e}") from None
        return cls(backend, mode)

    @classmethod
    def train(
        cls,
        files_or_iterator: str | Path | Sequence[str | Path] | Iterable[str],
        vocab_size: int = 40478,
        min_frequency: int = 2,
        mode: str = "hf",
        limit_alphabet: int | None = None,
        show_progress: bool = False,
    ) -> GPT1Tokenizer:
        """Train a GPT-1-style BPE on text files (lines; ``.gz`` ok) or an iterable of texts.

        The iterable may also yield lists of texts (batches). A str, a Path, or a list whose first
        item is a Path or an existing file's name, is read as files. The texts are read twice (their
        symbols, then the BPE): an iterable whose ``__iter__`` starts again is read again, an
        iterator is kept in memory.

        ``vocab_size`` counts ``<unk>``, the alphabet (with and without ``</w>``) and the merges,
        not the three markers appended afterwards (so 40478 gives GPT-1's sizes).

        The same texts give the same BPE in every process and on every machine (`_fit_bpe` says how),
        unless ``limit_alphabet`` cuts the alphabet between symbols seen equally often.

        ``show_progress``: bars of the reads of the texts and a status line while the merges are computed (stderr).
        """
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        if vocab_size < 1:
            raise ConfigError(f"vocab_size must be >= 1, got {vocab_size}")
        files = _training_files(files_or_iterator)
        if files is not None:
            def texts() -> Iterable[str]:
                return _read_lines(files)
        else:
            kept = list(files_or_iterator) if iter(files_or_iterator) is files_or_iterator else files_or_iterator

            def texts() -> Iterable[str]:
                return kept
        original_words = cls._original_words_fn() if mode == "original" else None
        shown = _ShownReads(texts, vocab_size) if show_progress else None
        chars = _raw_chars(shown.first() if shown else texts())
        symbols = {c for raw in chars for word in (original_words or _hf_words)(raw) for c in word}
        if original_words and "\n" in chars:  # a line break is a word there, which a lone "\n" (stripped) is not
            symbols.add("\n")
        fit = functools.partial(_fit_bpe, shown or texts, files, original_words, vocab_size=vocab_size,
                                min_frequency=min_frequency, limit_alphabet=limit_alphabet, show_progress=show_progress)
        model = fit(symbols)
        trained = {t for t in model["vocab"] if len(t) == 1}  # the trainer's own alphabet: merges are longer
        if trained != symbols:  # a symbol the text's characters alone did not foretell: train again, knowing it
            model = fit(trained)
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        vocab, merges = _gpt1_layout(model["vocab"], merges, vocab_size)
        return cls(_build_backend(vocab, merges, mode), mode)

    def save(self, path: str | Path) -> None:
        """Write one tokenizers JSON file; plain ``tokenizers.Tokenizer.from_file`` can read it too.
        Atomically: a reader (a resumed run, another process) sees the old file or the whole new one."""
        data = json.loads(self._backend.to_str())
        data["model"][_META_KEY] = {"mode": self._mode, "special_tokens": list(SPECIAL_TOKENS)}
        atomic_write_text(Path(path), json.dumps(data, ensure_ascii=False))

    def save_hf(self, folder: str | Path, model_max_length: int) -> None:
        """Write the files transformers' tokenizers read into `folder`: vocab.json + merges.txt (the
        layout of HF's openai-gpt: no markers), tokenizer.json and tokenizer_config.json
        (OpenAIGPTTokenizer). transformers' AutoTokenizer then gives this tokenizer's ids. transformers
        splits words with BERT's rules, as mode "hf" does, so an "original" tokenizer is written as its
        "hf" twin (same vocabulary; texts where spaCy splits differently get other ids)."""
        if self._mode != "hf":
            warnings.warn('transformers has no spaCy word splitting: the files written reproduce mode "hf", not '
                          f'{self._mode!r}', stacklevel=2)
        model = json.loads(self._backend.to_str())["model"]
        vocab = {t: i for t, i in model["vocab"].items() if i < self.base_vocab_size}
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        folder = Path(folder)
        (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
        GPT1Tokenizer(_build_backend(vocab, merges, "hf"), "hf").save(folder / "tokenizer.json")
        hf_config = {"tokenizer_class": "OpenAIGPTTokenizer", "unk_token": UNK_TOKEN, "model_max_length": model_max_length}
        (folder / "tokenizer_config.json").write_text(json.dumps(hf_config, indent=2) + "\n", encoding="utf-8")

    def same_as(self, other: GPT1Tokenizer) -> bool:
        """Whether `other` gives the same ids for every text (its vocabulary, merges, word splitting and mode)."""
        return self._mode == other._mode and self._backend.to_str() == other._backend.to_str()

    @classmethod
    def load(cls, path: str | Path) -> GPT1Tokenizer:
        p = _check_file(path, "tokenizer JSON")
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            meta = data["model"].pop(_META_KEY)
            backend = Tokenizer.from_str(json.dumps(data))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise DataError(f"{p}: not a tokenizer saved by GPT1Tokenizer.save") from None
        except Exception as e:  # tokenizers' own parse errors
            raise DataError(f"{p}: tokenizers cannot read it: {e}") from None
        return cls(backend, meta["mode"])

    @classmethod
    def from_path(cls, path: str | Path) -> GPT1Tokenizer | None:
        """A saved tokenizer .json, or a folder holding one of: OpenAI's `encoder_bpe_40000.json` +
        `vocab_40000.bpe`, HF's `vocab.json` + `merges.txt`, our `tokenizer.json`. None if none is there. A string
        (a flag, a config's value) may start with '~'; a Path is a folder already found (a model's), taken as it is:
        `Path("./~/run")` prints as "~/run", which expanded would be another folder than the model's."""
        p = Path(os.path.expanduser(path)) if isinstance(path, str) else Path(path)
        if p.is_file():
            return cls.load(p)
        for enc, merges in (("encoder_bpe_40000.json", "vocab_40000.bpe"), ("vocab.json", "merges.txt")):
            if (p / enc).is_file() and (p / merges).is_file():
                return cls.from_original(p / enc, p / merges)
        if (p / "tokenizer.json").is_file():
            check_recorded_digest(p)
            return cls.load(p / "tokenizer.json")
        return None

    # properties -----------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self._mode

    @property
    def backend(self) -> Tokenizer:
        """The underlying ``tokenizers.Tokenizer`` (in "original" mode it expects pre-split words)."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of ids including the three markers (size of the embedding table)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def base_vocab_size(self) -> int:
        """Number of BPE ids without the markers (40478 for OpenAI's vocabulary)."""
        return self.vocab_size - len(SPECIAL_TOKENS)

    @property
    def unk_id(self) -> int:
        return 0

    @property
    def start_id(self) -> int:
        return self._special_ids[0]

    @property
    def delimiter_id(self) -> int:
        return self._special_ids[1]

    @property
    def classify_id(self) -> int:
        return self._special_ids[2]

    @property
    def special_ids(self) -> tuple[int, int, int]:
        return self._special_ids  # type: ignore[return-value]

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._backend.id_to_token(i)

    # encoding -------------------------------------------------------------------------------------
    @staticmethod
    def _original_words_fn() -> Callable[[str], list[str]]:
        fix_text, spacy_tok = _load_original_pipeline()

        def words(text: str) -> list[str]:
            out = []
            for tok in spacy_tok(text_standardize(fix_text(text))):
                w = tok.text
                if w.isspace():
                    # spaCy yields "\n " for the " \n " that text_standardize leaves; the original
                    # maps it to "\n</w>". Other space tokens cannot survive text_standardize.
                    if "\n" in w:
                        out.append("\n")
                    continue
                out.append(w.lower())
            return out

        return words

    def _split(self, text: str) -> list[str]:
        assert self._words is not None, "only used in original mode"
        return self._words(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no markers are added."""
        if self._mode == "hf":
            return self._backend.encode(text, add_special_tokens=False).ids
        return self._backend.encode(self._split(text), is_pretokenized=True, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Like ``encode`` over many texts, parallel in Rust (the Python spaCy step is serial)."""
        if self._mode == "hf":
            encs = self._backend.encode_batch(list(texts), add_special_tokens=False)
        else:
            words = [self._split(t) for t in texts]
            encs = self._backend.encode_batch(words, is_pretokenized=True, add_special_tokens=False)
        return [e.ids for e in encs]

    def tokenize(self, text: str) -> list[str]:
        """BPE pieces of ``text`` (for inspection)."""
        return [self._backend.id_to_token(i) for i in self.encode(text)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Join BPE pieces back into lowercase text (words separated by single spaces).

        The markers decode as stand-alone words (``_start_`` ...) or are dropped with
        ``skip_special_tokens``; ``<unk>`` is always kept.
        """
        specials = set(self._special_ids)
        parts: list[str] = []
        run: list[int] = []
        for i in map(int, ids):
            if i in specials:
                # BPEDecoder would glue a marker (it has no </w>) onto the next word.
                if run:
                    parts.append(self._backend.decode(run, skip_special_tokens=False))
                    run = []
                if not skip_special_tokens:
                    parts.append(self._backend.id_to_token(i))
            else:
                run.append(i)
        if run:
            parts.append(self._backend.decode(run, skip_special_tokens=False))
        return " ".join(p for p in parts if p)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"GPT1Tokenizer(mode={self._mode!r}, vocab_size={self.vocab_size})"


TOKENIZER_META = "tokenizer.meta.json"  # a pre-training run's record of the BPE it trained (gpt1_jax/data/tokens.py)


def check_recorded_digest(folder: Path) -> None:
    """A run folder's tokenizer.json is the one its tokenizer.meta.json recorded, or DataError: another run's copied
    over it made sample, evaluate --data and convert read other ids with this run's weights, without a word."""
    try:
        recorded = json.loads((folder / TOKENIZER_META).read_text(encoding="utf-8")).get("sha256")
    except (OSError, ValueError):
        return  # none recorded (a model folder, an older run), or a damaged record that resuming names
    path = folder / "tokenizer.json"
    if recorded and hashlib.sha256(path.read_bytes()).hexdigest() != recorded:
        raise DataError(f"{path} is damaged (it no longer matches the sha256 in {TOKENIZER_META}): restore it from a "
                        "copy; the run's checkpoints need this very tokenizer")


def find_tokenizer(spec: str | Path | None, source: str | Path | None, *,
                   model_vocab_size: int | None = None) -> GPT1Tokenizer | None:
    """The tokenizer `spec` names (a tokenizer .json or a vocabulary folder, see `GPT1Tokenizer.from_path`)
    or, without `spec`, the one in the `source` folder; None when there is none to find.

    With `model_vocab_size` (the rows of the model's embedding table) a tokenizer of another model is
    one ConfigError naming both sizes: the table has a row per token, markers included or, for HF's
    openai-gpt and OpenAI's release (which add them when fine-tuning), all but the 3 markers."""
    if spec:
        tok = GPT1Tokenizer.from_path(spec)
        if tok is None:
            raise FileNotFoundError(f"--tokenizer {spec}: not a tokenizer .json nor a folder with encoder_bpe_40000.json + "
                                    "vocab_40000.bpe or vocab.json + merges.txt")
    elif source is not None:
        tok = GPT1Tokenizer.from_path(source)
    else:
        return None
    if tok is not None and model_vocab_size is not None and model_vocab_size not in (tok.vocab_size, tok.base_vocab_size):
        raise ConfigError(f"{spec or source}: the tokenizer has {tok.base_vocab_size} tokens + {len(SPECIAL_TOKENS)} "
                          f"markers but the model's embedding table has {model_vocab_size} rows: they do not belong "
                          f"together")
    return tok
