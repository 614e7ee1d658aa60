"""What tests/unit/test_data.py and tests/e2e/test_data.py share."""

from __future__ import annotations
import gzip
from pathlib import Path

import numpy as np

from gpt1_jax.data import PackedWindows


DOCS_A = ["the cat sat on the mat.\nit was a sunny day.", "a second document, on two\nlines."]


DOCS_B = ["gzip holds this document.", "and this one; the end."]


def write_corpus(d: Path) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    a, b = d / "a.txt", d / "b.txt.gz"
    # Several blank lines and trailing whitespace-only lines must not make empty documents.
    a.write_text("\n\n" + DOCS_A[0] + "\n\n\n  \n" + DOCS_A[1] + "\n", encoding="utf-8")
    with gzip.open(b, "wt", encoding="utf-8") as f:
        f.write("\n\n".join(DOCS_B) + "\n")
    (d / "notes.md").write_text("not a text file\n")
    return a, b


# --- iterator ----------------------------------------------------------------------------------------
def _windows(n: int = 50, T: int = 8) -> PackedWindows:
    rng = np.random.default_rng(0)
    return PackedWindows(rng.integers(0, 300, n * T + 1).astype(np.uint16), T)
