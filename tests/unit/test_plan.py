"""Pod plans' HLO reading, without compiling: collectives counted in loops with their ring bytes, across
slices over DCN, megascale transfers, replica-group spellings, replicated tensors. Plans compiled by the TPU compiler:
tests/e2e/test_plan.py."""

import jax
import pytest

from gpt1_jax import plan
from gpt1_jax.config import MeshConfig, OptimConfig, model_preset
from gpt1_jax.step import lm_trainer


pytest.importorskip("libtpu", reason="the TPU compiler is not installed: pip install -e \".[tpu]\"")


class _Chip:
    def __init__(self, slice_index=0):
        self.slice_index = slice_index


HLO = """\
%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %ar = f32[8]{0} all-reduce(%x), channel_id=1, replica_groups=[2,2]<=[4], use_global_device_ids=true, to_apply=%add
}

%cond (p: (s32[], f32[8])) -> pred[] {
  %c = s32[]{:T(128)} constant(12)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: bf16[16,4]) -> f32[8] {
  %ag = bf16[16,4]{1,0} all-gather(%a), channel_id=2, replica_groups=mesh['axis_0'=2,'axis_1'=2], device_ids=([2,2]T(1,0)) {'axis_0'}, dimensions={0}
  %rs = f32[2]{0} reduce-scatter(%b), channel_id=3, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
  %w = (s32[], f32[8]) while(%t), condition=%cond, body=%body
}
"""


def test_collectives_count_loops_and_ring_bytes():
    out = plan.collectives(HLO, [_Chip()] * 4)
    # the all-reduce runs 12 times (the loop bound), groups of 2: 2*(2-1)/2 * 32 bytes each time
    assert out["all-reduce"]["count"] == 12 and out["all-reduce"]["ici_bytes_per_chip"] == 12 * 32.0
    # gathered bf16[16,4] = 128 bytes over groups of 2: half of it sent
    assert out["all-gather"]["count"] == 1 and out["all-gather"]["ici_bytes_per_chip"] == 64.0
    # a reduce-scatter whose shard is 8 bytes over 4 devices sends 3 shards
    assert out["reduce-scatter"]["ici_bytes_per_chip"] == 24.0


def test_collectives_across_slices_go_over_dcn():
    out = plan.collectives(HLO, [_Chip(0), _Chip(0), _Chip(1), _Chip(1)])
    # {0,1,2,3} spans both slices: ICI within each pair, the cross-slice share over DCN
    rs = out["reduce-scatter"]
    assert rs["dcn_bytes_per_chip"] > 0 and rs["ici_bytes_per_chip"] == 8.0
    # the mesh spelling's groups ({0,1}, {2,3}: axis_0 of the transposed ids) stay within a slice
    assert out["all-gather"]["dcn_bytes_per_chip"] == 0 and out["all-gather"]["ici_bytes_per_chip"] == 64.0


def test_megascale_transfers_count_as_dcn_collectives():
    line = ('ENTRY %main () -> () {\n  %send.3 = (f32[8,8,128]{2,1,0}, u32[], token[]) send(%f, %a), channel_id=9, '
            'is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",'
            '_xla_megascale_reduce_operation="SUM",_xla_megascale_transfer_type="ALL_REDUCE"}\n}\n')
    out = plan.collectives(line, [_Chip(0), _Chip(1)])
    # 32 KiB all-reduced over 2 slices: each chip sends half of it twice, over DCN
    assert out == {"all-reduce": {"count": 1, "ici_bytes_per_chip": 0.0, "dcn_bytes_per_chip": 32768.0}}


def test_groups_spellings():
    assert plan._groups("replica_groups=[2,2]<=[4]", 4).tolist() == [[0, 1], [2, 3]]
    assert plan._groups("replica_groups=[2,2]<=[2,2]T(1,0)", 4).tolist() == [[0, 2], [1, 3]]
    assert plan._groups("replica_groups={{0,3},{1,2}}, x", 4).tolist() == [[0, 3], [1, 2]]
    assert plan._groups("replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_1'}, x", 4).tolist() == [[0, 1], [2, 3]]
    assert plan._groups("replica_groups={}, x", 4).tolist() == [[0, 1, 2, 3]]


def test_only_a_mesh_of_several_chips_lists_replicated_tensors(monkeypatch):
    """On one chip (a single GPU's plan) nothing could be split, so nothing is a lever left unpulled."""
    monkeypatch.setattr(plan, "REPLICATED_LIMIT_BYTES", 0)  # every state tensor counts

    def replicated(n: int) -> list:
        return plan._replicated(lm_trainer(model_preset("tiny"), OptimConfig(), MeshConfig(), devices=jax.devices()[:n]))

    assert replicated(1) == []
    two = replicated(2)  # data-parallel: every tensor is whole on both
    assert any(r["tensor"] == ".params['tokens_embed']['embedding']" for r in two)


def test_a_gpu_plan_that_misses_names_the_allocator_fraction(monkeypatch):
    """A visible GPU's capacity is JAX's allocator limit (75% of the card by default): the one-line error says
    how to raise it, and only there."""
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    gpu = {"topology": "visible:1xNVIDIA H100 80GB HBM3", "chip": "NVIDIA H100 80GB HBM3", "mesh": {"data": 1},
           "remat": "none", "per_chip_batch": 64, "accum_steps": 1, "state_dtype": "float32", "peak_bytes_per_chip": 70e9,
           "hbm_bytes_per_chip": 63.76e9, "margin_bytes": 63.76e9 - 70e9}
    line = plan.shortfall_message(gpu)
    assert line.startswith("plan does not fit: 70.00 GB per chip > 63.76 GB HBM of NVIDIA H100 80GB HBM3 (short by 6.24 GB)")
    assert "--set model.remat=attention, dots or full" in line
    assert "a smaller micro-batch per chip (--set accum_steps=K" in line
    # already one example at a time (64 micro-batches): no such hint; nor bf16 state where it narrows nothing
    assert "micro-batch" not in plan.shortfall_message({**gpu, "accum_steps": 64})
    assert "state_dtype" in line and "state_dtype" not in plan.shortfall_message({**gpu, "narrows_state": False})
    assert line.endswith("--mesh auto, XLA_PYTHON_CLIENT_MEM_FRACTION=.95 (JAX takes 75% of a GPU unless told)")
    tpu = {**gpu, "topology": "v5e:2x2", "chip": "TPU v5 lite"}
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in plan.shortfall_message(tpu)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")  # already raised: nothing to add
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in plan.shortfall_message(gpu)


def test_the_table_gives_the_flags_that_run_the_plan_in_pretrain():
    """`--mesh auto` picks a remat with the mesh (1.3B on v4-32: dots); the table's paste-able line gave the mesh
    alone, and pretrain would have run remat none, which no compiled plan said fits."""
    record = {"mesh": {"data": 1, "fsdp": 16, "tensor": 1}, "dcn": {"data": 2, "fsdp": 1, "tensor": 1},
              "remat": "dots", "accum_steps": 2}
    assert plan._as_flags(record) == "--mesh data=1,fsdp=16,tensor=1,dcn_data=2 --set model.remat=dots --set accum_steps=2"
    assert plan._as_flags({**record, "remat": "none", "accum_steps": 1, "dcn": {"data": 1}}) == \
        "--mesh data=1,fsdp=16,tensor=1"


def test_a_plan_names_the_cpu_that_compiled_it():
    """A plan's compile_s (and plan_table's wall_s) are the host CPU's times, but its record had no cpu_flags, which
    every other speed record of the project carries (gpt1_jax/bench.py, sizing.py)."""
    from gpt1_jax.config import PretrainConfig, resolve
    from gpt1_jax.flops import cpu_flags

    result = plan.compile_plan(resolve(PretrainConfig, "tiny"), plan.target(None))
    assert result["compile_s"] > 0 and result["cpu_flags"] == cpu_flags()
    # its table called this CPU's devices chips, with "HBM per chip" (they are CPU devices, with the host's memory)
    table = plan.table(result)
    assert "chip" not in table and "HBM" not in table, table
    assert "memory per device" in table and "sequences per device" in table and "FLOPs per device" in table


def test_plan_table_refuses_a_config_it_does_not_plan(monkeypatch, capsys):
    """`plan_table --only nope` planned no cell and rewrote the table without a word."""
    from experiments.scale import plan_table

    monkeypatch.setattr(plan_table, "write_table", lambda: pytest.fail("the table was rewritten"))
    monkeypatch.setattr("sys.argv", ["plan_table.py", "--only", "nope"])
    with pytest.raises(SystemExit) as e:
        plan_table.main()
    assert e.value.code == 2 and "argument --only: invalid choice: 'nope'" in capsys.readouterr().err


def test_auto_on_this_cpu_counts_devices_not_chips():
    """Batch 3 on the 8 CPU devices: no mesh splits it, and the line said "no ... mesh of 8 chips"."""
    from gpt1_jax.config import PretrainConfig, resolve
    from gpt1_jax.errors import ConfigError

    config = resolve(PretrainConfig, "tiny", overrides=["data.global_batch_size=3"])
    with pytest.raises(ConfigError, match=r"^--mesh auto: no data x fsdp x tensor mesh of 8 devices splits the batch 3 "):
        plan.auto(config, plan.target(None))


def test_auto_skips_meshes_whose_tensor_or_fsdp_does_not_divide_the_model():
    """tiny (4 heads, d_model 64) on 8 chips: tensor=8 leaves the heads unsplit and the Trainer refuses it, so the
    search ranks only meshes the Trainer takes; the rules it is given decide (heads whole: tensor=8 comes back)."""
    from gpt1_jax.config import PretrainConfig, resolve

    config = resolve(PretrainConfig, "tiny")
    meshes = {(m.data, m.fsdp, m.tensor) for m, _ in plan.candidates(config, 8)}
    assert {(2, 1, 4), (1, 2, 4), (8, 1, 1), (1, 8, 1)} <= meshes and not any(t == 8 for _, _, t in meshes)
    told = resolve(PretrainConfig, "tiny", overrides=["mesh.rules={heads: null}"])
    assert (1, 1, 8) in {(m.data, m.fsdp, m.tensor) for m, _ in plan.candidates(told, 8)}
    # d_model over fsdp, which the search did not check before the Trainer refused it (it checked heads and d_mlp)
    narrow = resolve(PretrainConfig, "tiny", overrides=["model.d_model=36"])
    meshes = {(m.data, m.fsdp, m.tensor) for m, _ in plan.candidates(narrow, 8)}
    assert (1, 4, 2) in meshes and (1, 8, 1) not in meshes


def test_the_analytic_hbm_term_comes_from_the_committed_plans_and_ranks_each_probed_pod_as_compiled():
    """`--mesh auto` ranked without any HBM term: on a v6e-256 the 350M model's candidates with tensor=4 all tied
    at >= 3.20 ms, and the two it compiled came to 15.5 ms, where 8 x 16 x 2 compiles to 13.3. The term's
    coefficients are a fit to the committed plans (experiments/scale/hbm_fit.py), every plan's compiled HBM bytes
    lie within 2x of it (within 0.59-1.26x when it was fitted), and in each probed pod the analytic top two hold a
    mesh within 2% of the compiled best."""
    from experiments.scale import hbm_fit

    plans = hbm_fit.load()
    assert len(plans) >= 60
    predicted = hbm_fit.features(plans) @ [plan.HBM_BYTES_PER[k] for k in hbm_fit.TERMS]
    for (name, _, r), p in zip(plans, predicted):
        assert 0.5 < p / r["xla_bytes_accessed_per_chip"] < 2, name
    probed = hbm_fit.probed_pods(plans)
    pods = hbm_fit.rankings(plans, {"with": dict.fromkeys(probed, plan.HBM_BYTES_PER),
                                    "without": dict.fromkeys(probed, dict.fromkeys(hbm_fit.TERMS, 0.0))})
    assert len(pods) == 3
    for pod, rows in pods.items():
        best = rows[0]["compiled_ms"]
        top_two = sorted(rows, key=lambda r: (r["analytic_ms (with)"], r["remat"] != "none"))[:2]
        assert min(r["compiled_ms"] for r in top_two) <= 1.02 * best, (pod, top_two)
    # without the term, its ties broken as the search breaks them (no remat first, then the narrowest tensor axis)
    old = sorted(pods["gpt1-350m__b256__v6e-256"], key=lambda r: (r["analytic_ms (without)"], r["remat"] != "none",
                                                                   int(r["mesh"].split("x")[2])))
    assert min(r["compiled_ms"] for r in old[:2]) > 1.15 * pods["gpt1-350m__b256__v6e-256"][0]["compiled_ms"]


def _fake_compile_plan(fits_from: int, tried: list):
    """plan.compile_plan without a compiler: the `fits_from`-th call (from 1) and those after it fit."""
    def compile_plan(config, where):
        tried.append((config.mesh, config.model.remat))
        mesh = {"data": config.mesh.data, "fsdp": config.mesh.fsdp, "tensor": config.mesh.tensor}
        return {"fits": len(tried) >= fits_from, "mesh": mesh, "remat": config.model.remat, "peak_bytes_per_chip": 1,
                "estimate": {"step_s_lower_bound": 1.0}}
    return compile_plan


@pytest.mark.parametrize("fits_from", [1, 6])
def test_mesh_auto_numbers_its_compiles(monkeypatch, fits_from):
    """--mesh auto compiled 6 candidates (9-17 s each for small on v5e:2x4) with a line each but no count: each line
    says which of how many; a candidate that does not fit adds more, and the lines beyond the count say why."""
    from gpt1_jax.config import PretrainConfig, resolve

    tried, said = [], []
    monkeypatch.setattr(plan, "compile_plan", _fake_compile_plan(fits_from, tried))
    plan.auto(resolve(PretrainConfig, "tiny"), plan.target(None), progress=said.append)
    planned = int(said[0].split()[1].split("/")[1])
    assert len(said) == len(tried) and (len(tried) == planned) == (fits_from == 1) and planned > 1
    for n, ((mesh, remat), line) in enumerate(zip(tried, said), 1):
        assert line == (f"compiling {n}/{max(n, planned)} data={mesh.data},fsdp={mesh.fsdp},tensor={mesh.tensor} "
                        f"remat={remat}" + (" (an earlier one did not fit)" if n > planned else ""))


def test_plan_table_shows_what_each_cell_compiles_as_it_goes(monkeypatch, capsys, tmp_path):
    """A cell's `gpt1-jax plan` ran with its stderr captured: 20-100 s of silence after the cell's title. Its status
    lines (and the package's warnings) now come through under the title, its JSON still read from its stdout; its
    table and libtpu's logging stay out, kept for the error of a cell that fails."""
    from experiments.scale import plan_table

    child = tmp_path / "child"  # stands in for `python -m gpt1_jax.cli plan ...`
    child.write_text("#!/bin/sh\necho 'plan: compiling 1/2 data=1,fsdp=4,tensor=4 remat=none' >&2\n"
                     "echo 'I1129 libtpu noise' >&2\necho 'target  v4:2x2x4' >&2\n"
                     "echo '{\"fits\": true, \"mesh\": {\"data\": 1}}'\n"
                     "echo 'plan: compiling 2/2 data=4,fsdp=4,tensor=1 remat=none' >&2\n")
    child.chmod(0o755)
    monkeypatch.setattr(plan_table.sys, "executable", str(child))
    result = plan_table.run_plan("gpt1", 64, "v4-32", "auto", [])
    assert result["fits"] is True and result["mesh"] == {"data": 1} and result["argv"][:2] == ["gpt1_jax.cli", "plan"]
    assert capsys.readouterr().err == ("    plan: compiling 1/2 data=1,fsdp=4,tensor=4 remat=none\n"
                                       "    plan: compiling 2/2 data=4,fsdp=4,tensor=1 remat=none\n")
    child.write_text("#!/bin/sh\necho 'plan: compiling the train step' >&2\n"
                     "echo 'gpt1-jax plan: error: short by 2 GB' >&2\nexit 2\n")
    assert plan_table.run_plan("gpt1", 64, "v4-32", "auto", [])["error"] == "gpt1-jax plan: error: short by 2 GB"
    assert capsys.readouterr().err == "    plan: compiling the train step\n"  # the error: in the cell's line
