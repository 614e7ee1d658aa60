"""KV-cache sampling: greedy decoding equals argmax over full forward passes; sampling is seeded."""

import dataclasses

import flax.linen as nn
import numpy as np
import pytest

import gpt1_jax
from gpt1_jax.config import model_preset
from gpt1_jax.errors import DataError
from gpt1_jax.generate import sample


@pytest.mark.parametrize("scan_layers", [True, False], ids=["scan", "loop"])
def test_greedy_with_kv_cache_equals_full_recompute(scan_layers):
    config = dataclasses.replace(model_preset("tiny"), scan_layers=scan_layers)
    params = nn.meta.unbox(gpt1_jax.init_params(config, 0))
    rng = np.random.default_rng(0)
    params = __import__("jax").tree.map(lambda p: p + 0.5 * rng.standard_normal(p.shape).astype(p.dtype), params)
    prompt, n_new = [5, 17, 3, 99, 250], 20
    got = sample(config, params, prompt, max_new_tokens=n_new, temperature=0.0)[0]
    seq = list(prompt)
    for _ in range(n_new):  # the reference: no cache, the whole prefix every step
        # right-padded to one length, so it compiles once: causal, position t never sees what follows it
        padded = np.asarray([seq + [0] * (len(prompt) + n_new - len(seq))])
        seq.append(int(np.argmax(np.asarray(gpt1_jax.lm_logits(config, params, padded))[0, len(seq) - 1])))
    assert got == seq[len(prompt):]
    assert len(set(got)) > 1  # not a degenerate repetition that would hide a position bug


def test_bf16_compute_samples_what_its_own_forward_pass_predicts():
    """A bfloat16 model generates (its tied LM head once took only (B, T, D)): greedy from the cache is the argmax
    of a full bf16 forward pass."""
    config = dataclasses.replace(model_preset("tiny"), dtype="bfloat16")
    params = nn.meta.unbox(gpt1_jax.init_params(config, 2))
    prompt = [5, 17, 3]
    first = sample(config, params, prompt, max_new_tokens=1, temperature=0.0)[0]
    logits = np.asarray(gpt1_jax.lm_logits(config, params, np.asarray([prompt])))[0, -1]
    assert first == [int(np.argmax(logits))]


def test_sampling_is_seeded_and_respects_the_context():
    config = model_preset("tiny")
    params = nn.meta.unbox(gpt1_jax.init_params(config, 1))
    a = sample(config, params, [1, 2], max_new_tokens=10, temperature=1.0, top_k=20, seed=3, num_samples=2)
    b = sample(config, params, [1, 2], max_new_tokens=10, temperature=1.0, top_k=20, seed=3, num_samples=2)
    assert a == b and a[0] != a[1] and all(len(x) == 10 for x in a)
    assert len(sample(config, params, [1] * 60, max_new_tokens=4)[0]) == 4  # fills n_positions=64 exactly
    with pytest.raises(DataError, match="leaves no room"):
        sample(config, params, [1] * 64)
    with pytest.raises(DataError, match="empty"):
        sample(config, params, [])


def test_sample_verb_from_an_hf_folder(tmp_path, vocab_dir):
    """`gpt1-jax sample --init` on a folder written by save_pretrained, with a vocabulary in OpenAI's format."""
    import json
    import shutil
    import subprocess
    import sys

    n_tokens = len(json.loads((vocab_dir / "encoder_bpe_40000.json").read_text(encoding="utf-8")))
    config = dataclasses.replace(model_preset("tiny"), vocab_size=n_tokens)
    gpt1_jax.save_pretrained(config, gpt1_jax.init_params(config, 0), tmp_path / "hf")
    for name in ("encoder_bpe_40000.json", "vocab_40000.bpe"):
        shutil.copy(vocab_dir / name, tmp_path / "hf" / name)
    done = subprocess.run([sys.executable, "-m", "gpt1_jax.cli", "sample", "--init", str(tmp_path / "hf"),
                           "--prompt", "hello world", "--max-new-tokens", "5", "--num-samples", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[1].startswith("hello world >> ") and len(done.stdout.splitlines()[1]) > 16


def test_more_new_tokens_than_the_context_holds_is_one_error(tmp_path, vocab_dir, monkeypatch):
    """Asking for more tokens than n_positions leaves room for used to return fewer, with exit 0 and no word: now it
    is one ConfigError before anything compiles, from the library and as the CLI's one line (exit 2)."""
    import json
    import re
    import shutil
    import subprocess
    import sys

    from gpt1_jax import generate as generate_mod
    from gpt1_jax.errors import ConfigError

    config = model_preset("tiny")
    params = nn.meta.unbox(gpt1_jax.init_params(config, 0))
    monkeypatch.setattr(generate_mod, "_generate", lambda *a, **k: pytest.fail("generated before refusing"))
    said = ("max_new_tokens=200 with a 3-token prompt needs 203 positions; the model's context is 64 (n_positions): "
            "ask for at most 61")
    with pytest.raises(ConfigError, match=rf"^{re.escape(said)}$"):
        sample(config, params, [1, 2, 3], max_new_tokens=200)
    with pytest.raises(ConfigError, match=r"needs 65 positions; .* ask for at most 61$"):
        generate_mod.generate(config, params, [[1, 2, 3]] * 2, max_new_tokens=62)

    n_tokens = len(json.loads((vocab_dir / "encoder_bpe_40000.json").read_text(encoding="utf-8")))
    config = dataclasses.replace(config, vocab_size=n_tokens)
    gpt1_jax.save_pretrained(config, gpt1_jax.init_params(config, 0), tmp_path / "hf")
    for name in ("encoder_bpe_40000.json", "vocab_40000.bpe"):
        shutil.copy(vocab_dir / name, tmp_path / "hf" / name)
    done = subprocess.run([sys.executable, "-m", "gpt1_jax.cli", "sample", "--init", str(tmp_path / "hf"),
                           "--prompt", "hello world", "--max-new-tokens", "200", "--num-samples", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert done.stderr == ("gpt1-jax sample: error: --max-new-tokens 200 with a 10-token prompt needs 210 positions; "
                           "the model's context is 64 (n_positions): ask for at most 54\n"), done.stderr
    assert done.stdout == ""
