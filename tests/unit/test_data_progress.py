"""What the data stages show on stderr while they work: a bar with a total (or a status line) where a user waited in
silence, none with --no-progress / progress=False."""

from __future__ import annotations
import io
import json
import tarfile
from pathlib import Path

import pytest

from gpt1_jax import cli
from gpt1_jax.config import FinetuneConfig
from gpt1_jax.data import tasks
from gpt1_jax.data.race import load_race
from gpt1_jax.errors import DataError
from gpt1_jax.metrics import Bar
from gpt1_jax.tokenizer import GPT1Tokenizer

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "experiments" / "paper" / "release"
FULL = "██████████"


def _frames(err: str) -> list[str]:
    """A bar's frames (and the lines between them), one per item."""
    return [f for f in err.replace("\r", "\n").splitlines() if f.strip()]


def test_evaluate_shows_the_tokenizing_of_a_text_as_pretrain_does(tmp_path, capsys):
    """`evaluate --init ... --data corpus` sat silent while it built the token cache (15 s on english_mixed): it
    turned the pipeline's bars off. --no-progress still turns them off."""
    for name, flags in (("shown.txt", []), ("quiet.txt", ["--no-progress"])):
        text = tmp_path / name
        text.write_text("the module defines a class and a function that returns the value of the name\n" * 40)
        assert cli.main(["evaluate", "--init", str(RELEASE), "--data", str(text), "--seq-len", "32", "--max-batches",
                         "1", "--set", f"data.cache_dir={tmp_path / 'cache'}", *flags]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["tokens"] == 16 * 32
        size = Bar.format_sizeof(text.stat().st_size)
        shown = [f for f in _frames(err) if f.startswith(f"tokenizing {text}: 100%|{FULL}| {size}/{size} [")]
        assert bool(shown) == (not flags), err


def _race_tar(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for split, level, name, n_q in (("dev", "middle", "1.txt", 2), ("dev", "high", "2.txt", 1),
                                        ("train", "high", "3.txt", 3)):
            doc = {"id": name, "article": f"the article {name}", "questions": [f"question {i}?" for i in range(n_q)],
                   "options": [["a cat", "a dog", "the end", "none"]] * n_q, "answers": ["ABCD"[i % 4] for i in
                                                                                      range(n_q)]}
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(f"race/{split}/{level}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_race_reading_and_encoding_show_bars_with_totals(tmp_path, capsys, monkeypatch):
    """`finetune --task race` sat silent ~8 s at its start: reading race.tar.gz (the whole archive, for any split;
    its compressed bytes of its size) and encoding the examples. The archive's folder counts its passages."""
    path = _race_tar(tmp_path / "race.tar.gz")
    tok = GPT1Tokenizer.from_path(ROOT / "tests" / "fixtures" / "gpt1_vocab")
    config = FinetuneConfig(task="race")
    task = tasks.make_task(config, str(path), progress=True)
    examples = task.load("validation")
    size = Bar.format_sizeof(path.stat().st_size)
    # the task reads the archive once for its three splits (tests/unit/test_glue.py)
    assert _frames(capsys.readouterr().err)[-1].startswith(
        f"reading RACE train/validation/test: 100%|{FULL}| {size}/{size} [")
    monkeypatch.setattr(tasks, "ENCODE_EXAMPLES", 2)  # two encode_batch calls: the ids of one
    enc = tasks.encode_split(task, examples, tok, 64, progress=True, split="validation")
    assert _frames(capsys.readouterr().err)[-1].startswith(f"encoding race validation: 100%|{FULL}| 3/3 [")
    monkeypatch.setattr(tasks, "ENCODE_EXAMPLES", 1024)
    assert enc.digest() == tasks.encode_split(task, examples, tok, 64).digest()
    splits = tasks.encode_task(task, config, tok, 64, predict_test=False, progress=True)
    frames = _frames(capsys.readouterr().err)
    assert len(splits.train.seqs) == 3 and len(splits.dev["validation"].seqs) == 3
    for split, n in (("train", 3), ("validation", 3)):
        assert any(f.startswith(f"encoding race {split}: 100%|{FULL}| {n}/{n} [") for f in frames), frames
    with tarfile.open(path) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    assert len(load_race(tmp_path / "unpacked", "validation", progress=True)) == 3
    assert _frames(capsys.readouterr().err)[-1].startswith(f"reading RACE validation: 100%|{FULL}| 2/2 [")
    quiet = tasks.make_task(config, str(path))
    tasks.encode_task(quiet, config, tok, 64, predict_test=False)
    assert capsys.readouterr().err == ""
    (tmp_path / "notes.txt").write_text("not an archive")
    with pytest.raises(DataError, match="not a readable RACE archive"):
        load_race(tmp_path / "notes.txt", "validation", progress=True)
    assert capsys.readouterr().err == ""  # its error is the one line: no bar before it


def test_the_data_bench_corpus_bar_ends_at_what_it_wrote(tmp_path, capsys):
    """Its last document went past the target: the bar overshot its total, and its last frame lost the % and the
    bar ("89.0Mchar [00:01...")."""
    from experiments.scale.data_bench import generate_corpus

    written = generate_corpus(tmp_path / "corpus", ["a document of some words"] * 3, 60, 2, seed=0)
    assert written > 60
    last = _frames(capsys.readouterr().err)[-1]
    shown = Bar.format_sizeof(written)
    assert last.startswith(f"writing corpus: 100%|{FULL}| {shown}/{shown} ["), last
