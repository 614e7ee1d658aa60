"""What watches a real (tiny, in-process) pre-training run and must not change it: --profile START:STOP (the
trace files, the traced steps out of tokens/s) and stats_every (per-layer statistics in metrics.jsonl at those
steps); with both on, the run ends with the parameters of a run with neither. Nothing compiles inside a window,
in pre-training or fine-tuning (with batches of several lengths and an epoch's scoring in it). The window's parsing:
tests/unit/test_profile.py; the statistics' numbers: tests/unit/test_layer_stats.py and
tests/e2e/test_layer_stats.py."""

import dataclasses
import gzip
import json

import jax
import numpy as np
import pytest

from gpt1_jax import cli, pretrain
from gpt1_jax.config import PretrainConfig, preset
from tests.support.pretrain import cache  # noqa: F401 (a pytest fixture)


def _config(cache, profile: str = "", stats_every: int = 0) -> PretrainConfig:
    base = preset(PretrainConfig, "tiny")
    return dataclasses.replace(base, steps=5, eval_every=2, checkpoint_every=0, profile=profile,
                               stats_every=stats_every, data=dataclasses.replace(base.data, cache_dir=str(cache)))


@pytest.mark.fusion_emitters
def test_a_profiled_and_watched_run_ends_as_a_plain_one(tmp_path, cache, capsys):
    # The traced run first: the programs the plain run compiles would be this process's already.
    traced = pretrain.run(_config(cache, "2:3", stats_every=2), tmp_path / "traced")
    trace = next((tmp_path / "traced" / "profile").rglob("perfetto_trace.json.gz"))
    err = capsys.readouterr().err
    assert f"profile of steps 2-3: {trace} (ui.perfetto.dev;" in err  # where it went, once written
    assert f"per-layer statistics: {tmp_path / 'traced' / 'layer_stats.png'}" in err  # drawn where it could be read
    plain = pretrain.run(_config(cache), tmp_path / "plain")
    assert "per-layer statistics" not in capsys.readouterr().err and not (tmp_path / "plain" / "layer_stats.png").exists()
    assert plain.finished and traced.finished
    for a, b in zip(jax.tree_util.tree_leaves(plain.state.params), jax.tree_util.tree_leaves(traced.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    files = {p.name for p in (tmp_path / "traced" / "profile").rglob("*") if p.is_file()}
    assert "perfetto_trace.json.gz" in files and any(n.endswith(".xplane.pb") for n in files), files
    assert not (tmp_path / "plain" / "profile").exists()
    # Step 2 is the first with statistics, and the first evaluation runs after it: both programs were compiled
    # before the window opened, not inside it.
    events = json.loads(gzip.decompress(trace.read_bytes()))
    names = {e.get("name") for e in (events["traceEvents"] if isinstance(events, dict) else events)}
    assert {"PjitFunction(wrapped)", "PjitFunction(evaluate)"} <= names
    assert not names & {"lower_sharding_computation", "backend_compile_and_load", "PjRtCpuClient::Compile"}
    rows = {r["step"]: r for r in map(json.loads, (tmp_path / "traced" / "metrics.jsonl").read_text().splitlines())
            if "loss" in r}
    assert [s for s in sorted(rows) if "tokens_per_s" in rows[s]] == [4, 5]  # 1 compiled, 2 and 3 were traced
    watched = [s for s in sorted(rows) if any(k.startswith("stats/") for k in rows[s])]
    assert watched == [2, 4] and rows[2]["stats/block1/mlp/update_ratio"] > 0
    assert {k.split("/")[1] for k in rows[4] if k.startswith("stats/")} == {"embed", "block0", "block1"}


def test_a_fine_tuning_window_compiles_nothing_inside_it(tmp_path):
    """CoLA examples of 2 and 20 words, grouped by length in batches of 8: step 1 takes a batch of one length
    and the window 2:4 of both, and the epoch that ends at step 3 is scored (prediction batches of their own
    lengths) inside the window; every one of those programs was compiled before it opened."""
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "slept"]
    (tmp_path / "CoLA").mkdir()
    for split, seed in (("train", 0), ("dev", 1)):
        rng = np.random.default_rng(seed)
        lines = [f"src\t{i % 2}\t\t{' '.join(rng.choice(words, n))}.\n" for i, n in enumerate([2, 20, 20] * 8)]
        (tmp_path / "CoLA" / f"{split}.tsv").write_text("".join(lines))
    workdir = tmp_path / "run"
    assert cli.main(["finetune", "--task", "cola", "--workdir", str(workdir), "--data-dir", str(tmp_path), "--config",
                     "tiny", "--tfds-dir", str(tmp_path / "tfds"), "--batch-size", "8", "--group-by-length", "on",
                     "--no-progress", "--init", "none", "--epochs", "2", "--profile", "2:4"]) == 0
    events = json.loads(gzip.decompress(next((workdir / "profile").rglob("perfetto_trace.json.gz")).read_bytes()))
    names = {e.get("name") for e in (events["traceEvents"] if isinstance(events, dict) else events)}
    assert {"PjitFunction(step)", "PjitFunction(predict_fn)"} <= names
    assert not names & {"lower_sharding_computation", "backend_compile_and_load", "PjRtCpuClient::Compile"}
