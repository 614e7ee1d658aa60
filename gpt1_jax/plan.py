"""Pod plans: the real pre-training step compiled for a TPU topology from any machine, sized against the
chip's HBM, its collectives read from the compiled program, and a roofline step time (`gpt1-jax plan`).

One code path for "size it" and "run it": the Trainer, the logical-axis rules and `sizing.size_step`
are the ones `pretrain` uses; only the devices differ (`topology.tpu_devices`, or the visible ones).

The estimate is a lower bound, stated as such: compute = the compiled program's FLOPs per chip / the
chip's bf16 peak; collectives = bytes each chip sends (ring algorithms, from the HLO's collectives and
their replica groups) / the chip's ICI bandwidth, the part of a group that spans slices / DCN bandwidth;
step >= max(compute, collectives) (perfect overlap). Real steps are slower; the MFU it implies is an
upper bound. Peaks and bandwidths: gpt1_jax/flops.py, gpt1_jax/topology.py, docs/scale.md.

`--mesh auto` ranks every data x fsdp x tensor factorisation (with remat none/dots/full) analytically
(state bytes from the shardings, an activation estimate, the same roofline with an HBM term fitted to compiled
plans), then compiles only the best few and keeps the best that the compiler says fits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import time
from typing import Any, Sequence

import jax
import numpy as np

from gpt1_jax import flops, sizing, topology
from gpt1_jax.attention import model_impl
from gpt1_jax.config import MeshConfig, PretrainConfig
from gpt1_jax.errors import ConfigError, PlanDoesNotFit
from gpt1_jax.hlo import runs_per_step
from gpt1_jax.optim import optimizer_state_bytes
from gpt1_jax.step import check_mesh_divides, lm_batch_spec, lm_trainer

GB = 1e9
# Hardware FLOPs per model FLOP by remat policy: full recomputes each block's forward (+1/3); dots keeps the
# matmul outputs and recomputes only elementwise work, which the model count leaves out anyway.
_REMAT_FLOPS = {"none": 1.0, "dots": 1.0, "full": 4 / 3, "attention": 1.0}  # attention: a QK^T more, in XLA's count
REPLICATED_LIMIT_BYTES = 8 << 20  # a replicated tensor above this, per chip, is listed as a lever left unpulled


# ---- collectives of a compiled program ------------------------------------------------------------

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_OP = re.compile(r"= (?P<shape>.*?) (?P<op>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\((?P<rest>.*)$")
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|f8e\w+|c64|c128)\[([\d,]*)\]")
# Across slices (multi-slice over DCN) XLA emits host transfers to the Megascale runtime, not collectives.
_MEGASCALE = re.compile(r"= (?P<shape>.*?) send\(.*_xla_megascale_transfer_type=\"(?P<kind>\w+)\"")
_BITS = {"pred": 8, "bf16": 16, "c64": 64, "c128": 128}


def _array_bytes(shape_text: str) -> list[int]:
    sizes = []
    for dtype, dims in _ARRAY.findall(shape_text):
        bits = _BITS.get(dtype) or int(re.sub(r"\D", "", dtype.split("e")[0]) or 8)
        sizes.append(math.prod(int(d) for d in dims.split(",") if d) * bits // 8)
    return sizes


def _iota(dims: list[int], perm: list[int] | None) -> np.ndarray:
    ids = np.arange(math.prod(dims)).reshape(dims)
    return (ids.transpose(perm) if perm else ids).reshape(-1)


def _groups(rest: str, n_devices: int) -> np.ndarray:
    """[groups, group size] device ids of a collective, from any of XLA's replica-group spellings."""
    pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", rest)
    if pairs:
        return np.array([[int(x) for x in p.split(",")] for p in re.findall(r"\{?(\d+,\d+)", pairs.group(1))])
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))? \{([^}]*)\}", rest)
    if mesh:
        names = re.findall(r"'(\w+)'=(\d+)", mesh.group(1))
        sizes = [int(s) for _, s in names]
        ids = _iota([int(d) for d in mesh.group(2).split(",")],
                    [int(p) for p in mesh.group(3).split(",")] if mesh.group(3) else None) \
            if mesh.group(2) else np.arange(math.prod(sizes))
        grid = ids.reshape(sizes)
        axes = [i for i, (name, _) in enumerate(names) if f"'{name}'" in mesh.group(4)]
        rest_axes = [i for i in range(len(sizes)) if i not in axes]
        size = math.prod(sizes[i] for i in axes)
        return grid.transpose(rest_axes + axes).reshape(-1, size)
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest)
    if iota:
        ids = _iota([int(d) for d in iota.group(3).split(",")],
                    [int(p) for p in iota.group(4).split(",")] if iota.group(4) else None)
        return ids.reshape(int(iota.group(1)), int(iota.group(2)))
    explicit = re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", rest)
    if explicit:
        groups = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", explicit.group(1))]
        if groups and all(len(g) == len(groups[0]) for g in groups) and groups[0]:
            return np.array(groups)
    return np.arange(n_devices).reshape(1, -1)  # replica_groups={} : every device


def _ring_bytes(op: str, result_bytes: int, n: int) -> float:
    """Bytes one chip sends for one collective over a group of n (bandwidth-optimal ring algorithms)."""
    if n <= 1:
        return 0.0
    return {"all-reduce": 2 * (n - 1) / n * result_bytes,
            "all-gather": (n - 1) / n * result_bytes,  # result = the gathered whole
            "reduce-scatter": (n - 1) * result_bytes,  # result = one shard
            "all-to-all": (n - 1) / n * result_bytes,
            "collective-permute": float(result_bytes)}[op]


def collectives(hlo_text: str, devices: Sequence[Any]) -> dict[str, dict[str, float]]:
    """Per collective kind: count per step, bytes each chip sends over ICI and over DCN per step.
    `devices` in the program's device-assignment order (a Mesh's `devices.flat`), for slice membership.

    A multi-slice program is one slice's program: its collectives stay within the slice (ICI), and what
    crosses slices is a Megascale host transfer (`send` with `_xla_megascale_transfer_type`), counted
    here as that collective over the slices, its bytes sent over DCN."""
    slices = np.array([getattr(d, "slice_index", 0) or 0 for d in devices])
    n_slices = len(set(slices.tolist()))
    if "_xla_megascale_transfer_type" in hlo_text:  # one slice's program: its groups never leave the slice
        slices = np.zeros_like(slices)
    runs, lines = runs_per_step(hlo_text)
    out: dict[str, dict[str, float]] = {}
    for computation, line in lines:
        if runs.get(computation, 0) == 0:
            continue
        dcn_op = _MEGASCALE.search(line)
        if dcn_op:
            op = dcn_op.group("kind").lower().replace("_", "-")
            sent = _ring_bytes(op, _array_bytes(dcn_op.group("shape"))[0], n_slices) \
                if op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all") else 0.0
            entry = out.setdefault(op, {"count": 0, "ici_bytes_per_chip": 0.0, "dcn_bytes_per_chip": 0.0})
            entry["count"] += runs[computation]
            entry["dcn_bytes_per_chip"] += sent * runs[computation]
            continue
        m = _OP.search(line)
        if not m:
            continue
        op, n_runs = m.group("op"), runs[computation]
        sizes = _array_bytes(m.group("shape"))
        result = max(sizes) if m.group("start") and op in ("all-gather", "collective-permute") else sum(sizes)
        groups = _groups(m.group("rest"), len(devices))
        n = groups.shape[1]
        spans = len(set(slices[groups[0] % len(slices)]))  # slices one group touches
        ici = _ring_bytes(op, result, n // spans) if spans > 1 else _ring_bytes(op, result, n)
        # Across slices: the hierarchical algorithm moves only each slice's share over DCN.
        dcn = _ring_bytes(op, result * spans // n, spans) if spans > 1 else 0.0
        entry = out.setdefault(op, {"count": 0, "ici_bytes_per_chip": 0.0, "dcn_bytes_per_chip": 0.0})
        entry["count"] += n_runs
        entry["ici_bytes_per_chip"] += ici * n_runs
        entry["dcn_bytes_per_chip"] += dcn * n_runs
    return out


# ---- one plan --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Target:
    """What the plan compiles for: a TPU topology (no chip needed) or the visible devices."""

    devices: tuple
    name: str
    num_slices: int = 1

    @property
    def chip(self) -> topology.Chip | None:
        return topology.chip_of(self.devices[0])

    @property
    def device_kind(self) -> str:
        return getattr(self.devices[0], "device_kind", "cpu")

    def peak_flops(self) -> float | None:
        return flops.accelerator_peak(self.device_kind)

    def hbm_bytes(self) -> int | None:
        """What one chip offers a program: the TPU compiler's own number, an attached device's allocator
        limit (a GPU), else the sheet's capacity."""
        usable = topology.usable_hbm_bytes(self.devices[0])
        if usable is not None:
            return usable
        if self.devices[0].platform == "gpu":
            stats = self.devices[0].memory_stats() or {}
            if "bytes_limit" in stats:
                return int(stats["bytes_limit"])
        return self.chip.hbm_bytes if self.chip is not None else None


def target(topology_name: str | None, num_slices: int = 1) -> Target:
    if topology_name:
        return Target(tuple(topology.tpu_devices(topology_name, num_slices)), topology_name, num_slices)
    if num_slices != 1:
        raise ConfigError("--num-slices needs --topology")
    return Target(tuple(jax.devices()), f"visible:{len(jax.devices())}x{jax.devices()[0].device_kind}")


def with_slices(mesh: MeshConfig, num_slices: int) -> MeshConfig:
    """Multi-slice: the data axis spans the slices (gradients cross DCN once per step) unless the mesh
    says otherwise."""
    if num_slices == 1 or math.prod((mesh.dcn_data, mesh.dcn_fsdp, mesh.dcn_tensor)) > 1:
        return mesh
    return dataclasses.replace(mesh, dcn_data=num_slices)


def on_target(config: PretrainConfig, where: Target) -> PretrainConfig:
    """`config` with `model.attention=auto` as `where`'s devices resolve it: traced as it is, the step would
    resolve it against this host's default backend, a CPU when the target is a TPU topology."""
    attention = model_impl(config.model, where.devices[0].platform)
    return dataclasses.replace(config, model=dataclasses.replace(config.model, attention=attention))


def compile_plan(config: PretrainConfig, where: Target) -> dict[str, Any]:
    """The plan of one mesh: compile `config`'s train step for `where` and read it (see module docstring)."""
    config = on_target(config, where)
    mesh_config = with_slices(config.mesh, where.num_slices)
    trainer = lm_trainer(config.model, config.optim, mesh_config, accum_steps=config.accum_steps, seed=config.seed,
                         devices=list(where.devices))
    mesh = trainer.mesh
    B, T = config.data.global_batch_size, config.data.seq_len
    try:
        with _no_persistent_cache():
            report, compiled = sizing.size_step(trainer, lm_batch_spec(B, T), config.model)
    except Exception as e:
        exhausted = topology.out_of_hbm(e)
        if exhausted is None:
            raise
        return _refused(config, where, mesh_config, mesh, trainer, *exhausted)
    comms = collectives(compiled.as_text(), list(mesh.devices.flat))
    plan = {
        "compiled": True, **_header(config, where, mesh_config, mesh, trainer),
        "compile_s": report["compile_s"], "lower_s": report["lower_s"],
        "peak_bytes_per_chip": report.get("peak_bytes_per_device"),
        "temp_bytes_per_chip": report.get("temp_bytes_per_device"),
        "xla_flops_per_chip": report.get("flops_per_device"),
        "xla_bytes_accessed_per_chip": report.get("bytes_accessed_per_device"),
        "loop_bodies_counted": report.get("loop_bodies_counted"),
        "collectives": comms,
    }
    plan.update(_fit(plan, where))
    once = plan["loop_bodies_counted"] == "once"  # a loop's body counted once: XLA's bytes are a bound L times too low
    plan["estimate"] = roofline(max(plan["xla_flops_per_chip"] or 0.0, plan["model_flops_per_chip"] * _REMAT_FLOPS[config.model.remat]),
                                plan["model_flops_per_chip"], None if once else plan["xla_bytes_accessed_per_chip"],
                                comms, where, B * T)
    return plan


def _header(config, where, mesh_config, mesh, trainer) -> dict[str, Any]:
    """What a plan says before the compiler speaks: target, mesh, model, batch, state and model FLOPs."""
    B, T = config.data.global_batch_size, config.data.seq_len
    return {
        "topology": where.name, "num_slices": where.num_slices, "chip": where.device_kind, "chips": len(where.devices),
        "mesh": dict(mesh.shape), "dcn": {a: getattr(mesh_config, f"dcn_{a}") for a in ("data", "fsdp", "tensor")},
        "remat": config.model.remat, "attention": config.model.attention, "dtype": config.model.dtype,
        "state_dtype": config.optim.state_dtype, "narrows_state": _narrows_state(config, trainer),
        "num_params": config.model.num_params(), "global_batch": B, "seq_len": T,
        "per_chip_batch": B / (mesh.shape["data"] * mesh.shape["fsdp"]), "accum_steps": config.accum_steps,
        "state_bytes_per_chip": sizing.state_bytes_per_device(trainer), **_state_split(trainer),
        "model_flops_per_chip": flops.flops_per_token(config.model, T) * B * T / len(where.devices),
        "replicated_over_limit": _replicated(trainer),
        "cpu_flags": flops.cpu_flags(),  # of the host that compiles: compile_s (and plan_table's wall_s) are its times
    }


def _refused(config, where, mesh_config, mesh, trainer, temporaries: int, available: int) -> dict[str, Any]:
    """The plan of a step the TPU compiler refused for lack of HBM: it stops before a full memory
    analysis, so the peak is its temporaries plus the state (a lower bound of the real peak)."""
    header = _header(config, where, mesh_config, mesh, trainer)
    peak = temporaries + header["state_bytes_per_chip"]
    return {
        "compiled": False, **header, "compile_s": None,
        "peak_bytes_per_chip": peak, "temp_bytes_per_chip": temporaries,
        "hbm_bytes_per_chip": available, "fits": False, "margin_bytes": available - peak,
        "collectives": {}, "estimate": {"step_s_lower_bound": None, "note": "the compiler refused: out of HBM"},
    }


@contextlib.contextmanager
def _no_persistent_cache():
    """A program compiled for a chip that is not attached cannot be loaded back from JAX's persistent
    cache (it needs that chip's client), so plans never write it: JAX decides once per process whether
    the cache is on, so the cache is switched off for a process whose first compilation is a plan, and
    otherwise nothing is slow enough to be written."""
    before = (jax.config.jax_enable_compilation_cache, jax.config.jax_persistent_cache_min_compile_time_secs)
    jax.config.update("jax_enable_compilation_cache", False)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])


def _narrows_state(config: PretrainConfig, trainer) -> bool:
    """Whether optim.state_dtype=bfloat16 would shrink this optimizer's state (schedule-free and Adafactor without
    momentum keep nothing it narrows: the hint would send a user to a lever that saves no byte)."""
    params = trainer.abstract_state_sharded().params
    return optimizer_state_bytes(dataclasses.replace(config.optim, state_dtype="bfloat16"), params) \
        < optimizer_state_bytes(dataclasses.replace(config.optim, state_dtype="float32"), params)


def _state_split(trainer) -> dict[str, int]:
    """Per-chip bytes of the parameters and of the optimizer state (the rest of the state is the step)."""
    return {"param_bytes_per_chip": sizing.state_bytes_per_device(trainer, "params"),
            "opt_state_bytes_per_chip": sizing.state_bytes_per_device(trainer, "opt_state")}


def _replicated(trainer) -> list[dict[str, Any]]:
    """State tensors held whole on every chip that are larger than REPLICATED_LIMIT_BYTES; none on one chip,
    where nothing could be split."""
    found = []
    if trainer.mesh.size == 1:
        return found
    for path, x in jax.tree_util.tree_flatten_with_path(trainer.abstract_state_sharded())[0]:
        nbytes = math.prod(x.shape) * x.dtype.itemsize
        if x.sharding.shard_shape(x.shape) == tuple(x.shape) and nbytes > REPLICATED_LIMIT_BYTES:
            found.append({"tensor": jax.tree_util.keystr(path), "shape": list(x.shape), "bytes": nbytes})
    return found


def _fit(plan: dict[str, Any], where: Target) -> dict[str, Any]:
    capacity, peak = where.hbm_bytes(), plan["peak_bytes_per_chip"]
    if capacity is None or peak is None:
        return {"hbm_bytes_per_chip": capacity, "fits": None, "margin_bytes": None}
    return {"hbm_bytes_per_chip": capacity, "fits": peak <= capacity, "margin_bytes": capacity - peak}


def roofline(flops_per_chip: float, model_flops_per_chip: float, hbm_bytes: float | None,
             comms: dict[str, dict[str, float]], where: Target, tokens_per_step: int) -> dict[str, Any]:
    """Lower bound of the step time and the MFU it implies (module docstring): the slowest of compute,
    HBM traffic (XLA's bytes accessed after fusion) and collectives, as if they overlapped perfectly.

    `flops_per_chip` is the larger of XLA's count (loop bodies counted per trip: gpt1_jax/hlo.py) and the model
    count times remat's recomputation. `hbm_bytes` is None where a loop's body could only be counted once: the
    memory term is then left out (reported as None), rather than be a bound L times too low."""
    peak, chip = where.peak_flops(), where.chip
    if peak is None or chip is None:
        return {"step_s_lower_bound": None, "note": f"no peak/bandwidth table entry for {where.device_kind}"}
    ici = sum(c["ici_bytes_per_chip"] for c in comms.values())
    dcn = sum(c["dcn_bytes_per_chip"] for c in comms.values())
    terms = {"compute": flops_per_chip / peak, "memory": None if hbm_bytes is None else hbm_bytes / chip.hbm_bytes_per_s,
             "collectives": ici / chip.ici_bytes_per_s + dcn / chip.dcn_bytes_per_s}
    known = {k: v for k, v in terms.items() if v is not None}
    bound = max(known, key=known.get)
    step_s = known[bound]
    return {
        "compute_s": terms["compute"], "memory_s": terms["memory"], "ici_s": ici / chip.ici_bytes_per_s,
        "dcn_s": dcn / chip.dcn_bytes_per_s, "step_s_lower_bound": step_s, "bound": bound,
        "mfu_upper_bound": model_flops_per_chip / (step_s * peak) if step_s else None,
        "tokens_per_s_upper_bound": tokens_per_step / step_s if step_s else None,
        "peak_flops_per_chip": peak, "ici_bytes_per_s": chip.ici_bytes_per_s, "dcn_bytes_per_s": chip.dcn_bytes_per_s,
    }


def shortfall_message(plan: dict[str, Any]) -> str:
    """One line: by how much a plan misses the chip's HBM, and what to change."""
    short = -plan["margin_bytes"] / GB
    mesh = ",".join(f"{k}={v}" for k, v in plan["mesh"].items())
    hints = []
    if plan["mesh"]["data"] > 1:
        hints.append("more fsdp (--mesh fsdp=N)")
    if plan["remat"] != "full":
        hints.append("--set model.remat=" + ("attention, dots or full" if plan["remat"] == "none" else "full"))
    if plan["per_chip_batch"] / plan["accum_steps"] > 1:  # the examples a chip's activations hold at once
        hints.append("a smaller micro-batch per chip (--set accum_steps=K runs each step as K of them; or a smaller "
                     "data.global_batch_size)")
    if plan["state_dtype"] != "bfloat16" and plan.get("narrows_state", True):
        hints.append("--set optim.state_dtype=bfloat16")
    hints.append("--mesh auto")
    if plan["topology"].startswith("visible:") and "NVIDIA" in plan["chip"] \
            and not os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"):
        # the "HBM" of a visible GPU is its allocator's limit, which JAX sets to 75% of the card by default
        hints.append("XLA_PYTHON_CLIENT_MEM_FRACTION=.95 (JAX takes 75% of a GPU unless told)")
    return (f"plan does not fit: {plan['peak_bytes_per_chip'] / GB:.2f} GB per chip > {plan['hbm_bytes_per_chip'] / GB:.2f} GB "
            f"HBM of {plan['chip']} (short by {short:.2f} GB) with mesh {mesh}, remat {plan['remat']}; try "
            + ", ".join(hints))


# ---- --mesh auto -----------------------------------------------------------------------------------

def _factorisations(n: int) -> list[tuple[int, int, int]]:
    return [(d, f, n // (d * f)) for d in range(1, n + 1) if n % d == 0
            for f in range(1, n // d + 1) if (n // d) % f == 0]


def candidates(config: PretrainConfig, n_chips: int, num_slices: int = 1) -> list[tuple[MeshConfig, str]]:
    """Every (mesh, remat) worth trying: the batch splits over data x fsdp (x accum), each mesh axis divides the
    parameter dimensions the rules split over it (as the Trainer requires), and the data axis spans the slices."""
    B = config.data.global_batch_size
    out = []
    for d, f, t in _factorisations(n_chips):
        if B % (d * f * config.accum_steps) or d % num_slices or not _divides(config, d, f, t):
            continue
        for remat in ("none", "dots", "full"):
            out.append((MeshConfig(data=d, fsdp=f, tensor=t, dcn_data=num_slices, rules=config.mesh.rules), remat))
    return out


def _divides(config: PretrainConfig, data: int, fsdp: int, tensor: int) -> bool:
    try:
        check_mesh_divides(config.model, config.mesh, {"data": data, "fsdp": fsdp, "tensor": tensor})
    except ConfigError:  # a mesh the Trainer refuses: skipped, not ranked
        return False
    return True


def activation_bytes(config: PretrainConfig, mesh: MeshConfig, remat: str) -> float:
    """A rough per-chip count of what the backward pass keeps (for ranking, never for the verdict):
    per block the residual-stream tensors, the MLP hidden and the attention probabilities and masks,
    plus the logits and their gradient."""
    m = config.model
    b = config.data.global_batch_size / (mesh.data * mesh.fsdp * config.accum_steps)
    T, D, F, H, L, V = config.data.seq_len, m.d_model, m.d_mlp, m.n_heads, m.n_layers, m.vocab_size
    act = 2 if m.dtype == "bfloat16" else 4
    t = mesh.tensor
    per_block = {"none": b * T * (10 * D + 3 * D / t + 2 * F / t) * act + b * (H / t) * T * T * (act + 2 + 4),
                 "dots": b * T * (4 * D + 3 * D / t + F / t) * act,
                 "full": b * T * D * act}[remat]
    one_block = b * T * (10 * D + 3 * D / t + 2 * F / t) * act + b * (H / t) * T * T * (act + 2 + 4)
    logits = 2 * b * T * V / t * 4
    return L * per_block + (one_block if remat != "none" else 0) + logits


# Bytes through a chip's HBM in one step, per unit of each term of `hbm_terms`: fitted to compiled TPU plans
# (bf16 compute, fp32 parameters and Adam state), `python -m experiments.scale.hbm_fit`, which prints how far
# each plan's compiled count lies from this (0.6-1.3x on 2026-11-29) and how each probed pod ranks its meshes.
# For ranking the candidates of one pod only; a plan's verdict is always the compiled program's own count.
HBM_BYTES_PER = {"state": 43.0, "gathered_weights": 43.0, "residual": 320.0, "attention_scores": 49.0,
                 "logits": 120.0}
# Activation traffic by remat policy, against none: the 1.3B levers' compiled bytes rose 5% (dots) and 12% (full).
_REMAT_TRAFFIC = {"none": 1.0, "dots": 1.1, "full": 1.2, "attention": 1.0}


def hbm_terms(config: PretrainConfig, mesh: MeshConfig, remat: str) -> dict[str, float]:
    """What one chip streams through HBM in a step, as counts that HBM_BYTES_PER turns into bytes: the optimizer
    on its shard of the parameters, the weights its tensor slice gathers (again for each micro-batch), and per
    token of its batch share the residual stream (whole on every chip), the attention scores and the logits (split
    over tensor)."""
    m = config.model
    d, f, t = mesh.data, mesh.fsdp, mesh.tensor
    tokens = config.data.global_batch_size / (d * f) * config.data.seq_len
    P = m.num_params() * np.dtype(m.param_dtype).itemsize / 4  # fitted on fp32 parameters
    act = np.dtype(m.dtype).itemsize / 2  # fitted on bf16 compute
    rf = _REMAT_TRAFFIC[remat] * act
    return {"state": P / (f * t), "gathered_weights": config.accum_steps * act * P / t,
            "residual": rf * m.n_layers * tokens * m.d_model,
            "attention_scores": rf * m.n_layers * tokens * (m.n_heads / t) * config.data.seq_len,
            "logits": tokens * m.vocab_size / t}


def analytic_estimate(config: PretrainConfig, mesh: MeshConfig, remat: str, where: Target,
                      state_bytes: int, hbm_bytes_per: dict[str, float] = HBM_BYTES_PER) -> dict[str, float]:
    """Roofline of a candidate without compiling: FLOPs (x4/3 for full remat's second forward), the HBM traffic
    `hbm_terms` estimates, and the collectives its axes imply (data: gradient all-reduce; fsdp: 2 parameter
    all-gathers + gradient reduce-scatter; tensor: 2 activation all-reduces per block each way)."""
    m, chip, peak = config.model, where.chip, where.peak_flops() or 1.0
    n = mesh.data * mesh.fsdp * mesh.tensor
    T, B = config.data.seq_len, config.data.global_batch_size
    model_flops = flops.flops_per_token(m, T) * B * T / n
    compute_s = model_flops * (4 / 3 if remat == "full" else 1.0) / peak
    P = m.num_params() * np.dtype(m.param_dtype).itemsize
    act = 2 if m.dtype == "bfloat16" else 4
    d, f, t = mesh.data, mesh.fsdp, mesh.tensor
    fsdp_bytes = (2 * (f - 1) / f * P / t * act / 4 + (f - 1) / f * P / t) if f > 1 else 0.0
    # The gradient all-reduce over data, hierarchical across s slices: within a slice over d/s chips
    # (ICI), then each chip's 1/(d/s) share across the slices (DCN).
    s = mesh.dcn_data
    d_ici = d // s
    grads = P / (f * t)
    data_ici_bytes = 2 * (d_ici - 1) / d_ici * grads if d_ici > 1 else 0.0
    data_dcn_bytes = 2 * (s - 1) / s * grads / d_ici if s > 1 else 0.0
    b = B / (d * f)
    tensor_bytes = 4 * m.n_layers * 2 * (t - 1) / t * b * T * m.d_model * act if t > 1 else 0.0
    ici_bw = chip.ici_bytes_per_s if chip else 1e11
    dcn_bw = chip.dcn_bytes_per_s if chip else 1e10
    comm_s = (fsdp_bytes + tensor_bytes + data_ici_bytes) / ici_bw + data_dcn_bytes / dcn_bw
    hbm_bytes = sum(hbm_bytes_per[k] * v for k, v in hbm_terms(config, mesh, remat).items())
    memory_s = hbm_bytes / chip.hbm_bytes_per_s if chip else 0.0
    step_s = max(compute_s, comm_s, memory_s)
    return {"step_s_lower_bound": step_s, "mfu_upper_bound": model_flops / (step_s * peak),
            "hbm_bytes_accessed": hbm_bytes, "bytes_per_chip": state_bytes + activation_bytes(config, mesh, remat)}


# The analytic collectives are 0.3-1.7x the compiled ones, and least reliable between tensor sizes
# (experiments/scale/README.md): each tensor size whose best analytic bound lies within this factor of the best
# one gets its best fitting candidate compiled too.
TENSOR_BAND = 1.25


def _ranked(config: PretrainConfig, where: Target) -> list[tuple]:
    """Every candidate as (analytic bound, remat rank, tensor, mesh config, remat, estimate), best first."""
    state_cache: dict[tuple, int] = {}
    ranked = []
    for mesh_config, remat in candidates(config, len(where.devices), where.num_slices):
        key = (mesh_config.data, mesh_config.fsdp, mesh_config.tensor)
        if key not in state_cache:
            trainer = lm_trainer(config.model, config.optim, mesh_config, accum_steps=config.accum_steps,
                                 devices=list(where.devices))
            state_cache[key] = sizing.state_bytes_per_device(trainer)
        est = analytic_estimate(config, mesh_config, remat, where, state_cache[key])
        ranked.append((est["step_s_lower_bound"], ("none", "dots", "full").index(remat), mesh_config.tensor,
                       mesh_config, remat, est))
    if not ranked:
        raise ConfigError(f"--mesh auto: no data x fsdp x tensor mesh of {len(where.devices)} {_unit(where.device_kind)}s splits the batch "
                          f"{config.data.global_batch_size} (x accum_steps {config.accum_steps}) and the model's dimensions")
    return sorted(ranked, key=lambda r: r[:3])


def auto(config: PretrainConfig, where: Target, compile_top: int = 3, baselines: bool = True,
         progress=None) -> dict[str, Any]:
    """The best plan that fits: rank every candidate analytically, compile the best `compile_top` (and, with
    `baselines`, the data-only and fsdp-only meshes where they may fit) and the best fitting one of each tensor
    size within TENSOR_BAND of the best bound, keep the best compiled plan that fits; if none of those fits, go
    on down the ranking until one does."""
    t0 = time.perf_counter()
    capacity = where.hbm_bytes()
    ranked = _ranked(config, where)
    may_fit = [r for r in ranked if capacity is None or r[5]["bytes_per_chip"] <= capacity]
    chosen = may_fit[:compile_top]
    for baseline in ({"fsdp": 1, "tensor": 1}, {"data": 1, "tensor": 1}) if baselines else ():  # data-, fsdp-only
        for r in may_fit:
            if r[4] == "none" and all(getattr(r[3], k) == v for k, v in baseline.items()) and r not in chosen:
                chosen.append(r)
                break
    compiled: dict[int, dict[str, Any]] = {}  # by the candidate's place in `may_fit`
    bands = [[i for i, r in enumerate(may_fit) if r[2] == tensor and r[0] <= TENSOR_BAND * may_fit[0][0]]
             for tensor in sorted({r[2] for r in may_fit})]
    # what is compiled if the first tried fit: the count the progress lines give (each that does not adds one)
    planned = len({may_fit.index(r) for r in chosen} | {band[0] for band in bands if band})

    def fits(i: int) -> bool:
        if i not in compiled:
            _, _, _, mesh_config, remat, est = may_fit[i]
            if progress:
                n = len(compiled) + 1
                beyond = " (an earlier one did not fit)" if n > planned else ""
                progress(f"compiling {n}/{max(n, planned)} data={mesh_config.data},fsdp={mesh_config.fsdp},"
                         f"tensor={mesh_config.tensor} remat={remat}{beyond}")
            compiled[i] = {**compile_plan(dataclasses.replace(config, mesh=mesh_config, model=dataclasses.replace(
                config.model, remat=remat)), where), "analytic": est}
        return compiled[i]["fits"] is not False

    queue = [may_fit.index(r) for r in chosen] + [i for i, r in enumerate(may_fit) if r not in chosen]
    while queue and (len(compiled) < len(chosen) or not any(p["fits"] is not False for p in compiled.values())):
        fits(queue.pop(0))
    for in_band in bands:
        any(fits(i) for i in in_band)  # compiles down this tensor size's ranking until one fits
    return _best_of(list(compiled.values()), len(ranked), len(may_fit), where, time.perf_counter() - t0)


def _best_of(compiled: list[dict], n_ranked: int, n_may_fit: int, where: Target, seconds: float) -> dict[str, Any]:
    fitting = [p for p in compiled if p["fits"] is not False]
    ranking = [{"mesh": p["mesh"], "remat": p["remat"], "fits": p["fits"], "peak_bytes_per_chip": p["peak_bytes_per_chip"],
                "step_s_lower_bound": p["estimate"]["step_s_lower_bound"], "analytic_step_s": p["analytic"]["step_s_lower_bound"],
                "analytic_bytes_per_chip": p["analytic"]["bytes_per_chip"]} for p in compiled]
    summary = {"candidates": n_ranked, "analytically_fitting": n_may_fit, "compiled": len(compiled),
               "seconds": round(seconds, 1), "ranking": ranking}
    if not fitting:
        best = min(compiled, key=lambda p: p["peak_bytes_per_chip"], default=None)
        if best is None:
            raise PlanDoesNotFit(f"--mesh auto: no mesh of {len(where.devices)} chips fits {where.device_kind}'s HBM "
                                 f"by the analytic estimate ({n_ranked} tried); try model.remat=full, accum_steps, "
                                 "optim.state_dtype=bfloat16 or more chips")
        raise PlanDoesNotFit("--mesh auto: none of the compiled candidates fits; smallest: " + shortfall_message(best))
    best = min(fitting, key=lambda p: (p["estimate"]["step_s_lower_bound"] or 0.0, p["peak_bytes_per_chip"]))
    return {**best, "auto": summary}


def plan(config: PretrainConfig, where: Target, mesh_auto: bool = False, progress=None) -> dict[str, Any]:
    """The plan the CLI prints: one mesh (`config.mesh`) or the best of `--mesh auto`. A plan that does not
    fit raises PlanDoesNotFit with one line."""
    if mesh_auto:
        return auto(config, where, progress=progress)
    result = compile_plan(config, where)
    if result["fits"] is False:
        raise PlanDoesNotFit(shortfall_message(result))
    return result


def _as_flags(plan: dict[str, Any]) -> str:
    """The flags that run this plan's mesh (and the remat --mesh auto may have picked with it) in pretrain."""
    mesh = ",".join([f"{k}={v}" for k, v in plan["mesh"].items()] + [f"dcn_{k}={v}" for k, v in plan["dcn"].items() if v > 1])
    extra = [f"--set model.remat={plan['remat']}"] * (plan["remat"] != "none")
    extra += [f"--set accum_steps={plan['accum_steps']}"] * (plan.get("accum_steps", 1) > 1)
    return " ".join([f"--mesh {mesh}", *extra])


def _unit(device_kind: str) -> str:
    """What a plan compiled for, in words: chips (a TPU topology, GPUs), or the devices of this CPU (one, or
    --simulate-devices N), which the table and the messages called chips. The record keeps its *_per_chip keys,
    one schema for every target."""
    return "device" if device_kind == "cpu" else "chip"


def table(plan: dict[str, Any]) -> str:
    """A short human-readable summary of a plan."""
    est = plan["estimate"]
    mesh = " x ".join(f"{k} {v}" for k, v in plan["mesh"].items())
    per = _unit(plan["chip"])
    memory = "HBM" if per == "chip" else "memory"  # a CPU device's is the host's
    rows = [
        ("target", f"{plan['topology']} ({plan['chips']} x {plan['chip']}, {plan['num_slices']} slice(s))"),
        ("model", f"{plan['num_params'] / 1e6:,.2f}M params, {plan['dtype']} compute, remat {plan['remat']}, "
                  f"optimizer state {plan['state_dtype']}"),
        ("mesh", mesh + ("" if plan["num_slices"] == 1 else f" (dcn {plan['dcn']})") + f" (pretrain: {_as_flags(plan)})"),
        ("batch", f"{plan['global_batch']} x {plan['seq_len']} global, {plan['per_chip_batch']:g} sequences per {per}"),
        (f"{memory} per {per}", _fit_text(plan)),
        (f"state per {per}", f"{_size(plan['state_bytes_per_chip'])} (params {_size(plan['param_bytes_per_chip'])}, "
                           f"optimizer {_size(plan['opt_state_bytes_per_chip'])})"),
        (f"FLOPs per {per}", f"{plan['model_flops_per_chip']:.3g} model, {plan['xla_flops_per_chip'] or 0:.3g} compiled"),
        ("collectives", ", ".join(f"{k} x{int(v['count'])} {_size(v['ici_bytes_per_chip'] + v['dcn_bytes_per_chip'])}"
                                  for k, v in plan["collectives"].items()) or "none"),
        ("step (lower bound)", "n/a" if est.get("step_s_lower_bound") is None else
         f"{_time(est['step_s_lower_bound'])} ({est['bound']}-bound: compute {_time(est['compute_s'])}, "
         f"HBM {'n/a (loops)' if est['memory_s'] is None else _time(est['memory_s'])}, ICI {_time(est['ici_s'])}, "
         f"DCN {_time(est['dcn_s'])}), "
         f"MFU <= {est['mfu_upper_bound']:.0%}"),
        ("compile", f"{plan['compile_s']:.1f} s"),
    ]
    if plan.get("replicated_over_limit"):
        big = plan["replicated_over_limit"]
        rows.append(("replicated > 8 MB", f"{len(big)} state tensors, {_size(sum(r['bytes'] for r in big))} per {per} "
                                          f"(largest {max(big, key=lambda r: r['bytes'])['tensor']})"))
    if "auto" in plan:
        a = plan["auto"]
        rows.append(("--mesh auto", f"{a['candidates']} candidates, {a['analytically_fitting']} may fit, "
                                    f"{a['compiled']} compiled in {a['seconds']} s"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _fit_text(plan: dict[str, Any]) -> str:
    if plan["fits"] is None:
        return f"{_size(plan['peak_bytes_per_chip'] or 0)} peak (no capacity known for {plan['chip']})"
    verdict = "fits" if plan["fits"] else "DOES NOT FIT"
    margin = plan["margin_bytes"]
    return (f"{_size(plan['peak_bytes_per_chip'])} peak of {_size(plan['hbm_bytes_per_chip'])}: {verdict} "
            f"(margin {'-' if margin < 0 else '+'}{_size(abs(margin))})")


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"
