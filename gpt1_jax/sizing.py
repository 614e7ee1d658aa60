"""Ahead-of-time sizing of the train step: compile it for a mesh and report memory and FLOPs per device.

One report for `gpt1-jax pretrain --dry-run` (no data, no tokenizer, nothing written) and for
`gpt1-jax bench` (which then also times the compiled step). Works over the visible devices, real or
`--simulate-devices N` fake ones, so a pod job can be sized on a laptop.

Memory is XLA's `memory_analysis` of the compiled program (on CPU, the CPU compiler's buffers; a
GPU/TPU compiler lays them out somewhat differently). FLOPs come twice: XLA's count for one device's
program (`cost_analysis`) and the model count of gpt1_jax/flops.py.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import jax

from gpt1_jax import flops
from gpt1_jax.attention import model_impl
from gpt1_jax.config import ModelConfig, PretrainConfig
from gpt1_jax.hlo import loop_factors
from gpt1_jax.step import lm_batch_spec, lm_trainer


def pretrain_trainer(config: PretrainConfig):
    """The LM trainer of a pre-training config, on a mesh over all visible devices."""
    return lm_trainer(config.model, config.optim, config.mesh, accum_steps=config.accum_steps, seed=config.seed)


def size_step(trainer, batch_spec: dict[str, Any], model: ModelConfig,
              say: Callable[[str], None] | None = None) -> tuple[dict[str, Any], Any]:
    """(JSON-able report, compiled step) for `trainer`'s train step on batches shaped like `batch_spec`.

    The report: mesh and devices, lower/compile seconds, train-state bytes (total and per device, from
    the shardings alone: nothing is allocated), XLA's memory and FLOPs per device, model FLOPs.
    `say`: told what compiles, once the batch is known to split (a refusal stays the command's one line)."""
    B, T = batch_spec["inputs"].shape
    trainer.check_batch_size(B)
    if say is not None:  # lowering and compiling 117M for 64 simulated devices: 18 s of silence before
        mesh = ",".join(f"{axis}={n}" for axis, n in trainer.mesh.shape.items())
        say(f"compiling the train step for {trainer.mesh.size} x {trainer.mesh.devices.flat[0].device_kind} "
            f"(mesh {mesh}), batch {B} x {T} ...")
    t0 = time.perf_counter()
    lowered = trainer.lower(batch_spec)
    t_lower = time.perf_counter()
    compiled = lowered.compile()
    t_compile = time.perf_counter()

    sharded = jax.tree.leaves(trainer.abstract_state_sharded())
    model_flops = flops.flops_per_token(model, T) * B * T
    report: dict[str, Any] = {
        "num_params": model.num_params(),
        "dtype": model.dtype,
        "param_dtype": model.param_dtype,
        # the attention core the step traced (`auto` resolved for the mesh's devices)
        "attention": model_impl(model, trainer.mesh.devices.flat[0].platform),
        "global_batch": B,
        "seq_len": T,
        "accum_steps": trainer.accum_steps,
        "mesh": dict(trainer.mesh.shape),
        "devices": trainer.mesh.size,
        "platform": jax.devices()[0].platform,
        "process_count": jax.process_count(),
        "lower_s": round(t_lower - t0, 3),
        "compile_s": round(t_compile - t_lower, 3),
        "cpu_flags": flops.cpu_flags(),  # with every time it reports (the compile's, here)
        "state_bytes_total": sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in sharded),
        "state_bytes_per_device": state_bytes_per_device(trainer),
        "flops_per_token": flops.flops_per_token(model, T),  # 6N + 12·L·d·T
        "model_flops_per_step": model_flops,
        "model_flops_per_device": model_flops / trainer.mesh.size,
    }
    report.update(_memory(compiled))
    report.update(_xla_cost(compiled, trainer.mesh.devices.flat[0].client))
    return report, compiled


def state_bytes_per_device(trainer, part: str | None = None) -> int:
    """Bytes of the train state one device holds (all of it, or `part`: "params" / "opt_state"), from the
    shardings alone: nothing is allocated or compiled."""
    state = trainer.abstract_state_sharded()
    tree = state if part is None else getattr(state, part)
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _memory(compiled) -> dict[str, int]:
    mem = compiled.memory_analysis()
    if mem is None:  # not every backend reports it
        return {}
    get = lambda name: int(getattr(mem, f"{name}_size_in_bytes", 0) or 0)
    arg, out, alias, temp = get("argument"), get("output"), get("alias"), get("temp")
    return {
        "argument_bytes_per_device": arg,
        "output_bytes_per_device": out,
        "alias_bytes_per_device": alias,
        "temp_bytes_per_device": temp,
        "generated_code_bytes": get("generated_code"),
        # live at once: inputs + outputs not donated into inputs + scratch
        "peak_bytes_per_device": arg + out - alias + temp,
    }


def _xla_cost(compiled, client) -> dict[str, Any]:
    """XLA's FLOPs and bytes accessed per device for the compiled target, with every loop body (scanned layers,
    micro-batches) counted once per trip where XLA counts it once (gpt1_jax/hlo.py): `loop_bodies_counted` says
    which ("once" where the text could not be read so)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per program
        cost = cost[0] if cost else None
    if not cost:
        return {}
    text = compiled.as_text()
    factors = loop_factors(text, client) or {}
    result: dict[str, Any] = {"flops_per_device": round(float(cost.get("flops", 0.0)) * factors.get("flops", 1.0))}
    if "bytes accessed" in cost:
        result["bytes_accessed_per_device"] = round(float(cost["bytes accessed"]) * factors.get("bytes accessed", 1.0))
    result["loop_bodies_counted"] = "per trip" if factors else "once" if " while(" in text else "no loops"
    return result


def dry_run(config: PretrainConfig, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The sizing report of a pre-training job, without data, tokenizer or training. The model's
    vocab_size is taken as configured (the presets' tokenizer size). `say`: as `size_step`'s."""
    trainer = pretrain_trainer(config)
    spec = lm_batch_spec(config.data.global_batch_size, config.data.seq_len)
    report, _ = size_step(trainer, spec, config.model, say)
    return {"dry_run": True, **report}
