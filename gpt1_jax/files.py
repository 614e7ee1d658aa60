"""The one way gpt1-jax writes a small file that others may read while it is written (run identity, configs,
tokenizers, metadata, plots): whole or not at all; the one way it writes a folder so (`staging_folder`: models,
token caches, kept BPEs, unpacked GLUE); where its caches live by default (`user_cache`); how an error names
what a folder holds (`some_names`); whether an output file may be written (`check_new_file`); and matplotlib for
the plots (`pyplot`, `save_figure`)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpt1_jax.errors import OutputExistsError
from gpt1_jax.lockfile import remove_abandoned


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


def check_new_file(path: Path, overwrite: bool, flag: str = "--out") -> None:
    """Refuses an output file that is a folder, or that exists and nobody said to replace: asked before the work
    that makes it, so nothing is computed for a file that cannot be written."""
    if path.is_dir():
        raise OutputExistsError(f"{flag} {path} is a folder: name a file")
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{flag} {path} exists; nothing was written: pass --overwrite to replace it, or "
                                "name another file")


def folder_problem(path: Path) -> str | None:
    """Why a file cannot be made at `path` for its folder ("its folder ... does not exist", or is a file); None
    when the folder is there."""
    folder = Path(path).parent
    if folder.is_dir():
        return None
    return f"{folder} is a file, not a folder" if folder.exists() else f"its folder {folder} does not exist"


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def sweep_staging_folders(final: Path, *, dead_quiet_s: float = 0.0, stale_s: float | None = None) -> None:
    """Removes the staging folders (`staging_folder`) that killed writers of `final` left beside it, by
    lockfile.remove_abandoned's rules: a writer on this host gone and its files quiet `dead_quiet_s`; with
    `stale_s`, any writer's files quiet that long (one that may be on another host)."""
    remove_abandoned(final.parent, f".tmp-{final.name}-", dead_quiet_s=dead_quiet_s, stale_s=stale_s)


@contextmanager
def staging_folder(final: Path, *, dead_quiet_s: float = 0.0, stale_s: float | None = None) -> Iterator[Path]:
    """A fresh empty folder beside `final` (`.tmp-<name>-<pid>-<random>`) for the caller to fill and then rename
    onto `final`, so that readers see no folder or a whole one; whatever is left of it on the way out (an error, a
    Ctrl-C) is deleted. The ones killed writers left are swept first (`sweep_staging_folders`)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep_staging_folders(final, dead_quiet_s=dead_quiet_s, stale_s=stale_s)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
    finally:  # renamed onto `final`: nothing here any more
        shutil.rmtree(tmp, ignore_errors=True)


def pyplot():
    """matplotlib.pyplot on its file-only backend (Agg: no display on servers and CI), imported here on first use:
    it takes ~1 s, for the few commands that draw."""
    import matplotlib

    matplotlib.use("Agg")
    # Imported after use("Agg"), matplotlib's order: before it, pyplot would have chosen the backend itself.
    import matplotlib.pyplot as plt

    return plt


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
