"""hf: text sources for real, through the `datasets` library on files the test writes (no network): local
JSON lines and Parquet give one document per row in file order; the fingerprint that keys the token cache
follows the files; a missing field, file or Hub dataset is one line; `gpt1-jax pretrain --data hf:...` trains
from them. The spec's parsing: tests/unit/test_hf_text.py."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpt1_jax.data.sources import open_source
from gpt1_jax.errors import DataError


pytest.importorskip("datasets", reason="the [hf] extra (README's test command installs it)")

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture
def jsonl(tmp_path):
    rows = [[{"id": j, "text": f"document {i}-{j}: the cat sat on the mat."} for j in range(3)] for i in range(2)]
    for i, part in enumerate(rows):
        (tmp_path / f"part{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return tmp_path, [r["text"] for part in rows for r in part]


def test_local_json_lines_and_parquet_are_one_document_per_row(jsonl, monkeypatch, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    folder, texts = jsonl
    source = open_source(f"hf:json:{folder}/*.jsonl")  # FIELD defaults to text
    assert list(source.documents()) == texts
    pq.write_table(pa.table({"body": texts, "n": list(range(len(texts)))}), folder / "all.parquet")
    assert list(open_source(f"hf:parquet:{folder}/all.parquet#body").documents()) == texts

    before = source.fingerprint()
    assert open_source(f"hf:json:{folder}/*.jsonl").fingerprint() == before
    time.sleep(0.01)
    (folder / "part1.jsonl").write_text(json.dumps({"text": "changed"}) + "\n")
    assert open_source(f"hf:json:{folder}/*.jsonl").fingerprint() != before  # the token cache is rebuilt
    with pytest.raises(DataError, match=r"rows have no field 'body' \(they have: id, text\); name it after '#'"):
        open_source(f"hf:json:{folder}/*.jsonl#body")
    with pytest.raises(DataError, match="no such file"):
        open_source(f"hf:json:{folder}/nothing-*.jsonl")


def test_an_empty_csv_cell_is_an_empty_document_as_in_json(tmp_path, monkeypatch):
    """pandas reads an empty CSV cell as null: the whole corpus was refused ("field 'text' of row 1 is NoneType"),
    where JSON's empty string (and null) is a skipped document."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    (tmp_path / "e.csv").write_text("id,text\n1,first row\n2,\n3,third row\n")
    (tmp_path / "e.jsonl").write_text('{"text": "first row"}\n{"text": null}\n{"text": ""}\n{"text": "third row"}\n')
    assert list(open_source(f"hf:csv:{tmp_path}/e.csv#text").documents()) == ["first row", "third row"]
    assert list(open_source(f"hf:json:{tmp_path}/e.jsonl").documents()) == ["first row", "third row"]


def test_a_file_the_builder_cannot_parse_is_one_line(tmp_path, monkeypatch, capsys):
    """pyarrow's parse error, raised while the rows stream, was a 71-line traceback (and datasets logged its own)."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    (tmp_path / "broken.jsonl").write_text('{"text": "fine"}\n{not json\n')
    (tmp_path / "plain.txt").write_text("just text\n")
    for name, row in (("broken.jsonl", 1), ("plain.txt", 0)):
        with pytest.raises(DataError, match=rf"hf source 'hf:json:{tmp_path}/{name}': cannot read its rows: JSON parse "
                                            rf"error: .* in row {row}$"):
            list(open_source(f"hf:json:{tmp_path}/{name}").documents())
    assert capsys.readouterr().err == ""
    # An empty file: datasets' json builder raises StopIteration, which Python turned into a RuntimeError traceback.
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match=rf"^hf source 'hf:json:{tmp_path}/empty.jsonl' has no rows$"):
        open_source(f"hf:json:{tmp_path}/empty.jsonl")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gpt1_jax.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_pretrain_reads_an_hf_source_and_a_missing_hub_dataset_is_one_line(jsonl, tmp_path):
    folder, texts = jsonl
    env = {**OFFLINE, "HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}
    done = _cli("pretrain", "--config", "tiny", "--steps", "2", "--data", f"hf:json:{folder}/*.jsonl#text",
                "--workdir", str(tmp_path / "run"), "--set", "data.vocab_size=300", "--set", "eval_every=0",
                "--set", f"data.cache_dir={tmp_path / 'tokens'}", "--set", "data.seq_len=8", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    info = json.loads((tmp_path / "run" / "data_info.json").read_text())
    assert info["documents"] == len(texts) and info["source"].startswith("hf:json:"), info
    missing = _cli("pretrain", "--config", "tiny", "--data", "hf:nobody-here/no-such-dataset",
                   "--workdir", str(tmp_path / "run2"), env=env)
    lines = missing.stderr.strip().splitlines()
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr[-2000:]
    assert lines[-1].startswith("gpt1-jax pretrain: error: hf source 'hf:nobody-here/no-such-dataset': cannot load it")
    assert not (tmp_path / "run2").exists()
