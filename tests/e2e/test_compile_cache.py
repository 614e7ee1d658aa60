"""The persistent compilation cache: keyed by this CPU, bounded, reused by a second process, switchable off; and
bf16 compute falls back to float32 on a CPU without native bf16."""

import os
import subprocess
import sys
from pathlib import Path

from gpt1_jax import compile_cache


ROOT = Path(__file__).resolve().parents[2]


def _bench(env, *args):
    cmd = [sys.executable, "-m", "gpt1_jax.cli", "bench", "--config", "tiny", "--compile-only", *args]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stderr


def test_a_second_process_reuses_the_first_ones_programs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_COMPILATION_CACHE_MAX_SIZE")}
    env.update(GPT1_JAX_COMPILE_CACHE=str(tmp_path))
    # A folder an unbounded writer filled first (an older gpt1-jax, or JAX_COMPILATION_CACHE_MAX_SIZE=-1):
    # its entries have no access-time records, which the bounded cache reads before every write.
    _bench({**env, "JAX_COMPILATION_CACHE_MAX_SIZE": "-1"}, "--seq-len", "16")
    (cache,) = tmp_path.iterdir()
    assert cache.name.startswith(compile_cache.cache_dir(tmp_path).name)
    unbounded = {p.name for p in cache.iterdir()}
    assert unbounded and not any(n.endswith("-atime") for n in unbounded)
    # bounded (the default): it adopts those entries and adds its own, each with an access time, under a lock
    assert "Error writing persistent compilation cache entry" not in _bench(env)
    first = sorted(p.name for p in cache.iterdir())
    assert len([n for n in first if n.endswith("-cache")]) > len(unbounded)
    assert {n.removesuffix("-cache") for n in first if n.endswith("-cache")} \
        == {n.removesuffix("-atime") for n in first if n.endswith("-atime")} and ".lockfile" in first
    _bench(env)
    assert sorted(p.name for p in cache.iterdir()) == first  # every program found: no new entry

    off = tmp_path / "off"
    _bench({**env, "GPT1_JAX_COMPILE_CACHE": "off", "HOME": str(off)})
    assert not off.exists()
