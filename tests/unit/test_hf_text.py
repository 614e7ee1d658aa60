"""hf: source specs (gpt1_jax/data/hf_text.py), parsed without loading anything: a Hub repo with its config,
split and field; local files through a packaged builder; bad specs are one line. Loading them: tests/e2e/test_hf_text.py."""

import pytest

from gpt1_jax.data.hf_text import HfSpec, parse_hf_spec
from gpt1_jax.errors import ConfigError, DataError


def test_hub_specs():
    assert parse_hf_spec("hf:HuggingFaceFW/fineweb") == HfSpec("HuggingFaceFW/fineweb")
    assert parse_hf_spec("hf:Salesforce/wikitext/wikitext-103-raw-v1:train[:10%]#text") == \
        HfSpec("Salesforce/wikitext", "wikitext-103-raw-v1", "train[:10%]", "text")
    assert parse_hf_spec("hf:bookcorpus:validation#sentence") == HfSpec("bookcorpus", None, "validation", "sentence")


def test_file_specs(tmp_path):
    for name in ("b.jsonl", "a.jsonl"):
        (tmp_path / name).write_text("{}\n")
    spec = parse_hf_spec(f"hf:json:{tmp_path}/*.jsonl#body")
    assert (spec.name, spec.field, spec.files) == ("json", "body", (f"{tmp_path}/a.jsonl", f"{tmp_path}/b.jsonl"))
    with pytest.raises(DataError, match="no such file"):
        parse_hf_spec(f"hf:parquet:{tmp_path}/none.parquet")


def test_file_specs_read_tilde_as_the_home_folder(tmp_path, monkeypatch):
    """docs/cli.md: `~` is the home folder in every path flag; an hf: spec said "no such file '~/...'"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "a.jsonl").write_text("{}\n")
    assert parse_hf_spec("hf:json:~/a.jsonl").files == (f"{tmp_path}/a.jsonl",)
    assert parse_hf_spec("hf:json:~/*.jsonl").files == (f"{tmp_path}/a.jsonl",)


@pytest.mark.parametrize("spec", ["hf:", "hf::train", "hf:a//b", "hf:a/b/c/d", "hf:json:"])
def test_bad_specs_are_one_line(spec):
    with pytest.raises(ConfigError, match="hf source"):
        parse_hf_spec(spec)
