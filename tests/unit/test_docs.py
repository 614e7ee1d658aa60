"""README.md shows a new engineer the whole house: its module map ("What is here") names every module of the package
and every experiments subpackage, and it links every page of docs/."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _map_rows() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## What is here", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_the_module_map_names_every_module_and_experiments_subpackage():
    named = set()
    for row in _map_rows():
        first = row.split("|")[1]
        paths = re.findall(r"`([^`]+)`", first)
        folder = str(Path(paths[0]).parent)  # a row lists one folder's modules: `data/sources.py`, `tokens.py`, ...
        named |= {p if "/" in p else f"{folder}/{p}" for p in paths}
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "gpt1_jax").rglob("*.py") if p.name != "__init__.py"}
    subpackages = {f"{p.parent.relative_to(ROOT)}/" for p in (ROOT / "experiments").glob("*/__init__.py")}
    missing = sorted((modules | subpackages) - named)
    assert not missing, f"README.md's module map lacks {missing}"


def test_every_doc_is_linked_from_the_readme():
    text = (ROOT / "README.md").read_text()
    unlinked = sorted(p.name for p in (ROOT / "docs").glob("*.md") if f"(docs/{p.name})" not in text)
    assert not unlinked, f"README.md links no docs/{unlinked}"
