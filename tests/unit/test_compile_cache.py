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


def test_a_cache_folder_that_cannot_be_made_is_one_line_and_the_process_goes_on(monkeypatch, tmp_path, capsys):
    """An unwritable cache (a read-only home, another user's shared folder) stopped every verb, `sample` and
    `evaluate` included; the cache only saves time. Its default follows XDG_CACHE_HOME, as the token cache's."""
    import jax

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    before = jax.config.jax_compilation_cache_dir
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("GPT1_JAX_COMPILE_CACHE", str(blocker / "xla"))
    try:
        assert compile_cache.enable() is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpt1-jax: no compilation cache ({blocker / 'xla'}")
    assert "set GPT1_JAX_COMPILE_CACHE to a folder you can write" in err[0]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.cache_dir().parent == tmp_path / "xdg" / "gpt1_jax" / "xla"
