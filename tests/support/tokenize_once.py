"""What tests/unit/test_tokenize_once.py and tests/e2e/test_tokenize_once.py share."""

import json
import os
import threading
import time
from pathlib import Path

import pytest

from gpt1_jax.data.sources import open_source
from gpt1_jax.data.tokens import tokenize_to_cache
from gpt1_jax.tokenizer import GPT1Tokenizer


ERROR = "gpt1-jax tokenize: error: "


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The pydoc corpus 4 times (~1 s to tokenise on 2 cores): long enough that both processes of a job ask
    for the cache while it is being built, so a second tokenisation would show."""
    docs = list(open_source("default").documents())
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(docs * 4) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory, corpus) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    GPT1Tokenizer.train(open_source("default").documents(), vocab_size=300).save(path)
    return path


def cache_name(corpus: Path, tok_path: Path, probe_dir: Path) -> str:
    """The cache's directory name (its key), which does not depend on the cache directory."""
    stream = tokenize_to_cache(open_source(str(corpus)), GPT1Tokenizer.load(tok_path), probe_dir, progress=False)
    return stream.path.name


class HeldLock:
    """Another job's builder, alive: the lock file exists and its mtime keeps moving."""

    def __init__(self, path: Path):
        self.path, self.stop = path, threading.Event()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"host": "elsewhere", "pid": 4242, "started": time.time()}))
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self):
        while not self.stop.wait(0.2):
            os.utime(self.path)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.path.unlink(missing_ok=True)
