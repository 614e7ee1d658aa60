"""experiments.optimizers.run_study: the --quick pre-training study on `tiny` produces results.json,
results.md and the PNGs with a row per optimizer; a rerun skips finished runs; a diverged run is recorded
as diverged; the state bytes in the table are `optimizer_state_bytes` of the real tree.

For time, the end-to-end test restricts --optimizers to 2 (gpt1_adam and schedule_free_adamw: the plain one
and the one evaluated at x), --steps to 6, --lr-points to 2 and --max-extensions to 0,
with 2 seeds (6 runs; the study itself sweeps >= 3 lrs, grows them until the best is bracketed and repeats it
with 3 seeds): every run compiles its own train step (the lr is a constant in it), and compilation, not
training, is what costs here. The bracketing rule has its own test on records."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.optimizers import run_study as rs
from experiments.optimizers import sweep as sw
from experiments.optimizers import tables as tb
from gpt1_jax.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
STUDY = [sys.executable, "-m", "experiments.optimizers.run_study"]  # run with cwd=ROOT
ENV = {**os.environ, "XLA_FLAGS": ""}  # one real CPU device, as a user runs it (conftest fakes 8 here)
OPTS = ["gpt1_adam", "schedule_free_adamw"]  # muon's partitioned update has its own tests (test_optim.py)


@pytest.fixture(scope="module")
def quick_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("opt-study")
    argv = [*STUDY, "pretrain", "--quick", "--out", str(out), "--optimizers", ",".join(OPTS),
            "--steps", "6", "--lr-points", "2", "--max-extensions", "0", "--seeds", "0,1",
            "--cache-dir", str(out / "token-cache"), "--records", str(out / "records"), "--results", str(out / "published")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return out / "pretrain", argv


def test_quick_study_writes_all_outputs(quick_study):
    study, _ = quick_study
    for name in ("results.json", "results.md", "val_vs_tokens.png", "val_vs_time.png", "loss_vs_lr.png"):
        assert (study / name).is_file() and (study / name).stat().st_size > 0, name
    results = json.loads((study / "results.json").read_text())
    runs = results["runs"]
    assert len(runs) == 2 * 2 + 2  # 2 lrs at seed 0, then seed 1 at the best lr
    for name in OPTS:
        mine = [r for r in runs if r["optimizer"] == name]
        assert len({r["lr"] for r in mine if r["seed"] == 0}) == 2
        assert {r["seed"] for r in mine} == {0, 1}
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
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "==" not in done.stderr  # no run started
    assert {p: p.stat().st_mtime for p in study.glob("runs/*/*/metrics.jsonl")} == before
    summary = json.loads((study / "results.json").read_text())["summary"]
    shutil.rmtree(study / "runs")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert done.returncode == 0 and "==" not in done.stderr, done.stderr[-3000:]
    assert json.loads((study / "results.json").read_text())["summary"] == summary
    records = {p: p.read_text() for p in (study.parent / "records").rglob("*.json")}
    longer = list(argv)
    longer[longer.index("--steps") + 1] = "8"  # another budget over the same records: refused, not mixed in
    done = subprocess.run(longer, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert done.returncode != 0 and "==" not in done.stderr
    assert "another budget (steps=6; this study: steps=8)" in done.stderr.strip().splitlines()[-1]
    assert {p: p.read_text() for p in (study.parent / "records").rglob("*.json")} == records


def test_diverged_run_is_recorded_not_raised(tmp_path, monkeypatch):
    """pretrain.run's outcome "diverged" after a NaN loss -> diverged: True, no val loss, and the study goes on."""
    import gpt1_jax.pretrain
    from gpt1_jax.loop import Outcome

    def diverging_run(config, workdir):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0, "tokens_per_s": 100.0}) + "\n"
                                               + json.dumps({"step": 2, "loss": "nan"}) + "\n")
        return Outcome("diverged", 2, {"loss": float("nan")}, "loss is nan at step 2; stopping")

    monkeypatch.setattr(gpt1_jax.pretrain, "run", diverging_run)
    budget = dict(rs.PRETRAIN["quick"], steps=4, source="default")
    rec = rs.pretrain_run(tmp_path, budget, "sgd_nesterov", 1.0, 0, "train", None)
    assert rec["diverged"] and rec["final_val_loss"] is None and rec["error"].startswith("DivergenceError: loss is nan")
    assert json.loads((tmp_path / "runs" / "sgd_nesterov" / "lr1_s0" / "record.json").read_text())["diverged"]
    assert sw.score(rec) is None and sw.best_lr([rec], "sgd_nesterov", 0) is None


def test_an_interrupted_finetune_run_stops_the_study_without_a_record(tmp_path, monkeypatch):
    """finetune.run's outcome is "preempted" when SIGTERM stopped it at a checkpoint. A record then would mark
    the run finished with no score, and every rerun would skip it; instead there is no record (None), the
    study stops (exit 130, one line) and the same command resumes the run."""
    import gpt1_jax.finetune
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.loop import Outcome

    monkeypatch.setattr(gpt1_jax.finetune, "run", lambda *args, **kwargs: Outcome("preempted", 3))
    assert rs.finetune_run(tmp_path / "study", dict(rs.FINETUNE["quick"]), "sst2", "gpt1_adam", 3e-4, 0, tmp_path,
                           ModelConfig(), None, tmp_path / "records") is None
    assert not list(tmp_path.rglob("*.json"))


def test_sigterm_stops_the_study_with_one_line_and_no_record(tmp_path):
    """SIGTERM as the first run starts (compiling, or in its loop: either way): exit 130, one line saying the
    same command resumes, and no record that would make a rerun skip the unfinished run."""
    import signal
    import time

    argv = [*STUDY, "pretrain", "--quick", "--out", str(tmp_path), "--optimizers", "gpt1_adam",
            "--steps", "200", "--lr-points", "2", "--max-extensions", "0", "--seeds", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    t0 = time.time()
    while not list(tmp_path.glob("pretrain/runs/gpt1_adam/*")) and time.time() - t0 < 120:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err[-3000:]
    assert "run_study.py: interrupted" in err.strip().splitlines()[-1] and "Traceback" not in err, err[-3000:]
    assert not list(tmp_path.rglob("record.json"))


def test_lr_grid_is_a_log_grid_around_the_centre():
    assert sw.lr_grid(3e-3) == [1e-3, 3e-3, 1e-2]
    assert sw.lr_grid(1e-2, 5) == [1e-3, 3e-3, 1e-2, 3e-2, 0.1]
    assert all(len(sw.lr_grid(s["pretrain_lr"])) == 3 for s in rs.SPECS.values())
    from gpt1_jax.optim import OPTIMIZERS

    assert set(rs.SPECS) <= set(OPTIMIZERS) and len(rs.SPECS) >= 8


def _rec(name, lr, loss, seed=0):
    return {"study": "pretrain", "optimizer": name, "lr": lr, "seed": seed, "diverged": loss is None,
            "final_val_loss": loss, "optimizer_state_bytes": 1, "wall_seconds": 1.0, "train_seconds": 1.0,
            "tokens_per_s": 1.0}


def test_the_sweep_grows_until_the_best_lr_is_bracketed():
    runs = [_rec("a", 1e-3, 5.0), _rec("a", 3e-3, 4.8), _rec("a", 1e-2, 4.7)]  # best on the upper edge
    assert sw.bracket_gap(runs, "a", 0) == 3e-2
    assert sw.bracket_gap(runs + [_rec("a", 3e-2, 4.9)], "a", 0) is None  # a worse neighbour on both sides
    assert sw.bracket_gap(runs + [_rec("a", 3e-2, None)], "a", 0) is None  # ... or a diverged one
    low = [_rec("b", 1e-3, 4.0), _rec("b", 3e-3, 4.5), _rec("b", 1e-2, None)]
    assert sw.bracket_gap(low, "b", 0) == 3e-4
    assert sw.bracket_gap([_rec("c", 1.0, None)], "c", 0) == 0.3  # all diverged: go lower
    # a neighbour that ties the best is no worse: the plateau needs a worse lr past its lower end
    flat = [_rec("d", 1e-4, 4.2), _rec("d", 3e-4, 4.2), _rec("d", 1e-3, 4.5)]
    assert sw.bracket_gap(flat, "d", 0) == 3e-5
    assert sw.bracket_gap(flat + [_rec("d", 3e-5, 4.3)], "d", 0) is None
    ran = []

    def run_one(study, name, lr, seed):  # a loss curve in lr with its minimum at 3e-2, seeds add noise
        ran.append((lr, seed))
        return _rec(name, lr, 4.0 + abs(math.log10(lr / 3e-2)) + 0.01 * seed, seed)

    runs, complete = sw.study_loop(Path("."), ["a"], [0, 1, 2], {"a": [1e-3, 3e-3, 1e-2]}, run_one, 4,
                                   lambda runs: None)
    assert complete
    assert sorted({lr for lr, s in ran if s == 0}) == [1e-3, 3e-3, 1e-2, 3e-2, 0.1]
    assert sorted(s for lr, s in ran if lr == 3e-2) == [0, 1, 2]
    rows = tb.summarize(runs[::-1], ["a"], [0, 1, 2])
    assert rows[0]["best_lr"] == 3e-2 and rows[0]["bracketed"] and rows[0]["n_seeds"] == 3
    assert rows[0]["values"] == sorted(rows[0]["values"])  # seed order, whatever order the runs came in


def test_tables_written_by_a_resumed_study_keep_every_finished_run():
    """A study resumed in a new session revisits its finished runs in loop order; the tables it writes on
    the way (committed between sessions) still show every finished run, not only the ones revisited."""
    finished = [_rec("a", 1e-3, 5.0), _rec("a", 3e-3, 4.8), _rec("a", 1e-2, 4.9), _rec("b", 1e-2, 4.5),
                _rec("other", 1e-2, 3.0)]
    by_key = {(r["optimizer"], r["lr"], r["seed"]): r for r in finished}

    def run_one(study, name, lr, seed):
        if (name, lr, seed) in by_key:
            return by_key[name, lr, seed]
        return None  # the session ends during the first unfinished run: it stopped at a checkpoint

    writes = []
    _, complete = sw.study_loop(Path("."), ["a", "b"], [0, 1], {"a": [1e-3, 3e-3, 1e-2], "b": [3e-3, 1e-2, 3e-2]},
                                run_one, 4, lambda runs: writes.append(sorted((r["optimizer"], r["lr"]) for r in runs)),
                                finished)
    assert not complete
    assert len(writes) == 5  # a and b at their centres, then a's grid; b at 3e-3 is where the session ended
    assert all(w == sorted(k[:2] for k in by_key if k[0] != "other") for w in writes)


def test_rows_mark_differences_beyond_the_seed_noise():
    runs = [_rec("a", 1e-3, v, s) for s, v in enumerate((4.00, 4.02, 4.04))]
    runs += [_rec("b", 1e-3, v, s) for s, v in enumerate((4.03, 4.05, 4.07))]  # overlaps a
    runs += [_rec("c", 1e-3, v, s) for s, v in enumerate((4.50, 4.52, 4.54))]  # clearly worse
    rows = tb.summarize(runs, ["c", "b", "a"], [0, 1, 2])
    assert [r["optimizer"] for r in rows] == ["a", "b", "c"]
    assert [r["distinct_from_next"] for r in rows] == [False, True, False]


def test_step_times_count_compilation_and_pauses_as_a_median_step():
    """Step 1 (compilation) and a step stretched by a pause count as the median step; the rest as logged."""
    logged = [{"step": 1, "tokens_per_s": 10.0}, {"step": 2, "tokens_per_s": 100.0}, {"step": 3, "tokens_per_s": 50.0},
              {"step": 4, "tokens_per_s": 100.0}, {"step": 5, "tokens_per_s": 100.0}, {"step": 6, "tokens_per_s": 1.0},
              {"step": 7, "loss": 3.0}]
    times = rs.step_times(logged, tokens_per_step=100)
    assert times == {1: 1.0, 2: 1.0, 3: 2.0, 4: 1.0, 5: 1.0, 6: 1.0}


def test_training_time_is_one_machines_when_runs_span_cpus():
    """Runs on two CPU kinds, one twice the other's speed: each run's seconds are put in the bench machine's
    by its kind's factor, so the same optimizer gets the same time on both, and an optimizer whose training
    loop costs more than its bench step (c: 1.2x) keeps that cost; without bench columns the runs' own
    seconds; benches from two CPU kinds are flagged."""

    def run(name, seed, seconds, flags):
        return dict(_rec(name, 1e-3, 4.0, seed), steps=800, tokens_per_step=4096, train_seconds=seconds, cpu_flags=flags)

    fast, slow = "avx avx_vnni", "avx"
    runs = [run("a", 0, 600.0, fast), run("a", 1, 1200.0, slow), run("b", 0, 400.0, fast), run("b", 1, 800.0, slow),
            run("c", 0, 480.0, fast)]
    bench = {"a": {"study": {"step_s": 1.5}, "cpu_flags": ["avx"]}, "b": {"study": {"step_s": 1.0}, "cpu_flags": ["avx"]},
             "c": {"study": {"step_s": 1.0}, "cpu_flags": ["avx"]}}
    assert tb.machine_factors(runs, bench) == {fast: 0.5, slow: 1.0}
    rows = {r["optimizer"]: r for r in tb.summarize(runs, ["a", "b", "c"], [0, 1], bench)}
    assert (rows["a"]["time_basis"], rows["a"]["train_seconds"], rows["a"]["tokens_per_s"]) == ("bench machine", 1200.0, 800 * 4096 / 1200)
    assert rows["b"]["train_seconds"] == 800.0 and rows["c"]["train_seconds"] == 960.0
    text = "\n".join(tb.findings("pretrain", list(rows.values()), runs))
    assert "slower than the optimizer's bench step by more than 10% (on the bench machine's clock): c (+20%);" in text
    (row,) = tb.summarize(runs[:2], ["a"], [0, 1], {})
    assert (row["time_basis"], row["train_seconds"]) == ("measured", 900.0)
    bench["b"]["cpu_flags"] = ["avx", "avx_vnni"]
    rows = tb.summarize(runs, ["a", "b", "c"], [0, 1], bench)
    assert "timed on 2 CPU kinds" in "\n".join(tb.findings("pretrain", rows, runs))
    assert tb.cpu_kinds(runs + [{}]) == ["avx", "avx avx_vnni", "unknown"]


def test_findings_name_fine_tuning_runs_that_predicted_one_class():
    flat = [dict(_rec("c", lr, None), diverged=False, study="finetune", dev_best=f1, dev_classes_predicted=n)
            for lr, f1, n in ((1e-3, 0.81, 1), (3e-3, 0.84, 2), (1e-2, 0.81, 1))]
    text = "\n".join(tb.findings("finetune", tb.summarize(flat, ["c"], [0]), flat))
    assert "2 of 3 runs predicted one class for all of dev (0 of them at an optimizer's best lr)" in text
    other = [dict(flat[1], optimizer="e", dev_best=0.8, metric="f1")]  # one lr: its best is not bracketed
    text = "\n".join(tb.findings("finetune", tb.summarize(flat + other, ["c", "e"], [0]), flat + other))
    assert "c leads e by 0.040 in dev f1" in text and "not yet bracketed (its optimum may lie beyond the rates tried): e." in text
    flat[1]["dev_classes_predicted"] = 1
    text = "\n".join(tb.findings("finetune", tb.summarize(flat, ["c"], [0]), flat))
    assert "3 of 3 runs predicted one class for all of dev (1 of them at an optimizer's best lr)" in text


def test_findings_group_the_rows_by_the_seed_noise():
    """a is ahead of b and c beyond their spread; b and c overlap; d has one seed and an unbracketed best lr."""
    runs = ([_rec("a", 1e-3, 4.0), _rec("a", 3e-3, 3.9), _rec("a", 1e-2, 4.1)]
            + [_rec("a", 3e-3, 3.9 + 0.01 * s, s) for s in (1, 2)]
            + [_rec("b", lr, loss) for lr, loss in ((1e-3, 4.6), (3e-3, 4.5), (1e-2, 4.7))]
            + [_rec("b", 3e-3, 4.5 + 0.05 * s, s) for s in (1, 2)]
            + [_rec("c", lr, loss) for lr, loss in ((1e-3, 4.7), (3e-3, 4.55), (1e-2, None))]
            + [_rec("c", 3e-3, 4.55 + 0.05 * s, s) for s in (1, 2)]
            + [_rec("d", 1e-3, 5.5), _rec("d", 3e-3, 5.2)])
    rows = tb.summarize(runs, ["a", "b", "c", "d"], [0, 1, 2])
    text = "\n".join(tb.findings("pretrain", rows, runs))
    assert "a (3.910 ± 0.010, 3 seeds) > b (4.550 ± 0.050, 3 seeds) ≈ c (4.600 ± 0.050, 3 seeds) ? d (5.200" in text
    assert "a leads b by 0.640 nats: more than the seed noise" in text
    assert "One seed so far (no noise estimate yet): d." in text
    assert "not yet bracketed (its optimum may lie beyond the rates tried): d." in text
    assert "Diverged: c at 0.01." in text
    assert "final validation loss is 3.910 nats/token, within the 5" in text
    lone = tb.summarize(runs[-2:] + [_rec("e", 1e-3, 5.0)], ["d", "e"], [0, 1, 2])  # one seed each
    assert "e leads d by 0.200 nats: the seed noise is not measured yet" in "\n".join(tb.findings("pretrain", lone, runs))


def test_bench_columns_are_kept_with_the_records(quick_study):
    """`bench` times each optimizer's step (study shape and 117M) into the table, and keeps the timings beside
    the records, so a study dir without its bench folder (a fresh clone) still shows them."""
    import shutil

    study, argv = quick_study
    out = argv[argv.index("--out") + 1]
    bench = [*STUDY, "bench", "--quick", "--out", out, "--optimizers", OPTS[0],
             "--records", str(study.parent / "records")]
    shutil.rmtree(study / "runs")  # a fresh clone: the table's rows come from the kept records
    done = subprocess.run(bench, capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    timed = json.loads((study / "bench" / f"{OPTS[0]}.json").read_text())
    assert timed["study"]["step_s"] > 0 and (timed["gpt1_117M"]["batch"], timed["gpt1_117M"]["seq"]) == (1, 64)
    assert json.loads((study.parent / "records" / "pretrain" / "bench" / f"{OPTS[0]}.json").read_text()) == timed
    row = next(r for r in json.loads((study / "results.json").read_text())["summary"] if r["optimizer"] == OPTS[0])
    assert row["bench"] == timed and len(json.loads((study / "results.json").read_text())["runs"]) == 2 * 2 + 2
    shutil.rmtree(study / "bench")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)  # trains nothing, rewrites
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
          "--optimizers", "schedule_free_adamw", "--lr-points", "2", "--max-extensions", "0", "--seeds", "0,1",
          "--records", str(out / "records")]
    done = subprocess.run(ft, capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((out / "finetune" / "sst2" / "results.json").read_text())
    assert len(results["runs"]) == 3 and [r["optimizer"] for r in results["summary"]] == ["schedule_free_adamw"]
    for r in results["runs"]:
        assert r["eval_at"].startswith("x") and (r["diverged"] or 0 <= r["dev_best"] <= 1)
        assert (r["epochs"], r["max_train"], r["init"]) == (1, 64, "experiments/paper/release")
        predicted = (out / "finetune" / "sst2" / r["workdir"] / "predictions" / "validation.tsv").read_text()
        assert r["dev_classes_predicted"] == len({l.split("\t")[1] for l in predicted.splitlines()[1:]}) >= 1
    for name in ("dev_vs_epoch.png", "dev_vs_time.png", "dev_vs_lr.png"):
        assert (out / "finetune" / "sst2" / name).stat().st_size > 10_000
    kept = sorted((out / "records" / "finetune" / "sst2").rglob("*.json"))
    assert len(kept) == 3
    rec = json.loads(kept[0].read_text())
    kept[0].write_text(json.dumps(dict(rec, epochs=2)))  # as if made by a 2-epoch study
    import shutil

    shutil.rmtree(out / "finetune" / "sst2" / "runs")
    done = subprocess.run(ft, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert done.returncode != 0 and "== finetune" not in done.stderr
    assert "another budget (epochs=2; this study: epochs=1)" in done.stderr.strip().splitlines()[-1]
