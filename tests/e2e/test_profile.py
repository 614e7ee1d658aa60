"""--profile START:STOP on a real (tiny, in-process) pre-training run: the trace files, the traced steps out of
tokens/s, and the same parameters at the end as without a trace (the window's parsing: tests/unit/test_profile.py)."""

import dataclasses
import json

import jax
import numpy as np

from gpt1_jax import pretrain
from gpt1_jax.config import PretrainConfig, preset
from tests.support.pretrain import cache  # noqa: F401 (a pytest fixture)


def _config(cache, profile: str) -> PretrainConfig:
    base = preset(PretrainConfig, "tiny")
    return dataclasses.replace(base, steps=5, eval_every=0, checkpoint_every=0, profile=profile,
                               data=dataclasses.replace(base.data, cache_dir=str(cache)))


def test_a_profiled_run_writes_its_trace_and_ends_as_an_unprofiled_one(tmp_path, cache):
    plain = pretrain.run(_config(cache, ""), tmp_path / "plain")
    traced = pretrain.run(_config(cache, "2:3"), tmp_path / "traced")
    assert plain.finished and traced.finished
    for a, b in zip(jax.tree_util.tree_leaves(plain.state.params), jax.tree_util.tree_leaves(traced.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    files = {p.name for p in (tmp_path / "traced" / "profile").rglob("*") if p.is_file()}
    assert "perfetto_trace.json.gz" in files and any(n.endswith(".xplane.pb") for n in files), files
    assert not (tmp_path / "plain" / "profile").exists()
    rows = {r["step"]: r for r in map(json.loads, (tmp_path / "traced" / "metrics.jsonl").read_text().splitlines())
            if "loss" in r}
    assert [s for s in sorted(rows) if "tokens_per_s" in rows[s]] == [1, 4, 5]  # 2 and 3 were traced
