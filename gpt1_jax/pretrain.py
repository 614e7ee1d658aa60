"""The pre-training job: text -> tokens -> the training loop -> checkpoints, metrics and a loss plot.

Build (data pipeline, LM trainer, checkpointer, loop with an evaluation hook), restore if the workdir
has a checkpoint, then run the loop to `steps`. Resuming is exact: the train state, the data iterator's
position and (through `fold_in(seed, step)`) the dropout masks all come back, so an interrupted and
resumed run ends with the same parameters, bit for bit, as an uninterrupted one. SIGTERM saves a
checkpoint and returns 0; a NaN/inf loss raises DivergenceError (gpt1_jax/loop.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import jax
from jax.experimental import multihost_utils

from gpt1_jax import distributed, flops
from gpt1_jax.attention import check_runnable as check_attention
from gpt1_jax.checkpoint import Checkpointer
from gpt1_jax.config import (DECAYING_SCHEDULES, RUNTIME_FIELDS, OptimConfig, PretrainConfig, check_storage,
                             flat_fields, load_yaml, to_dict)
from gpt1_jax.data.pipeline import build_pipeline
from gpt1_jax.data.tokens import TOKENIZER_FILE
from gpt1_jax.errors import ConfigError, WorkdirError
from gpt1_jax.evaluate import eval_batch, lm_loss, perplexity
from gpt1_jax.files import atomic_write_text
from gpt1_jax.integrity import newest_checkpoint
from gpt1_jax.loop import Hook, Outcome, resume_step, start
from gpt1_jax.metrics import read_metrics, say_plots
from gpt1_jax.model import init_params
from gpt1_jax.optim import abstract_state, eval_params, make_schedule
from gpt1_jax.sharding import make_mesh
from gpt1_jax.step import check_batch_size, check_mesh_divides, lm_trainer
from gpt1_jax.tokenizer import TOKENIZER_META
from gpt1_jax.tracker import check_tracker
from gpt1_jax.workdir import Identity
from gpt1_jax.workdir import check as check_workdir
from gpt1_jax.workdir import check_same_data, hold, shown_changes


def with_schedule_span(config: PretrainConfig) -> PretrainConfig:
    """The schedule spans the run, and a preset's warmup ends before it does: a decaying schedule's two steps before
    (step k trains at the schedule's value at k - 1, so a warmup of steps - 1 left the last step at the peak, as
    check_pretrain_schedule refuses a given one), warmup_constant's one."""
    decays = config.optim.schedule in DECAYING_SCHEDULES
    most = max(config.steps - 2, 0) if decays else config.steps - 1
    optim = dataclasses.replace(config.optim, total_steps=config.steps,
                                warmup_steps=min(config.optim.warmup_steps, most))
    return dataclasses.replace(config, optim=optim)


def run(config: PretrainConfig, workdir: Path, *, progress: bool = True) -> Outcome:
    """Trains `config` in `workdir` (resuming what is there) -> how it ended (gpt1_jax/loop.py Outcome).
    `progress=False`: no bars or status lines (the tokenizer's and the loop's); warnings still print."""
    workdir = Path(workdir)
    distributed.check_same_job("pretrain", workdir, config)  # before anything is read or written
    is_main = jax.process_index() == 0
    config = with_schedule_span(config)
    job = Identity("pretrain")
    held = check_workdir(workdir, job, "pretrain")
    resumed = held is not None and (workdir / "config.yaml").is_file() and newest_checkpoint(workdir / "checkpoints") is not None
    saved = load_yaml(PretrainConfig, workdir / "config.yaml") if resumed else None  # before the run rewrites it
    if saved is not None:
        check_same_data(workdir, config, saved)
        check_same_optimizer_state(workdir, config, saved)
    # What needs no data is checked before the corpus is read: tokenizing can take minutes, and writes.
    mesh = make_mesh(config.mesh)
    check_batch_size(mesh, config.data.global_batch_size, config.accum_steps)
    check_mesh_divides(config.model, config.mesh, dict(mesh.shape))
    check_attention(config.model.attention, config.model.attn_dropout, True, config.model.head_dim)
    check_storage(config.model, config.optim)
    if is_main:  # the process that logs
        check_tracker(config.tracker)
    if jax.process_count() > 1:  # every process has checked the folder before process 0 writes into it (its BPE)
        multihost_utils.sync_global_devices("pretrain: workdir checked")
    with hold(workdir, "pretrain", enabled=is_main):  # one job at a time in a run folder
        return _build_and_train(config, workdir, job, is_main, saved, progress)


def _build_and_train(config: PretrainConfig, workdir: Path, job: Identity, is_main: bool,
                     saved: PretrainConfig | None, progress: bool) -> Outcome:
    pipeline = build_pipeline(dataclasses.replace(config.data, progress=config.data.progress and is_main and progress),
                              workdir)
    pipeline.train_iter()  # a corpus too small for one batch is refused now, before the checkpoints' folder exists
    if config.eval_every and pipeline.val_indices.size == 0:  # found now, not at the first evaluation
        n = len(pipeline.windows)
        why = (f"data.val_fraction={config.data.val_fraction} leaves none of this corpus's {n} windows: set "
               "data.val_fraction above 0" if n >= 2 else f"this corpus makes {n} window{'s' * (n != 1)} of "
               f"{config.data.seq_len + 1} tokens, too few to hold one out: give more text or a shorter seq_len")
        raise ConfigError(f"eval_every={config.eval_every} evaluates on validation windows, and {why}, or eval_every=0")
    config = dataclasses.replace(config, model=flops.fit_compute_dtype(
        dataclasses.replace(config.model, vocab_size=pipeline.tokenizer.vocab_size)))
    trainer = lm_trainer(config.model, config.optim, config.mesh, accum_steps=config.accum_steps, seed=config.seed)
    ckpt = Checkpointer(workdir / "checkpoints", keep=config.keep_checkpoints, save_every=config.checkpoint_every,
                        keep_steps=config.keep_steps)
    try:  # until the loop takes the checkpointer over: an error or Ctrl-C must not leave orbax's threads running
        return _train(config, workdir, job, pipeline, trainer, ckpt, is_main, saved, progress)
    finally:
        ckpt.close()


def check_same_optimizer_state(workdir: Path, config: PretrainConfig, saved: PretrainConfig) -> None:
    """A resume whose optimizer keeps another state than the run's checkpoints hold (another optim.name,
    clipping turned off, ...) is refused in one line: orbax's restore failed with a 6 KB traceback."""
    params = jax.eval_shape(lambda: init_params(config.model, 0))

    def layout(optim: OptimConfig):  # not the dtypes: orbax casts to the new state_dtype as it restores
        state = abstract_state(optim, params)
        return jax.tree.structure(state), [x.shape for x in jax.tree.leaves(state)]

    if layout(saved.optim) != layout(config.optim):
        old, new = flat_fields(to_dict(saved)), flat_fields(to_dict(config))
        differ = [k for k in new if k.startswith("optim.") and new[k] != old.get(k) and k != "optim.total_steps"]
        raise WorkdirError(f"{workdir} holds checkpoints of another optimizer ({shown_changes(differ, old, new)}): "
                           "repeat the run's optimizer settings to resume it, or choose another --workdir")


def runtime_change(saved: PretrainConfig, now: PretrainConfig, step: int) -> str | None:
    """A resume may change how the model runs (its dtypes, remat, attention, dropout, the optimizer state's dtype,
    the micro-batches): said, since config.yaml then records the new settings for steps that ran under the old."""
    keys = [f"model.{f}" for f in RUNTIME_FIELDS if f != "scan_layers"] + ["optim.state_dtype", "accum_steps"]
    old, new = flat_fields(to_dict(saved)), flat_fields(to_dict(now))
    changed = [f"{k} {old.get(k)} -> {new.get(k)}" for k in keys if old.get(k) != new.get(k)]
    if not changed:
        return None
    return (f"resuming with other run-time settings than the run's ({', '.join(changed)}): steps {step + 1} on run "
            "with them, and config.yaml records them")


def unapplied(saved: PretrainConfig | None, now: PretrainConfig) -> str:
    """A finished run given other settings (`--set optim.lr=6e-4`, `--mesh`) trains nothing with them: said, where
    they were dropped without a word."""
    if saved is None:
        return ""
    old, new = flat_fields(to_dict(saved)), flat_fields(to_dict(now))
    differ = [k for k in sorted(set(new) | set(old)) if new.get(k) != old.get(k)]
    return f" (not applied: {shown_changes(differ, old, new)}; a new --workdir trains with them)" if differ else ""


def schedule_change(saved: OptimConfig, now: OptimConfig, step: int) -> str | None:
    """What a resume at `step` does to the learning rate when the schedule's settings changed (a larger --steps
    stretches a cosine over the new span): said, since the lr then jumps (x100 resuming a finished 30-step run
    for 50) and the run is no longer the one a fresh run of those settings would be; None if nothing moved."""
    fields = ("schedule", "lr", "warmup_steps", "total_steps")
    changed = [f"optim.{f} {getattr(saved, f)} -> {getattr(now, f)}" for f in fields if getattr(saved, f) != getattr(now, f)]
    if not changed:
        return None
    before, after = float(make_schedule(saved)(step)), float(make_schedule(now)(step))
    if math.isclose(before, after, rel_tol=1e-3, abs_tol=1e-12):
        return None
    return (f"the learning-rate schedule changed ({', '.join(changed)}): step {step + 1} trains at lr {after:.3g} where "
            f"the run's own schedule gave {before:.3g}; repeat the run's --steps ({saved.total_steps}) to keep it")


def _train(config: PretrainConfig, workdir: Path, job: Identity, pipeline, trainer, ckpt, is_main: bool,
           saved: PretrainConfig | None, progress: bool) -> Outcome:
    """`saved`: the run's config.yaml as it was before this session (None for a new run)."""
    begin = resume_step(ckpt, config.model)
    if begin >= config.steps:
        print(f"{workdir}: already trained to step {begin} of {config.steps}; nothing to do{unapplied(saved, config)}",
              file=sys.stderr)
        if is_main and not (workdir / "loss.png").is_file():  # a run killed between its last save and its plot
            say_plots(workdir)
        return Outcome("finished", begin)

    def hooks(progress):
        def evaluate(step, state, train_loss):
            # Schedule-free optimizers are evaluated at their x sequence; for the others this is params.
            loss, tokens = lm_loss(trainer, eval_params(state.opt_state, state.params), pipeline.val_iter(),
                                   config.eval_batches)
            ppl = perplexity(loss)
            progress.write(f"step {step}: val_loss {loss:.4f}  val_ppl {ppl:.2f}")
            # how much of the split eval_batches let it read: `evaluate --workdir` reads all of it
            return {"val_loss": loss, "val_ppl": ppl, "val_tokens": int(tokens)}

        def compile_eval(state):
            first = next(iter(pipeline.val_iter()))
            trainer.compile_eval(eval_params(state.opt_state, state.params), eval_batch(trainer, first))

        return ([Hook("eval", evaluate, every=config.eval_every, prepare=compile_eval, doing="evaluating validation")]
                if config.eval_every else [])

    def write_files():
        atomic_write_text(workdir / "data_info.json", json.dumps(pipeline.info, indent=2) + "\n")
        if config.data.tokenizer != "train":  # a given tokenizer is copied: the workdir alone is the model
            pipeline.tokenizer.save(workdir / TOKENIZER_FILE)  # (sample, evaluate and finetune --init read it)
            # A BPE trained here before (`tokenize --tokenizer train`, a run killed before its first checkpoint)
            # left its record, which would call the copied tokenizer damaged.
            (workdir / TOKENIZER_META).unlink(missing_ok=True)

    batches = pipeline.train_iter()
    loop, state = start(workdir, job, config, trainer, ckpt, batches, begin, steps=config.steps, init_state=trainer.init,
                        hooks=hooks, desc="pretrain", write_files=write_files, progress=progress, log_every=config.log_every,
                        tokens_per_step=config.data.global_batch_size * config.data.seq_len,
                        flops_per_token=flops.flops_per_token(config.model, config.data.seq_len),
                        peak_flops=flops.peak_flops(config.model.dtype, remembered=True)[0])
    loop.progress.write(
        f"{'resuming at step ' + str(begin) if begin else 'starting'}: {config.model.num_params() / 1e6:.2f}M params, "
        f"{pipeline.info['train_windows']} train windows of {config.data.seq_len} tokens, "
        f"mesh {dict(trainer.mesh.shape)} over {len(jax.devices())} devices"
    )
    if begin and saved is not None:
        for note in (schedule_change(saved.optim, config.optim, begin), runtime_change(saved, config, begin)):
            if note:
                loop.progress.warn(note)
    outcome = loop.run(state, batches)
    if is_main:
        # a result, not progress: a batch job's log has it (with a bar, the evaluation's own line said it)
        last = None if progress else next((r for r in reversed(read_metrics(workdir)) if "val_loss" in r), None)
        if last is not None:
            print(f"step {last['step']}: val_loss {last['val_loss']:.4f}  val_ppl {last['val_ppl']:.2f}",
                  file=sys.stderr)
        say_plots(workdir)
    return outcome
