"""The persistent compilation cache: keyed by this CPU, reused by a second process, switchable off; and
bf16 compute falls back to float32 on a CPU without native bf16."""

import dataclasses

from gpt1_jax import compile_cache, flops
from gpt1_jax.config import model_preset


def test_the_directory_is_named_after_the_cpu(monkeypatch, tmp_path):
    here = compile_cache.cache_dir(tmp_path)
    assert here == compile_cache.cache_dir(tmp_path) and here.parent == tmp_path
    monkeypatch.setattr(compile_cache, "cpu_identity", lambda: "x86_64 | same model | avx avx2 fma")
    avx2 = compile_cache.cache_dir(tmp_path)
    monkeypatch.setattr(compile_cache, "cpu_identity", lambda: "x86_64 | same model | avx avx2 avx512f fma")
    assert compile_cache.cache_dir(tmp_path) != avx2 != here  # one flag more: another directory


def test_bf16_compute_falls_back_to_float32_without_native_bf16(monkeypatch, capsys):
    bf16 = dataclasses.replace(model_preset("tiny"), dtype="bfloat16")
    monkeypatch.setattr(flops, "cpu_flags", lambda: ["avx", "avx2", "avx512bw", "avx512f", "fma"])
    assert flops.fit_compute_dtype(bf16).dtype == "float32"
    assert "no native bf16" in capsys.readouterr().err
    monkeypatch.setattr(flops, "cpu_flags", lambda: ["avx", "avx2", "avx512_bf16", "avx512f", "fma"])
    assert flops.fit_compute_dtype(bf16).dtype == "bfloat16"
    assert flops.fit_compute_dtype(model_preset("tiny")).dtype == "float32"
