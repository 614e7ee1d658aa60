"""The one way gpt1-jax writes a small file that others may read while it is written (run identity, configs,
tokenizers, metadata): whole or not at all."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of one (a unique temporary name: safe with
    several processes writing the same file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:  # stopped half-way (Ctrl-C, a full disk): no temporary file left behind
        tmp.unlink(missing_ok=True)
