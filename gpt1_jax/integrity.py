"""Digests of a checkpoint's files: recorded when its save is finalised, checked before it is used.

`record(folder)` writes `integrity.json` into a checkpoint's folder: the size and a SHA-256 digest of
every file under it. `checkpoint.Checkpointer` calls it from orbax's post-finalisation callback, when
the files are complete and before orbax renames the temporary folder into place, so the digests are
committed together with the checkpoint (docs/stack.md, docs/checkpoints.md): a finished save
always has them.
`verify(folder)` gives None when every recorded file is there with its size and digest, else what
failed, in words. Files that appear later are ignored; orbax's commit markers (the step folder's
`_CHECKPOINT_METADATA`, which gets its commit time after the callback, and each folder's
`commit_success.txt`, which names the folder's absolute path) are not recorded, as none holds training
state; a record made before 2026-11-27 lists the subfolders' `commit_success.txt`, which `verify` skips,
so a checkpoint copied elsewhere (experiments/paper/release.py keep_pretraining) may rewrite them.

A file is hashed in 32 MiB blocks on a thread pool (hashlib releases the GIL), its digest being the
SHA-256 of its blocks' SHA-256s, so one large array file still uses every core.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DIGESTS = "integrity.json"
UNRECORDED = frozenset({DIGESTS, "_CHECKPOINT_METADATA"})  # in the step folder itself
MARKER = "commit_success.txt"  # in any folder of the checkpoint
BLOCK_BYTES = 32 << 20
MAX_LISTED = 3  # problems named in one message


def _files(folder: Path) -> list[str]:
    found = []
    for root, _, names in os.walk(folder):
        rel = Path(root).relative_to(folder)
        found += [(rel / n).as_posix() for n in names if n != MARKER and (rel.parts or n not in UNRECORDED)]
    return sorted(found)


def _block_digest(path: Path, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return hashlib.sha256(f.read(BLOCK_BYTES)).digest()


def _digests(folder: Path, sizes: dict[str, int]) -> dict[str, str]:
    """{relative path: hex digest} of the files named in `sizes` (read up to the size given)."""
    blocks = [(rel, offset) for rel, size in sizes.items() for offset in range(0, max(size, 1), BLOCK_BYTES)]
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        parts = pool.map(lambda b: _block_digest(folder / b[0], b[1]), blocks)
        by_file: dict[str, list[bytes]] = {rel: [] for rel in sizes}
        for (rel, _), part in zip(blocks, parts):
            by_file[rel].append(part)
    return {rel: hashlib.sha256(b"".join(parts)).hexdigest() for rel, parts in by_file.items()}


def record(folder: str | os.PathLike) -> None:
    """Writes `folder/integrity.json` for the files now under `folder`."""
    folder = Path(folder)
    sizes = {rel: (folder / rel).stat().st_size for rel in _files(folder)}
    digests = _digests(folder, sizes)
    table = {"hash": "sha256 of the sha256 of each block", "block_bytes": BLOCK_BYTES,
             "files": {rel: {"bytes": sizes[rel], "digest": digests[rel]} for rel in sizes}}
    partial = folder / (DIGESTS + ".partial")
    partial.write_text(json.dumps(table, indent=1) + "\n")
    os.replace(partial, folder / DIGESTS)


def verify(folder: str | os.PathLike) -> str | None:
    """None when `folder`'s files match their record, else what does not (one line)."""
    folder = Path(folder)
    try:
        table = json.loads((folder / DIGESTS).read_text())
        files, block_bytes = table["files"], table["block_bytes"]
        files = {rel: entry for rel, entry in files.items() if Path(rel).name != MARKER}
    except FileNotFoundError:
        return (f"no {DIGESTS} (a save that never finished, or one made before checkpoints kept digests: "
                "`gpt1-jax verify --workdir RUN --record-missing` records them for those)")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{DIGESTS} is unreadable ({type(e).__name__})"
    if block_bytes != BLOCK_BYTES:
        return f"{DIGESTS} uses {block_bytes}-byte blocks; this version reads {BLOCK_BYTES}"
    problems = []
    for rel, entry in files.items():
        try:
            size = (folder / rel).stat().st_size
        except OSError:
            problems.append(f"{rel} is missing")
            continue
        if size != entry["bytes"]:
            problems.append(f"{rel} has {size} bytes, {entry['bytes']} recorded")
    if not problems:  # only then read everything
        try:
            digests = _digests(folder, {rel: entry["bytes"] for rel, entry in files.items()})
        except OSError as e:
            return f"cannot read {e.filename}: {e.strerror}"
        problems = [f"{rel} differs from its recorded digest" for rel, entry in files.items()
                    if digests[rel] != entry["digest"]]
    if not problems:
        return None
    more = len(problems) - MAX_LISTED
    return "; ".join(problems[:MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")


def checkpoint_steps(directory: str | os.PathLike) -> list[int]:
    """The steps of the finished checkpoints in a Checkpointer's directory (unfinished saves are
    orbax's `<step>.orbax-checkpoint-tmp*` folders, not listed)."""
    return sorted(int(p.name) for p in Path(directory).iterdir() if p.name.isdigit() and p.is_dir())


def newest_checkpoint(directory: str | os.PathLike) -> int | None:
    """The newest finished checkpoint's step, None when there is none (or no such folder)."""
    try:
        return checkpoint_steps(directory)[-1]
    except (OSError, IndexError):
        return None


def newest_intact_checkpoint(directory: str | os.PathLike, skip: int | None = None) -> int | None:
    """The newest finished checkpoint (other than `skip`) that matches its record, hashing newest first and
    stopping at the first that does; None when none does (or no such folder)."""
    try:
        steps = checkpoint_steps(directory)
    except OSError:
        return None
    return next((s for s in reversed(steps) if s != skip and verify(Path(directory) / str(s)) is None), None)


def verify_checkpoints(directory: str | os.PathLike) -> Iterator[tuple[int, str | None]]:
    """(step, None or what is damaged) for every checkpoint in `directory`, oldest first, each as soon as it is
    hashed (a 117M run's take seconds each: `gpt1-jax verify` says each as it comes)."""
    for step in checkpoint_steps(directory):
        yield step, verify(Path(directory) / str(step))
