"""experiments.optimizers.run_study for real: the --quick pre-training study on `tiny` produces results.json,
results.md and the PNGs with a row per optimizer; a rerun skips finished runs; SIGTERM stops it with one
line and no record; the state bytes in the table are `optimizer_state_bytes` of the real tree.

For time, --optimizers is 2 (gpt1_adam and schedule_free_adamw: the plain one and the one evaluated at x),
--steps 6, --lr-points 2, --max-extensions 0, one seed (4 runs; the repeats at the best lr with the other
seeds: tests/unit/test_optimizers_study.py's sweep test). Compilation, not training, is what costs here: an
optimizer's runs share its compiled programs (the lr is an input of the step), each optimizer compiles its own."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpt1_jax.metrics import read_metrics


ROOT = Path(__file__).resolve().parents[2]


STUDY = [sys.executable, "-m", "experiments.optimizers.run_study"]  # run with cwd=ROOT


OPTS = ["gpt1_adam", "schedule_free_adamw"]  # muon's partitioned update has its own tests (test_optim.py)


@pytest.fixture(scope="module")
def quick_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("opt-study")
    argv = [*STUDY, "pretrain", "--quick", "--out", str(out), "--optimizers", ",".join(OPTS),
            "--steps", "6", "--lr-points", "2", "--max-extensions", "0", "--seeds", "0",
            "--cache-dir", str(out / "token-cache"), "--records", str(out / "records"), "--results", str(out / "published")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return out / "pretrain", argv


def test_quick_study_writes_all_outputs(quick_study):
    study, _ = quick_study
    for name in ("results.json", "results.md", "val_vs_tokens.png", "val_vs_time.png", "loss_vs_lr.png",
                 "update_ratio.png"):
        assert (study / name).is_file() and (study / name).stat().st_size > 0, name
    results = json.loads((study / "results.json").read_text())
    runs = results["runs"]
    unigram = json.loads((study / "unigram.json").read_text())["unigram_loss"]  # what ignoring the context reaches
    assert 4 < unigram < 7 and (study.parent / "records" / "pretrain" / "unigram.json").read_text() == (study / "unigram.json").read_text()
    # per-layer statistics at every evaluation (steps 3 and 6 of 6): tiny's two blocks, its embeddings
    ratios = runs[0]["update_ratio"]
    assert set(ratios) >= {"embed/tokens", "block0/attn", "block1/mlp", "block1/ln"}
    assert [step for step, _ in ratios["block0/attn"]] == [3, 6] and all(v > 0 for _, v in ratios["block1/mlp"])
    assert len(runs) == 2 * 2  # 2 lrs each
    for name in OPTS:
        mine = [r for r in runs if r["optimizer"] == name]
        assert len({r["lr"] for r in mine if r["seed"] == 0}) == 2
        assert {r["seed"] for r in mine} == {0}
        for r in mine:
            assert set(r) >= {"optimizer", "lr", "seed", "final_val_loss", "best_val_loss", "tokens_per_s",
                              "optimizer_state_bytes", "diverged", "wall_seconds"}
            assert r["diverged"] or r["final_val_loss"] > 0
    sf = [r for r in runs if r["optimizer"] == "schedule_free_adamw" and not r["diverged"]]
    assert sf and all(r["eval_at"].startswith("x") for r in sf)
    x_curve = [r for r in read_metrics(study / sf[0]["workdir"]) if "val_loss" in r]  # the hook's, at x
    assert [c["val_loss"] for c in sf[0]["val_curve"]] == [r["val_loss"] for r in x_curve]
    md = (study / "results.md").read_text()
    rows = [l for l in md.splitlines() if l.startswith("| ") and not l.startswith("| optimizer")]
    assert sorted(l.split("|")[1].strip() for l in rows) == sorted(OPTS)  # best first
    means = [r["mean"] for r in results["summary"]]
    assert means == sorted(means)
    assert "1.00×" in next(l for l in rows if l.split("|")[1].strip() == "gpt1_adam")  # the memory reference
    assert "/tmp" not in md and str(study) not in json.dumps(results["runs"])
    assert "## What the numbers say" in md and "Budget rule" in md
    for name in ("results.json", "results.md", "val_vs_tokens.png", "val_vs_time.png", "loss_vs_lr.png"):
        assert (study.parent / "published" / "pretrain" / name).read_bytes() == (study / name).read_bytes(), name


def test_table_state_bytes_are_optimizer_state_bytes(quick_study):
    import functools

    import flax.linen as nn
    import jax

    from gpt1_jax.config import load_yaml
    from gpt1_jax.model import init_params
    from gpt1_jax.optim import make_optimizer, optimizer_state_bytes
    from gpt1_jax.config import PretrainConfig

    study, _ = quick_study
    summary = {r["optimizer"]: r for r in json.loads((study / "results.json").read_text())["summary"]}
    for name in OPTS:
        run = next(r for r in json.loads((study / "results.json").read_text())["runs"] if r["optimizer"] == name)
        config = load_yaml(PretrainConfig, study / run["workdir"] / "config.yaml")
        params = nn.meta.unbox(jax.eval_shape(functools.partial(init_params, config.model), jax.random.key(0)))
        state = jax.eval_shape(make_optimizer(config.optim, params).init, params)
        expected = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
        assert optimizer_state_bytes(config.optim, params) == expected == summary[name]["state_bytes"]


def test_rerun_skips_finished_runs_even_without_their_run_dirs(quick_study):
    """A rerun trains nothing; nor does one whose run dirs are gone (another session, a fresh clone) when the
    records kept with --records are there."""
    import shutil

    study, argv = quick_study
    before = {p: p.stat().st_mtime for p in study.glob("runs/*/*/metrics.jsonl")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "==" not in done.stderr  # no run started
    assert {p: p.stat().st_mtime for p in study.glob("runs/*/*/metrics.jsonl")} == before
    summary = json.loads((study / "results.json").read_text())["summary"]
    shutil.rmtree(study / "runs")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0 and "==" not in done.stderr, done.stderr[-3000:]
    assert json.loads((study / "results.json").read_text())["summary"] == summary
    subset = list(argv)
    subset[subset.index("--optimizers") + 1] = "gpt1_adam"  # one of the study's two, again: its tables keep both
    done = subprocess.run(subset, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0 and "==" not in done.stderr, done.stderr[-3000:]
    assert json.loads((study / "results.json").read_text())["summary"] == summary
    assert (study.parent / "published" / "pretrain" / "results.json").read_text() == (study / "results.json").read_text()
    records = {p: p.read_text() for p in (study.parent / "records").rglob("*.json")}
    longer = list(argv)
    longer[longer.index("--steps") + 1] = "8"  # another budget over the same records: refused, not mixed in
    done = subprocess.run(longer, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2 and "==" not in done.stderr  # a project error's status and line (harness.main)
    assert ": error: " in (last := done.stderr.strip().splitlines()[-1]), done.stderr[-3000:]
    assert "another budget (steps=6; this sweep: steps=8)" in last
    assert {p: p.read_text() for p in (study.parent / "records").rglob("*.json")} == records


def test_sigterm_stops_the_study_with_one_line_and_no_record(tmp_path):
    """SIGTERM as the first run starts (compiling, or in its loop: either way): exit 130, one line saying the
    same command resumes, and no record that would make a rerun skip the unfinished run."""
    import signal
    import time

    argv = [*STUDY, "pretrain", "--quick", "--out", str(tmp_path), "--optimizers", "gpt1_adam",
            "--steps", "200", "--lr-points", "2", "--max-extensions", "0", "--seeds", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    t0 = time.time()
    while not list(tmp_path.glob("pretrain/runs/gpt1_adam/*")) and time.time() - t0 < 120:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err[-3000:]
    assert "python -m experiments.optimizers.run_study: interrupted" in err.strip().splitlines()[-1], err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert not list(tmp_path.rglob("record.json"))


def test_bench_columns_are_kept_with_the_records(quick_study):
    """`bench` times each optimizer's step (the study's shape and a preset's: 117M in the full study) into the
    table, and keeps the timings beside the records, so a study dir without its bench folder (a fresh clone)
    still shows them."""
    import shutil

    study, argv = quick_study
    out = argv[argv.index("--out") + 1]
    bench = [*STUDY, "bench", "--quick", "--out", out, "--optimizers", OPTS[0],
             "--records", str(study.parent / "records")]
    shutil.rmtree(study / "runs")  # a fresh clone: the table's rows come from the kept records
    done = subprocess.run(bench, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    timed = json.loads((study / "bench" / f"{OPTS[0]}.json").read_text())
    assert timed["study"]["step_s"] > 0 and (timed["tiny_1x64"]["batch"], timed["tiny_1x64"]["seq"]) == (1, 64)
    assert json.loads((study.parent / "records" / "pretrain" / "bench" / f"{OPTS[0]}.json").read_text()) == timed
    row = next(r for r in json.loads((study / "results.json").read_text())["summary"] if r["optimizer"] == OPTS[0])
    assert row["bench"] == timed and len(json.loads((study / "results.json").read_text())["runs"]) == 2 * 2
    shutil.rmtree(study / "bench")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)  # trains nothing, rewrites
    assert done.returncode == 0 and "==" not in done.stderr, done.stderr[-3000:]
    row = next(r for r in json.loads((study / "results.json").read_text())["summary"] if r["optimizer"] == OPTS[0])
    assert row["bench"] == timed


def test_quick_finetune_study_scores_each_optimizer_and_refuses_another_budget(quick_study, glue_dir):
    """`finetune --quick` fine-tunes the released laptop-scale model (the full study's init; the quick
    pre-training's checkpoints are gone by now, as on a fresh clone) on SST-2 (the fixture's rows): a row per
    optimizer, schedule-free scored at x, records kept with their budget; a record made under another budget
    stops the study with one line and trains nothing."""
    study, argv = quick_study
    out = Path(argv[argv.index("--out") + 1])
    ft = [*STUDY, "finetune", "--quick", "--out", str(out), "--data-dir", str(glue_dir),
          "--init", str(ROOT / "experiments" / "paper" / "release"),
          "--optimizers", "schedule_free_adamw", "--lr-points", "2", "--max-extensions", "0", "--seeds", "0",
          "--records", str(out / "records")]
    done = subprocess.run(ft, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((out / "finetune" / "sst2" / "results.json").read_text())
    assert len(results["runs"]) == 2 and [r["optimizer"] for r in results["summary"]] == ["schedule_free_adamw"]
    for r in results["runs"]:
        assert r["eval_at"].startswith("x") and (r["diverged"] or 0 <= r["dev_best"] <= 1)
        assert (r["epochs"], r["max_train"], r["init"]) == (1, 64, "experiments/paper/release")
        predicted = (out / "finetune" / "sst2" / r["workdir"] / "predictions" / "validation.tsv").read_text()
        assert r["dev_classes_predicted"] == len({l.split("\t")[1] for l in predicted.splitlines()[1:]}) >= 1
    for name in ("dev_vs_epoch.png", "dev_vs_time.png", "dev_vs_lr.png"):
        assert (out / "finetune" / "sst2" / name).stat().st_size > 10_000
    kept = sorted((out / "records" / "finetune" / "sst2").rglob("*.json"))
    assert len(kept) == 2
    rec = json.loads(kept[0].read_text())
    kept[0].write_text(json.dumps(dict(rec, epochs=2)))  # as if made by a 2-epoch study
    import shutil

    shutil.rmtree(out / "finetune" / "sst2" / "runs")
    done = subprocess.run(ft, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2 and "== finetune" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "error: " in last and "another budget (epochs=2; this sweep: epochs=1)" in last
