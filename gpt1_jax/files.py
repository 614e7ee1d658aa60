"""The one way gpt1-jax writes a small file that others may read while it is written (run identity, configs,
tokenizers, metadata, plots): whole or not at all; where its caches live by default (`user_cache`); and how an
error names what a folder holds (`some_names`)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(temporary path)`, then the temporary file takes `path`'s place: readers see the old file or the new
    one, never half of one (a unique temporary name: safe with several processes writing the same file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:  # stopped half-way (Ctrl-C, a full disk): no temporary file left behind
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def save_figure(fig, path: Path, **kwargs) -> None:
    """A matplotlib figure saved whole or not at all, in the format its name says."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=Path(path).suffix.lstrip("."), **kwargs))


def user_cache(name: str) -> Path:
    """<$XDG_CACHE_HOME or ~/.cache>/gpt1_jax/<name>: the caches shared by every run on the machine (token streams,
    compiled programs, prepared GLUE)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpt1_jax" / name


def some_names(names: list[str], shown: int = 3) -> str:
    """The first `shown` of `names` for a one-line error about a folder's contents, "..." for the rest."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")
