"""RACE (Lai et al., 2017) reading comprehension from its release archive: one JSON file per passage,
`race/{train,dev,test}/{middle,high}/*.txt` with `article`, `questions`, `options` (4 per question),
`answers` (letters) and `id`. Each question becomes one multiple-choice example.
"""

from __future__ import annotations

import json
import tarfile
import zlib
from pathlib import Path
from typing import Any, Callable

from gpt1_jax.errors import ConfigError, DataError
from gpt1_jax.metrics import Bar

__all__ = ["LEVELS", "SPLITS", "load_race", "parse_levels", "race_reader"]

LEVELS = ("middle", "high")
SPLITS = {"train": "train", "validation": "dev", "test": "test"}  # our split names -> the archive's folders


def _examples_of(doc: dict, where: str, level: str) -> list[dict[str, Any]]:
    try:
        questions, options, answers, article = doc["questions"], doc["options"], doc["answers"], doc["article"]
    except KeyError as e:
        raise DataError(f"{where}: RACE passage lacks field {e.args[0]!r}") from None
    if not (len(questions) == len(options) == len(answers)):
        raise DataError(f"{where}: {len(questions)} questions, {len(options)} option lists, {len(answers)} answers")
    out = []
    for q, (question, opts, ans) in enumerate(zip(questions, options, answers)):
        if len(opts) != 4 or ans not in "ABCD" or len(ans) != 1:
            raise DataError(f"{where}: question {q}: expected 4 options and an answer A-D, got {len(opts)} and {ans!r}")
        out.append({"article": article, "question": question, "options": list(opts), "label": "ABCD".index(ans),
                    "level": level, "id": f"{doc.get('id', Path(where).name)}#{q}"})
    return out


def load_race(path: str | Path, split: str, levels: tuple[str, ...] | str = LEVELS,
              progress: bool = False) -> list[dict[str, Any]]:
    """Questions of one split (`train`, `validation`/`dev`, `test`) from race.tar.gz or its unpacked
    folder, sorted by passage file then question, each with `idx` (its position). `progress`: a bar of the
    archive's bytes (or the folder's passages) read, on stderr: the whole archive is read for any split."""
    return race_reader(path, (split,), levels, progress)(split)


def race_reader(path: str | Path, splits: tuple[str, ...], levels: tuple[str, ...] | str = LEVELS,
                progress: bool = False) -> Callable[[str], list[dict[str, Any]]]:
    """read(split) -> `load_race`'s questions, for each of `splits` in any order, from one reading of race.tar.gz
    (a second or two each: a fine-tuning run asks for train, validation and test in turn); each split's passages
    are kept until it is read, once. A split with no passages fails when it is read, not before."""
    path = Path(path)
    folders = {split: SPLITS.get(split, split) for split in splits}
    if unknown := [split for split, folder in folders.items() if folder not in SPLITS.values()]:
        raise ConfigError(f"unknown RACE split {unknown[0]!r}; known: {', '.join(SPLITS)}")
    levels = parse_levels(levels)
    unread: dict[str, list[tuple[str, str, dict]]] | None = None  # the first read's passages not handed out yet

    def read(split: str) -> list[dict[str, Any]]:
        nonlocal unread
        if split not in folders:
            raise ConfigError(f"RACE split {split!r} was not asked for: {', '.join(folders)}")
        if unread is None:
            unread = _passages(path, set(folders.values()), levels, f"reading RACE {'/'.join(splits)}", progress)
        docs = unread.pop(folders[split], None)
        if docs is None:  # handed out before: that split is read again, alone
            docs = _passages(path, {folders[split]}, levels, f"reading RACE {split}", progress)[folders[split]]
        if not docs:
            raise FileNotFoundError(f"{path}: no RACE passages for split {split!r}, levels {list(levels)}")
        docs.sort(key=lambda d: (LEVELS.index(d[1]), d[0]))
        examples = [ex for name, level, doc in docs for ex in _examples_of(doc, name, level)]
        for i, ex in enumerate(examples):
            ex["idx"] = i
        return examples

    return read


def _passages(path: Path, folders: set[str], levels: tuple[str, ...], desc: str,
              progress: bool) -> dict[str, list[tuple[str, str, dict]]]:
    """{split folder: [(file or member name, level, passage)]} from the unpacked folder or the archive at `path`."""
    if path.is_dir():
        root = path / "race" if (path / "race").is_dir() else path
        files = [(f, folder, level) for folder in sorted(folders) for level in levels
                 for f in sorted((root / folder / level).glob("*.txt"))]
        found: dict[str, list[tuple[str, str, dict]]] = {folder: [] for folder in folders}
        with Bar(files, desc=desc, unit="passage", disable=not progress) as shown:
            for f, folder, level in shown:
                found[folder].append((str(f), level, _read_json(f.read_bytes(), str(f))))
        return found
    if path.is_file():
        return _archive_passages(path, folders, levels, desc, progress)
    raise FileNotFoundError(f"{path}: RACE archive (race.tar.gz) or folder not found")


def _archive_passages(path: Path, folders: set[str], levels: tuple[str, ...], desc: str,
                      progress: bool) -> dict[str, list[tuple[str, str, dict]]]:
    """{split folder: [(member name, level, passage)]} of the archive at `path`. `progress`: a bar of its bytes
    read (compressed ones: the file's size is the total known before reading), from once it opened as an archive:
    a file that is none is one error line."""
    found: dict[str, list[tuple[str, str, dict]]] = {folder: [] for folder in folders}
    try:
        with open(path, "rb") as raw, tarfile.open(fileobj=raw) as tar, Bar(
                total=path.stat().st_size, desc=desc, unit="B", unit_scale=True, disable=not progress) as bar:
            for member in tar:
                parts = member.name.split("/")
                if member.isfile() and len(parts) >= 3 and parts[-3] in found and parts[-2] in levels:
                    passage = _read_json(tar.extractfile(member).read(), f"{path}:{member.name}")
                    found[parts[-3]].append((member.name, parts[-2], passage))
                bar.update(raw.tell() - bar.n)
            bar.update(bar.total - bar.n)  # the archive's end (padding, gzip's trailer) is left unread
    except (tarfile.TarError, EOFError, zlib.error) as e:  # not an archive, or one cut short or damaged
        raise _unreadable(path, e) from None
    return found


def parse_levels(levels: tuple[str, ...] | str) -> tuple[str, ...]:
    """race_levels ("middle,high", or a tuple) -> the levels, each known and named once: a level named twice read
    its folder's passages twice (the archive's members once), so the same data made two training sets."""
    levels = tuple(levels.split(",")) if isinstance(levels, str) else tuple(levels)
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad:
        raise ConfigError(f"unknown RACE level(s) {bad}; known: {', '.join(LEVELS)}")
    if twice := sorted({lv for lv in levels if levels.count(lv) > 1}, key=LEVELS.index):
        raise ConfigError(f"race_levels={','.join(levels)} names RACE level(s) {twice} more than once: name each "
                          f"level once (known: {', '.join(LEVELS)})")
    return levels


def check_archive(path: str | Path) -> None:
    """Fails now, in one line, on a RACE path that `load_race` would fail on only when it is read (a file that is not
    a tar archive, or one cut short in its first member): a pipeline checks it before its hours of other stages."""
    path = Path(path)
    if not path.is_file():
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: RACE archive (race.tar.gz) or folder not found")
        return
    try:
        with tarfile.open(path) as tar:
            tar.next()
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise _unreadable(path, e) from None


def _unreadable(path: Path, e: Exception) -> DataError:
    why = str(e).strip().splitlines()[0].rstrip(":") if str(e).strip() else type(e).__name__
    return DataError(f"{path}: not a readable RACE archive (race.tar.gz or its unpacked folder): {why}")


def _read_json(raw: bytes, where: str) -> dict:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{where}: not a RACE JSON passage ({e})") from None
    if not isinstance(doc, dict):
        raise DataError(f"{where}: not a RACE JSON passage (top level is not an object)")
    return doc
