"""experiments/bench/op_profile.py: the arithmetic of its per-op breakdown on known inputs (time slicing of
overlapping thunks, the pairing of a thunk with its "end:" event and the stale ones left out, the grouping of HLO by
jaxpr path), and
one real profile of the tiny model's step whose groups cover it."""

import gzip
import json

import pytest

from experiments.bench import op_profile

US = 1e-6


def test_overlapping_thunks_share_the_time_they_run_together():
    # a: 0-10, b: 5-15 (overlap 5-10), c: 20-30 alone. Busy 25; a = 5 + 2.5, b = 2.5 + 5, c = 10.
    thunks = [{"op": "a", "ts": 0, "dur": 10}, {"op": "b", "ts": 5, "dur": 10}, {"op": "c", "ts": 20, "dur": 10}]
    shares, busy = op_profile.time_sliced(thunks)
    assert shares == pytest.approx([7.5 * US, 7.5 * US, 10 * US])
    assert busy == pytest.approx(25 * US)
    summary = op_profile.summarize(thunks, {"a": "layer_norm", "b": "gelu", "c": "layer_norm"}, steps=1, wall_s=40 * US)
    assert summary["groups"]["layer_norm"]["seconds"] == pytest.approx(17.5 * US, abs=1e-4)
    assert summary["groups"]["layer_norm"]["thunks"] == 2 and summary["thunks_per_step"] == 3
    assert summary["idle_s"] == pytest.approx(15 * US, abs=1e-4)


def test_an_asynchronous_thunk_runs_until_its_end_event(tmp_path):
    # The runtime logs a short event when it launches "fusion.1" and "end: fusion.1" when its work is done;
    # "dot.2" is synchronous. Events of other kinds (python, thread-pool markers) are not thunks.
    events = [
        {"ph": "X", "name": "fusion.1", "ts": 100, "dur": 2, "tid": 1, "args": {"hlo_op": "fusion.1"}},
        {"ph": "X", "name": "dot.2", "ts": 103, "dur": 40, "tid": 1, "args": {"hlo_op": "dot.2"}},
        {"ph": "X", "name": "end: fusion.1", "ts": 150, "dur": 1, "tid": 2, "args": {}},
        {"ph": "X", "name": "$python.py:1 f", "ts": 0, "dur": 500, "tid": 3, "args": {}},
    ]
    folder = tmp_path / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    with gzip.open(folder / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    thunks = op_profile.read_trace(tmp_path)
    assert [(t["op"], t["dur"]) for t in thunks] == [("fusion.1", 51), ("dot.2", 40)]
    with pytest.raises(FileNotFoundError, match="no perfetto_trace.json.gz"):
        op_profile.read_trace(tmp_path / "plugins" / "elsewhere")


def test_an_end_event_logged_after_a_long_product_on_its_thread_is_stale(tmp_path):
    # "fusion.1" runs 4 us on thread 1 and queues a share of its work; thread 2 is inside a 100 us product, and its
    # "end: fusion.1" comes after that: the launching thread had done the work ("fusion.3", its user, starts at
    # 105). "fusion.2"'s share ran on thread 2, free in the 6 us before its "end:": its span runs to that event.
    events = [
        {"ph": "X", "name": "fusion.1", "ts": 100, "dur": 4, "tid": 1, "args": {"hlo_op": "fusion.1"}},
        {"ph": "X", "name": "ynn_fusion.9", "ts": 101, "dur": 100, "tid": 2, "args": {"hlo_op": "ynn_fusion.9"}},
        {"ph": "X", "name": "fusion.3", "ts": 105, "dur": 90, "tid": 1, "args": {"hlo_op": "fusion.3"}},
        {"ph": "X", "name": "end: fusion.1", "ts": 202, "dur": 0, "tid": 2, "args": {}},
        {"ph": "X", "name": "fusion.2", "ts": 203, "dur": 5, "tid": 1, "args": {"hlo_op": "fusion.2"}},
        {"ph": "X", "name": "end: fusion.2", "ts": 209, "dur": 0, "tid": 2, "args": {}},
    ]
    folder = tmp_path / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    with gzip.open(folder / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    spans = {t["op"]: t["dur"] for t in op_profile.read_trace(tmp_path, frozenset({"fusion.1", "fusion.2"}))}
    assert spans == {"fusion.1": 4, "ynn_fusion.9": 100, "fusion.3": 90, "fusion.2": 6}
    # A thunk XLA does not split (an Eigen dot: its work runs on the pool after a short launch) keeps its "end:".
    assert {t["op"]: t["dur"] for t in op_profile.read_trace(tmp_path)}["fusion.1"] == 102
    hlo = ('  %fusion.1 = f32[8]{0} fusion(%p), kind=kLoop, calls=%c, backend_config={"outer_dimension_partitions":["2"]}\n'
           "  %dot.4 = f32[8,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n")
    assert op_profile.split_thunks(hlo) == {"fusion.1"}


def test_thread_busy_time_counts_nested_events_once():
    thunks = [{"ts": 0, "dur": 10, "tid": 1}, {"ts": 2, "dur": 3, "tid": 1},  # a while thunk and one inside it
              {"ts": 20, "dur": 5, "tid": 1}, {"ts": 0, "dur": 50, "tid": 2}]
    busy = op_profile._ThreadBusy(thunks)
    assert busy.within(1, 0, 30) == 15 and busy.within(1, 5, 22) == 7 and busy.within(1, 11, 19) == 0
    assert busy.within(2, 10, 20) == 10 and busy.within(3, 0, 100) == 0


HLO = """HloModule step

%fused_softmax (p0: f32[2,4,4]) -> f32[2,4,4] {
  %p0 = f32[2,4,4]{2,1,0} parameter(0)
  ROOT %exp.1 = f32[2,4,4]{2,1,0} exponential(%p0), metadata={op_name="jit(step)/jvp(GPT1)/h_0/attn/exp"}
}

%fused_head (p0: f32[8,16], p1: f32[32,16]) -> f32[8,32] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[32,16]{1,0} parameter(1)
  ROOT %dot.3 = f32[8,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={1}, metadata={op_name="jit(step)/jvp(GPT1.logits)/tokens_embed.attend/dot_general"}
}

%fused_scores (p0: f32[2,4,8], p1: f32[2,8,4]) -> f32[2,4,4] {
  %p0 = f32[2,4,8]{2,1,0} parameter(0)
  %p1 = f32[2,8,4]{2,1,0} parameter(1)
  ROOT %dot.5 = f32[2,4,4]{2,1,0} dot(%p0, %p1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

ENTRY %main.1 (a: f32[2,4,4], x: f32[8,16], e: f32[32,16], w: f32[16]) -> f32[8,32] {
  %a = f32[2,4,4]{2,1,0} parameter(0)
  %x = f32[8,16]{1,0} parameter(1)
  %e = f32[32,16]{1,0} parameter(2)
  %w = f32[16]{0} parameter(3)
  %softmax_fusion = f32[2,4,4]{2,1,0} fusion(%a), kind=kLoop, calls=%fused_softmax, metadata={op_name="jit(step)/jvp(GPT1)/h_0/attn/exp"}
  %head_fusion = f32[8,32]{1,0} fusion(%x, %e), kind=kCustom, calls=%fused_head
  %scores_fusion = f32[2,4,4]{2,1,0} fusion(%a, %a), kind=kCustom, calls=%fused_scores
  %rsqrt.1 = f32[16]{0} rsqrt(%w), metadata={op_name="jit(step)/jvp(GPT1)/h_0/ln_1/rsqrt"}
  %update.1 = f32[16]{0} subtract(%w, %rsqrt.1), metadata={op_name="jit(step)/sub"}
  %copy.1 = f32[32,16]{0,1} copy(%e)
  ROOT %dot.4 = f32[8,32]{1,0} dot(%x, %e), lhs_contracting_dims={1}, rhs_contracting_dims={1}, metadata={op_name="jit(step)/transpose(jvp(GPT1))/h_0/mlp/c_fc/btd,df->btf/dot_general"}
}
"""


def test_thunks_are_grouped_by_what_their_hlo_computes():
    # The names come from the metadata of the thunk or of what it calls; a batched dot without any
    # (a fusion of the attention core's product at low optimisation levels) is the attention's.
    groups = op_profile.thunk_groups(HLO)
    assert {name: groups[name] for name in ("softmax_fusion", "head_fusion", "scores_fusion", "rsqrt.1", "update.1", "copy.1", "dot.4")} == {
        "softmax_fusion": "attention_softmax", "head_fusion": "matmul_lm_head",
        "scores_fusion": "matmul_attention", "rsqrt.1": "layer_norm",
        "update.1": "optimizer", "copy.1": "copy_transpose_convert", "dot.4": "matmul_projection"}


def test_each_product_is_known_by_its_thunk_shapes_and_flops():
    # A dot at the top level runs as its own thunk (XLA:CPU gives those to Eigen); a fusion that calls one is
    # named by its own kind. FLOPs: 2 x the result's elements x the contracted length.
    known = op_profile.products(HLO)
    assert set(known) == {"head_fusion", "scores_fusion", "dot.4"}
    assert known["dot.4"] == op_profile.Product("dot", (8, 16), (32, 16), (8, 32), 2 * 8 * 32 * 16)
    assert known["head_fusion"] == op_profile.Product("head_fusion", (8, 16), (32, 16), (8, 32), 2 * 8 * 32 * 16)
    assert known["scores_fusion"].flops == 2 * (2 * 4 * 4) * 8
    # Two steps: dot.4 twice (10 us alone, then 20 us beside the softmax), the softmax once; per step.
    thunks = [{"op": "dot.4", "ts": 0, "dur": 10}, {"op": "dot.4", "ts": 100, "dur": 20},
              {"op": "softmax_fusion", "ts": 100, "dur": 20}]
    [row] = op_profile.product_rows(thunks, known, steps=2)
    assert (row["product"], row["lhs"], row["out"], row["per_step"]) == ("dot", [8, 16], [8, 32], 1.0)
    assert row["span_s"] == pytest.approx(15 * US, abs=1e-4) and row["seconds"] == pytest.approx(10 * US, abs=1e-4)
    assert row["gflop_per_s_in_span"] == round(2 * 8192 / 30e-6 / 1e9)


def test_the_tiny_step_profile_covers_the_step(capsys):
    # In-process: the test process's 8 fake devices take the batch data-parallel.
    assert op_profile.main(["--config", "tiny", "--batch", "8", "--seq", "32", "--steps", "2", "--products"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    summary, rows = lines[-1], {row["group"]: row for row in lines[:-1] if "group" in row}
    # --products: every product thunk of the matmul groups, once
    products = [row for row in lines[:-1] if "product" in row]
    matmul_thunks = sum(r["thunks"] for g, r in rows.items() if g.startswith("matmul_"))
    assert products and sum(p["per_step"] for p in products) == pytest.approx(matmul_thunks, abs=0.5)
    assert all(p["gflop"] > 0 for p in products) and sum(p["span_s"] for p in products) > 0
    assert summary["summary"] and summary["thunks_per_step"] == pytest.approx(sum(r["thunks"] for r in rows.values()), abs=0.5)
    assert {"matmul_lm_head", "matmul_attention", "matmul_projection", "layer_norm", "gelu", "cross_entropy",
            "optimizer", "dropout_bits", "attention_softmax"} <= set(rows)
    # The groups' seconds add up to the busy time, which the wall clock bounds; little is left unnamed.
    assert sum(r["seconds"] for r in rows.values()) == pytest.approx(summary["busy_s"], rel=0.02, abs=2e-3)
    assert 0 < summary["busy_s"] <= summary["step_s"] * 1.05
    assert rows.get("other", {"share": 0})["share"] < 0.1
    assert summary["temp_bytes"] > 0 and summary["minor_faults_per_step"] >= 0 and summary["cpu_flags"]


def test_bad_options_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        op_profile.main(["--config", "tiny", "--steps", "0"])
    assert exit_.value.code == 2 and "--devices and --steps must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        op_profile.main(["--config", "no-such-preset"])
    assert exit_.value.code == 2


def test_the_bench_scripts_refuse_what_they_cannot_measure_before_measuring(tmp_path, monkeypatch, capsys):
    """A traceback after the expensive part (StatisticsError at --steps 0 once HF had run 40 s; KeyError for an
    unknown shape; the trace folder found missing after the traced steps), and checkpoint_integrity deleting the
    --dir it was given, whatever it held."""
    from experiments.bench import checkpoint_integrity, compare_hf, op_profile, stats_overhead

    for main, argv, line in (
            (compare_hf.main, ["--steps", "0"], "argument --steps: must be >= 1, got 0"),
            (compare_hf.main, ["--targets", "train_small", "--dtypes", "float16"], "--dtypes float16: none of the targets"),
            (stats_overhead.main, ["--shapes", "nosuch"], "unknown shape(s) ['nosuch']"),
            (stats_overhead.main, ["--every", "0"], "argument --every: must be >= 1, got 0"),
            (op_profile.main, ["--trace-dir", str(tmp_path / "file" / "sub")], "--trace-dir")):
        if "file" in argv[-1]:
            (tmp_path / "file").write_text("a file, not a folder")
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and line in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("precious")
    monkeypatch.setattr("sys.argv", ["checkpoint_integrity", "--dir", str(tmp_path / "run")])
    with pytest.raises(SystemExit) as e:
        checkpoint_integrity.main()
    assert e.value.code == 2 and "is not a new or empty folder" in capsys.readouterr().err
    assert (tmp_path / "run" / "notes.txt").read_text() == "precious"
