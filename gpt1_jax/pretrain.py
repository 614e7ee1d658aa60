"""`gpt1-jax pretrain`: the main job. Text -> tokens -> sharded train step -> checkpoints and metrics.

The loop reads top to bottom: build (mesh, data, trainer, checkpointer), restore if the workdir has a
checkpoint, then step / log / evaluate / save until `steps`. Resuming is exact: the train state, the
data iterator's position and (through `fold_in(seed, step)`) the dropout masks all come back, so an
interrupted and resumed run ends with the same parameters, bit for bit, as an uninterrupted one.
SIGTERM (preemption) saves a checkpoint and exits 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gpt1_jax.config import MeshConfig, PretrainConfig, apply_overrides, load_yaml, save_yaml


class _Preemption:
    """SIGTERM/SIGINT -> a flag the loop checks between steps (a checkpoint, then exit 0).
    Multi-process: JAX's preemption notifier owns SIGTERM and `poll` agrees on the step with the others
    (multihost_utils.reached_preemption_sync_point), so every process saves the same step."""

    def __init__(self, multiprocess: bool = False):
        self.requested = False
        self.multiprocess = multiprocess
        if multiprocess:
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def poll(self, step: int) -> bool:
        if self.multiprocess and not self.requested:  # call once per step, on every process
            from jax.experimental import multihost_utils

            self.requested = multihost_utils.reached_preemption_sync_point(step)
        return self.requested

    def _handle(self, signum, frame):
        if self.requested:  # a second Ctrl-C: give up at once
            raise KeyboardInterrupt
        self.requested = True


def train(config: PretrainConfig, workdir: Path) -> int:
    import jax

    from gpt1_jax import flops
    from gpt1_jax.checkpoint import Checkpointer
    from gpt1_jax.data.pipeline import build_pipeline
    from gpt1_jax.metrics import MetricsWriter, Progress, plot_losses
    from gpt1_jax.optim import eval_params
    from gpt1_jax.sharding import logical_rules, make_mesh
    from gpt1_jax.step import Trainer

    is_main = jax.process_index() == 0
    workdir.mkdir(parents=True, exist_ok=True)
    preempt = _Preemption(multiprocess=jax.process_count() > 1)

    # --- build ---------------------------------------------------------------------------------
    pipeline = build_pipeline(dataclasses.replace(config.data, progress=is_main), workdir)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=pipeline.tokenizer.vocab_size))
    mesh = make_mesh(config.mesh)
    trainer = Trainer(config.model, config.optim, mesh, logical_rules(config.mesh.rules),
                      accum_steps=config.accum_steps, seed=config.seed)
    ckpt = Checkpointer(workdir / "checkpoints", keep=config.keep_checkpoints, save_every=config.checkpoint_every)
    train_iter = pipeline.train_iter()

    # --- restore or start -----------------------------------------------------------------------
    start = ckpt.latest_step()
    if start is not None:
        ckpt.check_model(config.model, start)
        state, data_state, start = ckpt.restore(trainer.abstract_state_sharded(), start)
        train_iter.restore(data_state)
    else:
        start, state = 0, trainer.init()
    if is_main:
        save_yaml(config, workdir / "config.yaml")
        (workdir / "data_info.json").write_text(json.dumps(pipeline.info, indent=2) + "\n")
    if start >= config.steps:
        print(f"{workdir}: already trained to step {start} of {config.steps}; nothing to do", file=sys.stderr)
        ckpt.close()
        return 0

    tokens_per_step = config.data.global_batch_size * config.data.seq_len
    flops_per_token = flops.flops_per_token(config.model, config.data.seq_len)
    peak, _ = flops.peak_flops(config.model.dtype)
    metrics = MetricsWriter(workdir, enabled=is_main, resume_step=start)
    progress = Progress(config.steps, start, enabled=is_main, desc="pretrain")
    progress.write(
        f"{'resuming at step ' + str(start) if start else 'starting'}: {config.model.num_params() / 1e6:.2f}M params, "
        f"{pipeline.info['train_windows']} train windows of {config.data.seq_len} tokens, "
        f"mesh {dict(mesh.shape)} over {len(jax.devices())} devices"
    )

    # --- train ----------------------------------------------------------------------------------
    status = 0
    try:
        t_last = time.perf_counter()
        for done in range(start + 1, config.steps + 1):
            state, step_metrics = trainer.step(state, trainer.put_batch(next(train_iter)))
            m = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
            if not math.isfinite(m["loss"]):
                last = ckpt.latest_step()
                progress.write(f"error: loss is {m['loss']} at step {done}; stopping. Last good checkpoint: "
                               f"{'step ' + str(last) if last is not None else 'none'} in {ckpt.directory}")
                metrics.write(done, loss=m["loss"])
                status = 1
                break
            now = time.perf_counter()
            tokens_per_s, t_last = tokens_per_step / max(now - t_last, 1e-9), now
            mfu = flops.mfu(tokens_per_s, flops_per_token, peak)
            if config.log_every and (done % config.log_every == 0 or done == config.steps):
                metrics.write(done, loss=m["loss"], lr=m["lr"], grad_norm=m["grad_norm"],
                              tokens_per_s=tokens_per_s, mfu=mfu, epoch=train_iter.epoch)
            progress.update(1, loss=m["loss"], tok_s=f"{tokens_per_s:,.0f}", mfu=f"{mfu:.1%}")
            if (stop := preempt.poll(done)) or ckpt.should_save(done) or done == config.steps:
                ckpt.save(done, state, train_iter.state(), config.model)
            if config.eval_every and (done % config.eval_every == 0 or done == config.steps):
                # Schedule-free optimizers are evaluated at their x sequence; for the others this is params.
                params = eval_params(state.opt_state, state.params)
                loss, _ = evaluate_loss(trainer, params, pipeline.val_iter(), config.eval_batches)
                metrics.write(done, val_loss=loss, val_ppl=math.exp(min(loss, 50.0)))
                progress.write(f"step {done}: val_loss {loss:.4f}  val_ppl {math.exp(min(loss, 50.0)):.2f}")
                t_last = time.perf_counter()  # evaluation time is not training throughput
            if stop:
                progress.write(f"preempted: checkpoint saved at step {done}; run the same command to resume")
                break
    except BaseException as e:  # multi-process: leave now; the peers may never join the save below
        from gpt1_jax.distributed import abort

        abort(1, e)
        raise
    finally:  # an error still lets the save in flight finish, so the last checkpoint stays whole
        progress.close()
        ckpt.close()
        metrics.close()
    if is_main:
        print(f"loss curve: {plot_losses(workdir)}", file=sys.stderr)
    return status


def evaluate_loss(trainer, params, batches, max_batches: int) -> tuple[float, float]:
    """(token-weighted mean LM loss, tokens) over (up to max_batches of) an iterator; padding weighs 0."""
    total, weight = 0.0, 0.0
    for i, batch in enumerate(batches):
        if max_batches and i >= max_batches:
            break
        loss_sum, weight_sum = trainer.eval_sums(params, trainer.put_batch(batch))
        total, weight = total + float(loss_sum), weight + float(weight_sum)
    return total / max(weight, 1.0), weight


def load_run(workdir: Path, step: int | None = None, overrides=()):
    """A pre-training workdir -> (config, trainer on all local devices, params placed for it, step)."""
    import jax

    from gpt1_jax.checkpoint import restore_params
    from gpt1_jax.sharding import logical_rules, make_mesh
    from gpt1_jax.step import Trainer

    if not (workdir / "config.yaml").is_file():
        raise FileNotFoundError(f"{workdir} is not a pre-training workdir (no config.yaml)")
    config = apply_overrides(load_yaml(PretrainConfig, workdir / "config.yaml"), list(overrides))
    params, step = restore_params(workdir / "checkpoints", config.model, step)
    mesh = make_mesh(MeshConfig(data=-1))
    trainer = Trainer(config.model, config.optim, mesh, logical_rules(config.mesh.rules), seed=config.seed)
    return config, trainer, jax.device_put(params, trainer.param_shardings), step
