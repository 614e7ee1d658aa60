"""experiments.optimizers: the study's logic on records, in process: the lr ladder, the sweep growing until
the best lr is bracketed, a diverged run recorded (not raised), a run stopped at a checkpoint leaving no
record, tables that keep every finished run, seed-noise marks, step times and the findings. The study run
for real: tests/e2e/test_optimizers_study.py."""

import json
import math
from pathlib import Path

import pytest

from experiments.lr_grid import lr_grid
from experiments.optimizers import run_study as rs
from experiments.optimizers import sweep as sw
from experiments.optimizers import tables as tb


def test_diverged_run_is_recorded_not_raised(tmp_path, monkeypatch):
    """pretrain.run's outcome "diverged" after a NaN loss -> diverged: True, no val loss, and the study goes on."""
    import gpt1_jax.pretrain
    from gpt1_jax.loop import Outcome

    def diverging_run(config, workdir, **options):
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


def test_lr_grid_is_a_log_grid_around_the_centre():
    assert lr_grid(3e-3) == [1e-3, 3e-3, 1e-2]
    assert lr_grid(1e-2, 5) == [1e-3, 3e-3, 1e-2, 3e-2, 0.1]
    assert all(len(lr_grid(s["pretrain_lr"])) == 3 for s in rs.SPECS.values())
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

    plots = []
    runs, complete = sw.study_loop(Path("."), ["a"], [0, 1, 2], {"a": [1e-3, 3e-3, 1e-2]}, run_one, 4,
                                   lambda runs, drawn: plots.append(drawn))
    assert complete
    assert plots == [False] * len(set(ran)) + [True]  # tables after each new run (all quick here), plots at the end
    assert sorted({lr for lr, s in ran if s == 0}) == [1e-3, 3e-3, 1e-2, 3e-2, 0.1]
    assert sorted(s for lr, s in ran if lr == 3e-2) == [0, 1, 2]
    rows = tb.summarize(runs[::-1], ["a"], [0, 1, 2])
    assert rows[0]["best_lr"] == 3e-2 and rows[0]["bracketed"] and rows[0]["n_seeds"] == 3
    assert rows[0]["values"] == sorted(rows[0]["values"])  # seed order, whatever order the runs came in


def test_extensions_are_capped_over_every_invocation_and_ties_go_to_the_larger_lr():
    """--max-extensions counted per invocation: a resumed study extended again (the committed MRPC muon row tried
    4 extensions under "at most 2"). A tie went to the run listed first: the centre lr live, the smallest rebuilt."""
    grid = {"a": [1e-3, 3e-3, 1e-2]}
    runs = [_rec("a", 1e-3, 5.0), _rec("a", 3e-3, 4.8), _rec("a", 1e-2, 4.7), _rec("a", 3e-2, 4.6),
            _rec("a", 0.1, 4.5)]  # two extensions recorded, the best still on the edge
    assert sw.bracket_gap(runs, "a", 0) == 0.3
    order = list(sw.study_order(runs, ["a"], [0], grid, 2))
    assert all(lr in grid["a"] for _, lr, _ in order)  # nothing beyond the grid: the cap is spent
    assert list(sw.study_order(runs, ["a"], [0], grid, 3))[-1] == ("a", 0.3, 0)
    tie = [_rec("b", 3e-4, 4.2), _rec("b", 1e-4, 4.2), _rec("b", 1e-3, 4.5)]
    assert sw.best_lr(tie, "b", 0) == sw.best_lr(tie[::-1], "b", 0) == 3e-4


def test_tables_written_by_a_resumed_study_keep_every_finished_run():
    """A study resumed in a new session revisits its finished runs in loop order without rewriting anything;
    the tables the first new run writes (committed between sessions) still show every finished run, not only
    the ones revisited."""
    finished = [_rec("a", 1e-3, 5.0), _rec("a", 3e-3, 4.8), _rec("a", 1e-2, 4.9), _rec("b", 1e-2, 4.5),
                _rec("other", 1e-2, 3.0)]
    by_key = {(r["optimizer"], r["lr"], r["seed"]): r for r in finished}
    new = _rec("b", 3e-3, 4.6)

    def run_one(study, name, lr, seed):
        if (name, lr, seed) in by_key:
            return by_key[name, lr, seed]
        if (name, lr) == (new["optimizer"], new["lr"]):
            return new  # trained in this session
        return None  # the session ends during the next unfinished run: it stopped at a checkpoint

    writes = []
    _, complete = sw.study_loop(Path("."), ["a", "b"], [0, 1], {"a": [1e-3, 3e-3, 1e-2], "b": [3e-3, 1e-2, 3e-2]},
                                run_one, 4, lambda runs, plots: writes.append(sorted((r["optimizer"], r["lr"]) for r in runs)),
                                finished)
    assert not complete
    assert writes == [sorted([k[:2] for k in by_key if k[0] != "other"] + [("b", 3e-3)])]  # once: after the new run


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


def test_update_ratios_come_from_the_logged_statistics_and_draw_one_panel_per_optimizer(tmp_path):
    metrics = [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0, "stats/block0/attn/update_ratio": 0.01,
                                          "stats/block0/attn/param_norm": 3.0, "stats/embed/tokens/update_ratio": 0.002},
               {"step": 4, "stats/block0/attn/update_ratio": 0.005, "stats/embed/tokens/update_ratio": 0.001}]
    ratios = rs.update_ratios(metrics)
    assert ratios == {"block0/attn": [[2, 0.01], [4, 0.005]], "embed/tokens": [[2, 0.002], [4, 0.001]]}
    curve = [{"step": 2, "val_loss": 3.0, "train_seconds": 1.0}]
    runs = [dict(_rec("adamw", 1e-3, 3.0), val_curve=curve, steps=4, tokens_per_step=8, update_ratio=ratios),
            dict(_rec("lion", 1e-4, 3.1), val_curve=curve, steps=4, tokens_per_step=8, update_ratio=ratios)]
    rows = tb.summarize(runs, ["adamw", "lion"], [0])
    paths = tb.plot(tmp_path, "pretrain", runs, rows, [0])
    assert tmp_path / "update_ratio.png" in paths and (tmp_path / "update_ratio.png").stat().st_size > 10_000
    older = [{k: v for k, v in r.items() if k != "update_ratio"} for r in runs]  # records from before the statistics
    (tmp_path / "old").mkdir()
    assert tmp_path / "old" / "update_ratio.png" not in tb.plot(tmp_path / "old", "pretrain", older, rows, [0])
    assert not (tmp_path / "old" / "update_ratio.png").exists()


def test_an_optimizer_on_the_unigram_plateau_is_not_ranked_and_speedups_read_the_reference_curve():
    """Issue 33's two honesty fixes. lion's best loss at every lr stays within 0.01 nats of the unigram loss
    (6.97): "did not train at this budget", last, out of the order. The token speed-up: the tokens gpt1_adam's
    curve (100 tokens per step) needs to reach each optimizer's final loss, over that optimizer's 400 tokens."""
    curve = [{"step": 1, "val_loss": 7.0}, {"step": 2, "val_loss": 6.0}, {"step": 3, "val_loss": 5.5},
             {"step": 4, "val_loss": 5.0}]

    def rec(name, lr, loss, seed=0, own=()):
        return dict(_rec(name, lr, loss, seed), best_val_loss=loss, tokens=400, tokens_per_step=100, steps=4,
                    val_curve=curve if name == "gpt1_adam" else [{"step": s, "val_loss": v} for s, v in own])

    # fast ends below gpt1_adam's whole curve: its own curve reaches gpt1_adam's final 5.0 at step 2 (200 tokens)
    runs = [rec("gpt1_adam", 1e-3, 5.0), rec("gpt1_adam", 3e-4, 5.2), rec("gpt1_adam", 3e-3, 5.1),
            rec("lamb", 1e-3, 5.75), rec("muon", 1e-3, 4.5), rec("slow", 1e-3, 7.5),
            rec("fast", 1e-3, 4.6, own=[(1, 6.0), (2, 5.0), (4, 4.6)]),
            rec("lion", 1e-4, 6.965), rec("lion", 3e-4, 6.975), rec("lion", 1e-3, 7.2)]
    rows = {r["optimizer"]: r for r in tb.summarize(runs, ["gpt1_adam", "lamb", "muon", "slow", "fast", "lion"], [0],
                                                     unigram=6.97)}
    assert rows["lion"]["trained"] is False and rows["lamb"]["trained"] and rows["slow"]["trained"] is False
    order = [r["optimizer"] for r in tb.summarize(runs, ["lion", "gpt1_adam", "lamb", "muon", "slow"], [0], unigram=6.97)]
    assert order == ["muon", "gpt1_adam", "lamb", "lion", "slow"]  # the ranked ones by loss, then the untrained
    # lamb's 5.75 lies halfway between steps 2 (6.0) and 3 (5.5): 250 of 400 tokens
    assert (rows["lamb"]["token_speedup"], rows["lamb"]["speedup_bound"]) == (0.625, "=")
    assert (rows["gpt1_adam"]["token_speedup"], rows["gpt1_adam"]["speedup_bound"]) == (1.0, "=")
    assert (rows["fast"]["token_speedup"], rows["fast"]["speedup_bound"]) == (2.0, "=")  # 400 / 200 tokens
    assert (rows["muon"]["token_speedup"], rows["muon"]["speedup_bound"]) == (1.0, ">")  # below, with no curve of its own
    assert rows["lion"]["token_speedup"] is None
    no_unigram = {r["optimizer"]: r for r in tb.summarize(runs, ["lion", "lamb"], [0])}
    assert no_unigram["lion"]["trained"] is None  # a study measured before unigram.json: nothing claimed
    finetune = tb.summarize([dict(r, study="finetune") for r in runs], ["lamb"], [0])
    assert not {"trained", "token_speedup"} & set(finetune[0])  # pre-training's measures only
    text = "\n".join(tb.findings("pretrain", list(rows.values()), runs))
    assert "Did not train at this budget, so not ranked: slow, lion" in text or "not ranked: lion, slow" in text
    assert "lamb 0.62×" in text and "muon > 1.00×" in text and "fast 2.00×" in text and "lion (" not in text.split("Did not train")[0]
    table = "\n".join(tb._table("pretrain", tb.summarize(runs, ["gpt1_adam", "lamb", "muon", "lion"], [0], unigram=6.97), runs))
    assert "| did not train |" in table and "| 0.62× |" in table and "| > 1.00× |" in table


@pytest.mark.parametrize("flags, message", [
    (["--seeds", "a"], "argument --seeds: expected comma-separated whole numbers, got 'a'"),
    (["--seeds", "0,0"], "argument --seeds: a seed is given twice in '0,0'"),
    (["--lr-scale", "0"], "argument --lr-scale: must be a finite number > 0, got 0"),
    (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["--lr-points", "0"], "argument --lr-points: must be >= 3 (a log grid of at least 3 values; --quick allows 2), "
                           "got 0"),
    (["--lr-points", "1"], "argument --lr-points: must be >= 3 (a log grid of at least 3 values; --quick allows 2), "
                           "got 1"),
    (["--quick", "--lr-points", "1"], "argument --lr-points: must be >= 2 (--quick's floor, for tests), got 1"),
    (["--lr-points", "x"], "argument --lr-points: invalid int value: 'x'"),
])
def test_flags_it_cannot_honour_are_one_line(flags, message, capsys):
    """--lr-scale 0 was a ZeroDivisionError, --seeds a a ValueError; --steps 0 ran the default budget, 0,0 twice.
    --lr-points 0 said "must be >= 1", then 1 said "must be >= 3": its first line names the real floor."""
    with pytest.raises(SystemExit) as e:
        rs.parse_args(["pretrain", "--out", "o", *flags])
    err = capsys.readouterr().err.strip().splitlines()  # one line, as gpt1-jax's (experiments/harness.py parser)
    assert e.value.code == 2 and len(err) == 1 and f": error: {message} (see " in err[0], err


@pytest.mark.parametrize("tasks, message", [
    ("sst3", "--tasks: unknown task 'sst3'; known: cola, sst2"),
    ("sst2,SST-2", "--tasks: a task is given twice in 'sst2,SST-2'"),
])
def test_an_unknown_task_is_one_line_before_any_folder(tasks, message, tmp_path, capsys):
    """`--tasks sst3` made <out>/finetune/sst3, then stopped on the unknown task: an empty folder was left behind."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        rs.parse_args(["finetune", "--out", str(out), "--init", str(tmp_path), "--optimizers", "adamw", "--tasks", tasks])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and f"error: {message}" in err
    assert not out.exists()


def test_tasks_are_read_in_their_canonical_spelling(tmp_path):
    args, _ = rs.parse_args(["finetune", "--out", str(tmp_path), "--init", str(tmp_path), "--optimizers", "adamw",
                             "--tasks", "SST-2,mrpc"])
    assert [t[0].name for t in rs.study_tables(args)] == ["sst2", "mrpc"]


def test_the_quick_bench_times_warm_steps_as_the_full_one(tmp_path, monkeypatch):
    """--quick timed 1 step with no warm-up: a cold step ~10x a warm one, and the tables, which scale the runs'
    seconds by the bench step, showed tokens/s 5x below what the runs measured."""
    asked = []

    def fake_bench(config, *, steps, warmup):
        asked.append((steps, warmup))
        return {"step_s_median": 0.01, "tokens_per_s": 1.0, "mfu": 0.0, "cpu_flags": ["avx"]}

    monkeypatch.setattr(rs.bench, "run", fake_bench)
    for name in ("quick", "full"):
        rs.bench_optimizer(tmp_path / name, dict(rs.PRETRAIN[name], source="default"), "adamw", 512)
    quick = asked[:len(rs.PRETRAIN["quick"]["bench_shapes"])]
    assert quick and all(steps >= 3 and warmup >= 1 for steps, warmup in quick)
    assert set(asked) == {(5, 2)}  # the full budget's, which the committed bench records were timed with


def test_one_cpu_kind_keeps_the_runs_own_seconds():
    """Runs and bench on one CPU kind: no machine to convert from, so the runs' own seconds and tokens/s
    ("measured"); converted, every optimizer got the median overhead's seconds and tokens/s tied across rows."""

    def run(name, seed, seconds, rate):
        return dict(_rec(name, 1e-3, 4.0, seed), steps=24, tokens_per_step=512, train_seconds=seconds,
                    tokens_per_s=rate, cpu_flags="avx avx2")

    runs = [run("a", 0, 0.30, 41_000.0), run("a", 1, 0.32, 39_000.0), run("b", 0, 0.26, 47_000.0),
            run("b", 1, 0.27, 46_000.0)]
    bench = {n: {"study": {"step_s": 0.0125}, "cpu_flags": ["avx", "avx2"]} for n in ("a", "b")}
    assert tb.machine_factors(runs, bench) == {}
    rows = {r["optimizer"]: r for r in tb.summarize(runs, ["a", "b"], [0, 1], bench)}
    assert (rows["a"]["time_basis"], rows["a"]["train_seconds"]) == ("measured", 0.31)
    assert rows["a"]["tokens_per_s"] == 40_000.0
    assert (rows["b"]["train_seconds"], rows["b"]["tokens_per_s"]) == (0.265, 46_500.0)
    bench["b"]["cpu_flags"] = ["avx", "avx2", "avx512f"]  # a bench on another kind: the runs' seconds convert
    assert set(tb.machine_factors(runs, bench)) == {"avx avx2"}


def test_a_run_records_its_training_seconds_to_the_millisecond(tmp_path, monkeypatch):
    """A quick run trains in ~0.3 s: kept to 0.01 s, its seconds tied with other optimizers'."""
    import gpt1_jax.pretrain
    from gpt1_jax.loop import Outcome

    def short_run(config, workdir, **options):
        workdir.mkdir(parents=True, exist_ok=True)
        rows = [{"step": s, "loss": 5.0, "tokens_per_s": 512 / 0.0123, "step_s": 0.0123} for s in range(1, 5)]
        rows.append({"step": 4, "val_loss": 5.1})
        (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return Outcome("finished", 4)

    monkeypatch.setattr(gpt1_jax.pretrain, "run", short_run)
    budget = dict(rs.PRETRAIN["quick"], steps=4, source="default")
    rec = rs.pretrain_run(tmp_path, budget, "adamw", 1e-3, 0, "train", None)
    assert rec["train_seconds"] == 0.049 and rec["final_val_loss"] == 5.1


def test_the_token_speedup_reads_mean_curves_as_the_means_it_compares():
    """The speed-up compares a row's mean loss: it read gpt1_adam's seed-0 curve, which (seed 0 its worst seed)
    never reached gpt1_adam's own mean, so a row within the seed noise of gpt1_adam read "> 1.00x". Read off the
    mean curves, both end at their means."""

    def rec(name, seed, losses):
        curve = [{"step": s, "val_loss": v} for s, v in enumerate(losses, 1)]
        return dict(_rec(name, 1e-3, losses[-1], seed), tokens=400, tokens_per_step=100, steps=4, val_curve=curve)

    ref_finals, a_finals = (5.2, 5.0, 4.9), (5.05, 5.03, 5.04)
    runs = [rec("gpt1_adam", s, [7.0, 6.0, 5.5, f]) for s, f in enumerate(ref_finals)]
    runs += [rec("a", s, [6.5, 5.8, 5.3, f]) for s, f in enumerate(a_finals)]
    rows = {r["optimizer"]: r for r in tb.summarize(runs, ["gpt1_adam", "a"], [0, 1, 2])}
    ref_mean, a_mean = rows["gpt1_adam"]["mean"], rows["a"]["mean"]
    assert a_mean > ref_mean  # a is (slightly) worse: gpt1_adam's mean curve reaches a's mean before its end
    needed = 300 + 100 * (5.5 - a_mean) / (5.5 - ref_mean)
    assert rows["a"]["speedup_bound"] == "=" and rows["a"]["token_speedup"] == pytest.approx(needed / 400)
    assert rows["a"]["token_speedup"] < 1 and rows["gpt1_adam"]["token_speedup"] == 1.0
    assert tb._curve(runs, rows["gpt1_adam"])[0][-1][1] == ref_mean  # the reference's curve ends at its mean


def test_small_times_keep_their_digits_and_large_ones_read_as_before():
    """--quick's train s read 0, 1 or 2 and its compute "0.0 h"; the committed studies' cells are unchanged."""
    assert [tb._seconds(x) for x in (0.2345, 2.8254, 9.994, 65.4, 1333.2, None)] == ["0.23", "2.83", "9.99", "65",
                                                                                      "1333", "-"]
    quick = [dict(_rec("a", 1e-3, 4.0), wall_seconds=w) for w in (40.0, 31.5)]
    assert tb._compute_line(quick) == "Compute: 2 runs, 1 min 12 s of wall-clock in all."
    full = [dict(_rec("a", 1e-3, 4.0), wall_seconds=w) for w in (30_000.0, 27_240.0)]
    assert tb._compute_line(full) == "Compute: 2 runs, 15.9 h of wall-clock in all."


@pytest.mark.parametrize("optimizers, message", [
    ("sgd", "sgd is not in the study's specs (gpt1_adam, adamw, adafactor, lion, sgd_nesterov, muon, "
            "schedule_free_adamw, lamb): each has its centre lrs and own hyper-parameters in "
            "experiments/optimizers/run_study.py SPECS; add an entry there to study another"),
    ("adamw,sgdd", "unknown optimizer(s) sgdd; the study's: gpt1_adam, adamw"),
])
def test_an_optimizer_outside_the_study_is_named_for_what_it_is(optimizers, message, tmp_path, capsys):
    """`--optimizers sgd` said "unknown optimizer(s) sgd" although gpt1-jax trains with it (gpt1_jax.optim)."""
    with pytest.raises(SystemExit) as e:
        rs.parse_args(["pretrain", "--quick", "--out", str(tmp_path), "--optimizers", optimizers])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and f": error: {message}" in err[0], err


@pytest.mark.parametrize("sets, message", [
    (["optim.lr=1e-3"], "optim.lr is set for each run by the lr sweep, not by --set"),
    (["optim.b2=0.9"], "optim.b2 is set for each run by SPECS, per optimizer, not by --set"),
    (["steps=5"], "steps is set for each run by the budget (--steps), not by --set"),
    (["model.n_layerz=2"], "unknown config key 'model.n_layerz'"),
    (["model.n_layers=two"], "model.n_layers must be int, got 'two'"),
])
def test_a_set_the_study_would_replace_or_cannot_apply_is_one_line(sets, message, capsys):
    """--set on the study: what it sets per run or per optimizer would have been replaced without a word."""
    with pytest.raises(SystemExit) as e:
        rs.parse_args(["pretrain", "--out", "o", *(a for s in sets for a in ("--set", s))])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and f": error: --set: {message}" in err[0], err


def test_a_set_reaches_every_run_and_a_rerun_with_another_is_refused(tmp_path, monkeypatch):
    """Every pre-training run and fine-tuning run of the study gets the --set; its records keep it, so the same
    --out run again with another --set (or none) stops in one line instead of counting the old runs as its own,
    and a record kept before --set existed (no "sets") counts as made with none."""
    import gpt1_jax.finetune
    import gpt1_jax.pretrain
    from gpt1_jax.config import ModelConfig
    from gpt1_jax.errors import ConfigError
    from gpt1_jax.loop import Outcome

    seen = []

    def fake_pretrain(config, workdir, **options):
        seen.append(config)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "metrics.jsonl").write_text(json.dumps({"step": 4, "loss": 5.0, "val_loss": 5.0}) + "\n")
        return Outcome("finished", 4)

    monkeypatch.setattr(gpt1_jax.pretrain, "run", fake_pretrain)
    budget = dict(rs.PRETRAIN["quick"], steps=4, source="default", sets=("model.n_layers=1", "optim.clip_norm=0.5"))
    rec = rs.pretrain_run(tmp_path, budget, "adamw", 1e-3, 0, "train", None)
    config = seen[0]
    assert (config.model.n_layers, config.optim.clip_norm, config.optim.name, config.optim.b2) == (1, 0.5, "adamw", 0.95)
    assert rec["sets"] == ["model.n_layers=1", "optim.clip_norm=0.5"]
    with pytest.raises(ConfigError, match="finished under another budget"):
        rs.pretrain_run(tmp_path, dict(budget, sets=()), "adamw", 1e-3, 0, "train", None)
    record = tmp_path / "runs" / "adamw" / "lr0.001_s0" / "record.json"
    record.write_text(json.dumps({k: v for k, v in rec.items() if k != "sets"}))  # as kept before --set
    assert rs.pretrain_run(tmp_path, dict(budget, sets=()), "adamw", 1e-3, 0, "train", None)["steps"] == 4
    assert len(seen) == 1

    asked = []
    monkeypatch.setattr(gpt1_jax.finetune, "run", lambda config, *a, **k: asked.append(config) or Outcome("preempted", 1))
    rs.finetune_run(tmp_path / "ft", dict(rs.FINETUNE["quick"], sets=("lm_coef=0.25",)), "sst2", "lion", 3e-5, 0,
                    tmp_path, ModelConfig(), None)
    assert (asked[0].lm_coef, asked[0].optim.name, asked[0].optim.weight_decay) == (0.25, "lion", 0.1)


def test_a_bench_or_unigram_kept_under_another_set_is_refused(tmp_path, monkeypatch):
    """The bench columns and the unigram loss are measured once per study and kept: measured for another model or
    data shape, they would fill this study's columns."""
    from gpt1_jax.errors import ConfigError

    monkeypatch.setattr(rs.bench, "run", lambda config, **kw: {"step_s_median": 0.01, "tokens_per_s": 1.0, "mfu": 0.0,
                                                               "cpu_flags": ["avx"]})
    budget = dict(rs.PRETRAIN["quick"], source="default", sets=("model.n_layers=1",))
    assert rs.bench_optimizer(tmp_path, budget, "adamw", 512)["sets"] == ["model.n_layers=1"]
    assert rs.bench_optimizer(tmp_path, budget, "adamw", 512)["sets"] == ["model.n_layers=1"]  # found, kept
    with pytest.raises(ConfigError, match=r"bench/adamw.json: measured with --set model.n_layers=1, and this "
                                          r"study's is \(none\)"):
        rs.bench_optimizer(tmp_path, dict(budget, sets=()), "adamw", 512)
    (tmp_path / tb.UNIGRAM).write_text(json.dumps({"unigram_loss": 6.5}))  # kept before --set existed
    assert rs.measure_unigram(tmp_path, dict(budget, sets=()), "train", None, None) == 6.5
    with pytest.raises(ConfigError, match="unigram.json: measured with --set \\(none\\)"):
        rs.measure_unigram(tmp_path, budget, "train", None, None)
