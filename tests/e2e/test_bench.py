"""`gpt1-jax bench` runs the tiny model and prints one JSON line with the agreed keys; bad options end
in one error line and exit status 2; the FLOP count matches the documented formula."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpt1_jax import cli, flops, hugepages
from gpt1_jax.config import PretrainConfig, model_preset, resolve
from gpt1_jax.flops import accelerator_peak, flops_per_token, mfu

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"tokens_per_s", "step_s_median", "compile_s", "flops_per_token", "mfu", "peak_flops", "losses",
        "state_bytes_total", "state_bytes_per_device", "minor_faults_per_step", "sys_cpu_s_per_step"}


def test_bench_tiny_prints_json(capsys):
    # In-process: this test process already has 8 fake devices (conftest).
    rc = cli.main(["bench", "--config", "tiny", "--batch-size", "8", "--seq-len", "32", "--steps", "2",
                   "--mesh", "data=2,fsdp=2,tensor=2", "--peak-flops", "1e11"])
    assert rc == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 1
    # stderr says what it does while it does it (117M was 48 s of silence): the compile, then a bar of the steps
    said = err.replace("\r", "\n").splitlines()
    assert said[0] == "bench: compiling the train step for 8 x cpu (mesh data=2,fsdp=2,tensor=2), batch 8 x 32 ..."
    assert re.fullmatch(r"bench: compiled in \d+\.\d s; running 1 warm-up \+ 2 timed steps", said[1]), said
    assert said[-1].startswith("bench: 100%") and " 3/3 " in said[-1], said
    result = json.loads(lines[0])
    assert KEYS <= set(result)
    assert len(result["losses"]) == 2 and all(4.0 < x < 8.0 for x in result["losses"])  # ~ln(512)=6.24
    assert result["tokens_per_s"] > 0 and 0 < result["mfu"] < 1 and result["peak_flops"] == 1e11
    assert result["minor_faults_per_step"] >= 0 and result["sys_cpu_s_per_step"] >= 0
    assert result["flops_per_token"] == flops_per_token(model_preset("tiny"), 32)
    assert result["state_bytes_per_device"] < result["state_bytes_total"]
    assert result["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    assert result["attention"] == "xla_blocked"  # `auto` on a CPU
    # which optimizer it timed: the JSON did not say (the tiny preset's, here)
    tiny = resolve(PretrainConfig, "tiny").optim
    assert {k: result[k] for k in ("optim", "lr", "schedule", "warmup_steps", "dtype")} == {
        "optim": tiny.name, "lr": tiny.lr, "schedule": tiny.schedule, "warmup_steps": tiny.warmup_steps,
        "dtype": "float32"}


def test_bench_compile_only_is_the_dry_run_report(capsys, tmp_path, monkeypatch):
    # Claim native bf16 so every CPU kind compiles the bf16 program: an AVX2-only CPU would otherwise
    # (rightly) compute in float32, tested in test_compile_cache.py.
    monkeypatch.setattr(flops, "cpu_flags", lambda: ["avx2", "avx512_bf16", "avx512f"])
    shape = ["--config", "tiny", "--mesh", "fsdp=4,data=2", "--set", "model.n_layers=1", "--set",
             "model.dtype=bfloat16", "--optim", "lion", "--lr", "1e-4"]  # pretrain takes them as bench does
    assert cli.main(["bench", *shape, "--batch", "8", "--seq", "16", "--compile-only", "--no-progress"]) == 0
    bench, err = capsys.readouterr()
    bench = json.loads(bench)
    assert err == ""  # --no-progress: no status line
    assert bench["dtype"] == "bfloat16" and "tokens_per_s" not in bench and bench["compile_s"] > 0
    assert (bench["optim"], bench["lr"], bench["schedule"]) == ("lion", 1e-4, "warmup_cosine")  # its state is sized
    assert bench["num_params"] == dataclasses.replace(model_preset("tiny"), n_layers=1).num_params()
    # `pretrain --dry-run` sizes the same step through the same function: the same report.
    workdir = tmp_path / "never-created"
    assert cli.main(["pretrain", *shape, "--batch-size", "8", "--seq-len", "16", "--workdir", str(workdir),
                     "--dry-run"]) == 0
    dry, err = capsys.readouterr()
    dry = json.loads(dry)
    assert dry.pop("dry_run") is True and not workdir.exists()
    # a dry run of 117M on 64 simulated devices was 18 s of silence before its JSON
    assert err == ("pretrain --dry-run: compiling the train step for 8 x cpu (mesh data=2,fsdp=4,tensor=1), "
                   "batch 8 x 16 ...\n")
    timings = ("lower_s", "compile_s")
    assert {k: v for k, v in dry.items() if k not in timings} == {k: v for k, v in bench.items() if k not in timings}
    assert dry["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1} and dry["global_batch"] == 8 and dry["seq_len"] == 16
    assert 0 < dry["state_bytes_per_device"] < dry["state_bytes_total"]
    assert dry["peak_bytes_per_device"] >= dry["temp_bytes_per_device"] > 0
    assert dry["model_flops_per_device"] == dry["flops_per_token"] * 8 * 16 / 8
    assert 0.3 < dry["flops_per_device"] / dry["model_flops_per_device"] < 3  # XLA counts attention etc. too


def test_bench_lr_and_schedule_each_set_one_field(monkeypatch, capsys):
    """--lr is the peak learning rate only (it once also switched to a constant schedule without warmup, which
    --help did not say); --schedule constant is its own flag. --batch and --seq are --batch-size and --seq-len."""
    from gpt1_jax import bench

    seen, options = [], []
    monkeypatch.setattr(bench, "run", lambda config, **kw: seen.append(config) or options.append(kw) or {})
    tiny = resolve(PretrainConfig, "tiny").optim
    assert cli.main(["bench", "--config", "tiny", "--lr", "1e-4"]) == 0
    assert seen[-1].optim == dataclasses.replace(tiny, lr=1e-4)
    assert cli.main(["bench", "--config", "tiny", "--lr", "1e-4", "--schedule", "constant"]) == 0
    assert seen[-1].optim == dataclasses.replace(tiny, lr=1e-4, schedule="constant")
    assert cli.main(["bench", "--config", "tiny", "--batch", "4", "--seq", "16"]) == 0
    assert (seen[-1].data.global_batch_size, seen[-1].data.seq_len) == (4, 16)
    assert options[-1]["progress"] is True
    assert cli.main(["bench", "--config", "tiny", "--no-progress"]) == 0 and options[-1]["progress"] is False
    assert cli.main(["bench", "--config", "tiny", "--schedule", "cosine"]) == 2
    assert "optim.schedule='cosine' is not one of" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "data=3"], "mesh"),
    (["--batch", "6"], "divisible"),
    (["--seq", "1000"], "n_positions"),
    (["--set", "model.n_layerz=2"], "n_layerz"),
    (["--steps", "0"], "--steps"),
    (["--config", "huge"], "huge"),
])
def test_bench_bad_options_are_one_line_exit_2(capsys, argv, message):
    assert cli.main(["bench", "--config", "tiny", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpt1-jax bench: error:") and message in err[0]


def test_bench_cli_simulate_devices_subprocess():
    # A fresh process: --simulate-devices must take effect before jax starts. Huge pages on (the suite turns
    # them off elsewhere): where they can help, the command re-executes itself under glibc's tunable first,
    # and its flags still hold after that.
    env = {k: v for k, v in os.environ.items() if k != hugepages.SWITCH}
    env = {**env, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "gpt1_jax.cli", "bench", "--config", "tiny", "--simulate-devices", "4",
         "--mesh", "fsdp=4", "--batch", "4", "--seq", "16", "--steps", "1", "--peak-flops", "1e11"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["devices"] == 4 and result["mesh"]["fsdp"] == 4
    assert result["malloc_huge_pages"] is hugepages.wanted(env)


@pytest.mark.skipif(not hugepages.wanted({hugepages.SWITCH: "keep"}), reason="needs Linux with glibc >= 2.35")
def test_bench_with_the_kept_heap_reexecutes_under_it_and_says_so():
    env = {**os.environ, hugepages.SWITCH: "keep", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "gpt1_jax.cli", "bench", "--config", "tiny", "--batch", "4", "--seq",
                          "16", "--steps", "1", "--peak-flops", "1e11"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["malloc_kept_heap"] is True


def test_flops_formula_and_peaks():
    gpt1 = model_preset("gpt1")
    assert flops_per_token(gpt1, 512) == 6 * 116_534_784 + 12 * 12 * 768 * 512
    assert accelerator_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert accelerator_peak("TPU v5 lite") == 197e12 and accelerator_peak("TPU v5") == 459e12
    assert accelerator_peak("Some CPU") is None
    assert mfu(1000.0, 1e9, 1e13) == pytest.approx(0.1)


def test_bench_gives_mfu_against_the_highest_peak_this_cpu_measured_too(tmp_path, monkeypatch, capsys):
    """A fresh peak moved by ~15% between runs on one machine, and the MFU with it; the kept highest one (here set
    above anything a CPU measures) is the stable denominator beside it. A given --peak-flops has no such field."""
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    flops.remembered_matmul_peak("float32")
    kept = json.loads((tmp_path / "matmul-peak.json").read_text())
    (tmp_path / "matmul-peak.json").write_text(json.dumps({k: 1e15 for k in kept}))
    argv = ["bench", "--config", "tiny", "--batch-size", "8", "--seq-len", "32", "--steps", "1", "--no-progress"]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["best_peak_flops"] == 1e15 and result["peak_flops"] < 1e15
    assert result["mfu_of_best_peak"] == round(result["tokens_per_s"] * result["flops_per_token"] / 1e15, 4)
    assert cli.main([*argv, "--peak-flops", "1e11"]) == 0
    assert "best_peak_flops" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_peak_a_run_logs_mfu_against_is_measured_once_per_cpu(tmp_path, monkeypatch):
    """pretrain labels MFU with a matmul peak measured once per CPU, dtype and jax version and kept beside
    the compilation cache, raised by any higher measurement (bench's); without a cache folder it measures."""
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    first = flops.remembered_matmul_peak("float32")
    kept = json.loads((tmp_path / "matmul-peak.json").read_text())
    assert list(kept.values()) == [first] and first > 1e9
    (tmp_path / "matmul-peak.json").write_text(json.dumps({k: 123.0 for k in kept}))
    assert flops.remembered_matmul_peak("float32") == 123.0  # read back, not measured again
    assert flops.peak_flops("float32", remembered=True)[0] == 123.0
    assert flops.peak_flops("float32")[0] == first  # bench measures, and a higher peak replaces the kept one
    assert flops.remembered_matmul_peak("float32") == first
    flops.remembered_matmul_peak("float32", measured=first / 2)  # a lower one (a busy machine) does not
    assert flops.remembered_matmul_peak("float32") == first
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    assert flops.remembered_matmul_peak("float32") == first  # measured (this process's own cache)
