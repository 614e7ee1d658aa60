"""What tests/unit/test_checkpoint.py and tests/e2e/test_checkpoint.py share."""

from pathlib import Path

import numpy as np


def corrupt(path: Path, n: int = 256) -> None:
    """`n` random bytes written over the middle of a file."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(max(size // 2 - n // 2, 0))
        f.write(np.random.default_rng(0).bytes(min(n, size)))


def largest_file(folder: Path) -> Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
