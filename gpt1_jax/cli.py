"""`gpt1-jax VERB ...`: the one command line. Every flag is declared here; each verb turns its flags into
a typed config (`gpt1_jax.config.resolve`) and makes one library call. No library module parses flags.

The verbs that run a model (pretrain, finetune, evaluate, sample, bench) share, declared once:
  --config PRESET|YAML   the run's config: a preset name or a YAML file of the verb's config class
  --set KEY=VALUE        any field of that config, dotted for nested ones (repeatable; wins over flags)
  --mesh AXIS=N,...      device mesh, e.g. data=2,fsdp=2,tensor=2
  --seed N
  --simulate-devices N   N fake CPU devices (to try meshes, or size a pod job, on one machine)
Every verb also takes the multi-process flags (launch/README.md).

Errors: a project error (gpt1_jax.errors.GPT1JaxError) or an OS error (a missing file, a folder it cannot
write, a full or read-only disk) ends as the one line `gpt1-jax VERB: error: ...` on stderr, naming the
path and the fix, and exit status 2 (a diverged run: exit status 1); anything else is a bug and keeps its
traceback. Ctrl-C stops any verb in any phase with one line and exit status 130 (in training after a
checkpoint; gpt1_jax/interrupt.py); SIGTERM saves and exits 0. `verify` exits with status 1 when a
checkpoint or the run's config.yaml is damaged. GPT1_JAX_DEBUG=1 shows the traceback of a project error too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

from gpt1_jax import compile_cache, distributed
from gpt1_jax.interrupt import CtrlC
from gpt1_jax.metrics import close_open_bars
from gpt1_jax.errors import ConfigError, DivergenceError, GPT1JaxError

DEBUG_ENV = "GPT1_JAX_DEBUG"


# ---- flags shared by several verbs ----------------------------------------------------------------

def _add_set(parser, text: str) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=text)


def _model_flags() -> argparse.ArgumentParser:
    """The flags of every verb that runs a model, as an argparse parent."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("run config (shared by every verb that runs a model)")
    g.add_argument("--config", default=None, metavar="PRESET|YAML",
                   help="a preset name or a YAML file of the verb's config (default: the workdir's saved config "
                        "where there is one, else the config's defaults)")
    _add_set(g, "any config field, dotted for nested ones: optim.lr=3e-4, model.dtype=bfloat16 (repeatable; "
                "applied after the other flags)")
    g.add_argument("--mesh", default=None, metavar="AXIS=N,...",
                   help="e.g. data=2,fsdp=2,tensor=2 (default: data over all devices); `plan` also takes auto")
    g.add_argument("--seed", type=int, default=None, help="random seed (default: the config's)")
    g.add_argument("--simulate-devices", type=int, default=None, metavar="N",
                   help="N fake CPU devices: try a mesh, or size a pod job, on one machine")
    return p


def _distributed_flags() -> argparse.ArgumentParser:
    """Multi-process start-up flags (gpt1_jax/distributed.py reads them by these names)."""
    d = distributed
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("multi-process (see launch/README.md)")
    g.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help=f"address of process 0's coordinator (env {d.ENV_COORDINATOR})")
    g.add_argument("--num-processes", type=int, default=None, metavar="N", help=f"env {d.ENV_NUM_PROCESSES}")
    g.add_argument("--process-id", type=int, default=None, metavar="I", help=f"0..N-1 (env {d.ENV_PROCESS_ID})")
    g.add_argument("--distributed", choices=("auto", "on", "off"), default=None,
                   help=f"auto: initialise only on a cluster JAX detects or with the flags above; on: always "
                        f"(JAX fills in what is missing); off: never (env {d.ENV_MODE}; default auto)")
    g.add_argument("--heartbeat-timeout", type=int, default=None, metavar="S",
                   help=f"seconds before a silent process counts as dead (env {d.ENV_HEARTBEAT}; "
                        f"default {d.DEFAULT_HEARTBEAT_S})")
    g.add_argument("--shutdown-timeout", type=int, default=None, metavar="S",
                   help=f"seconds a finishing process waits for the others (env {d.ENV_SHUTDOWN}; "
                        f"default {d.DEFAULT_SHUTDOWN_S})")
    g.add_argument("--init-timeout", type=int, default=None, metavar="S",
                   help=f"seconds to wait for all processes to connect (env {d.ENV_INIT_TIMEOUT}; "
                        f"default {d.DEFAULT_INIT_TIMEOUT_S})")
    return p


def _overrides(args: argparse.Namespace, templates: dict[str, tuple[str, ...]]) -> list[str]:
    """`key=value` overrides for the flags in `templates` that were given ("{}" is the flag's value),
    then `--set`'s, so that `--set` wins."""
    given = [(flag, getattr(args, flag)) for flag in templates if getattr(args, flag) is not None]
    return [t.format(value) for flag, value in given for t in templates[flag]] + list(args.set)


def _refuse(args: argparse.Namespace, verb: str, reasons: dict[str, str]) -> None:
    """A shared flag this verb cannot honour is an error, not silently ignored."""
    for flag, reason in reasons.items():
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} does not apply to {verb}: {reason}")


def _print_json(result: dict) -> None:
    print(json.dumps(result), flush=True)


def simulate_devices(n: int | None) -> None:
    """N fake CPU devices. Only possible before jax starts a backend; importing the package has already
    imported jax, which read JAX_PLATFORMS then, so the platform is set through jax.config as well."""
    if not n:
        return
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
    if "JAX_PLATFORMS" not in os.environ:
        import jax

        os.environ["JAX_PLATFORMS"] = "cpu"
        jax.config.update("jax_platforms", "cpu")


# ---- pretrain -------------------------------------------------------------------------------------

PRETRAIN_FLAGS = {"data": ("data.source={}",), "steps": ("steps={}",), "batch_size": ("data.global_batch_size={}",),
                  "seq_len": ("data.seq_len={}",), "seed": ("seed={}", "data.seed={}")}


def _pretrain_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True, help="run directory: config, tokenizer, checkpoints, metrics "
                   "(a saved config.yaml there is the default --config: running again resumes)")
    p.add_argument("--data", default=None, help="'default' (CPython's docs), a .txt/.txt.gz file or glob, or tfds:NAME")
    p.add_argument("--steps", type=int, default=None, help="total optimizer steps")
    p.add_argument("--batch-size", type=int, default=None, help="global batch, in sequences")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence")
    p.add_argument("--dry-run", action="store_true", help="compile the step for the mesh, print per-device memory "
                   "and FLOPs as one JSON line; no data, no training (size a pod job with --simulate-devices)")


def _pretrain(args: argparse.Namespace) -> int:
    from gpt1_jax import workdir as run_folder
    from gpt1_jax.config import PretrainConfig, resolve

    workdir = Path(args.workdir)
    run_folder.check(workdir, run_folder.Identity("pretrain"), "pretrain")  # before its config.yaml is read as ours
    config = resolve(PretrainConfig, args.config, saved=workdir / "config.yaml",
                     overrides=_overrides(args, PRETRAIN_FLAGS), mesh=args.mesh)
    from gpt1_jax.pretrain import run, with_schedule_span

    if args.dry_run:
        from gpt1_jax.sizing import dry_run

        _print_json(dry_run(with_schedule_span(config)))
        return 0
    return run(config, workdir)


# ---- plan -----------------------------------------------------------------------------------------

PLAN_FLAGS = {"batch_size": ("data.global_batch_size={}",), "seq_len": ("data.seq_len={}",), "seed": ("seed={}",)}


def _plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default=None, metavar="GEN:SHAPE",
                   help="a TPU slice to compile for, no TPU needed: v5e:16x16, v5p:8x8x8, v4:4x4x4, v6e:16x16 "
                        "(needs pip install -e \".[tpu]\"); default: the visible devices (e.g. one GPU host)")
    p.add_argument("--num-slices", type=int, default=1, metavar="N",
                   help="N slices of --topology joined over DCN (multi-slice; the data axis spans them)")
    p.add_argument("--batch-size", type=int, default=None, help="global batch, in sequences")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence")
    p.add_argument("--compile-top", type=int, default=3, metavar="K",
                   help="with --mesh auto: how many of the analytically best candidates to compile (default 3)")
    p.add_argument("--skip-baselines", action="store_true",
                   help="with --mesh auto: do not also compile the data-only and fsdp-only meshes (faster on big pods)")


def _plan(args: argparse.Namespace) -> int:
    """One JSON line on stdout, a short table on stderr; a plan that does not fit: one line, exit 2."""
    from gpt1_jax import plan
    from gpt1_jax.config import PretrainConfig, resolve

    mesh_auto = args.mesh == "auto"
    if args.compile_top < 1:
        raise ConfigError(f"--compile-top must be >= 1, got {args.compile_top}")
    config = resolve(PretrainConfig, args.config, overrides=_overrides(args, PLAN_FLAGS),
                     mesh=None if mesh_auto else args.mesh)
    where = plan.target(args.topology, args.num_slices)
    say = lambda text: print(f"plan: {text}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"compiling the train step for {where.name} ({len(where.devices)} x {where.device_kind})")
    if mesh_auto:
        result = plan.auto(config, where, compile_top=args.compile_top, baselines=not args.skip_baselines, progress=say)
    else:
        result = plan.plan(config, where)
    print(plan.table(result), file=sys.stderr, flush=True)
    _print_json(result)
    return 0


# ---- finetune -------------------------------------------------------------------------------------

FINETUNE_FLAGS = {"task": ("task={}",), "epochs": ("epochs={}",), "batch_size": ("batch_size={}",),
                  "accum_steps": ("accum_steps={}",), "lr": ("optim.lr={}",), "lm_coef": ("lm_coef={}",),
                  "seed": ("seed={}",), "max_train_examples": ("max_train_examples={}",),
                  "max_eval_examples": ("max_eval_examples={}",)}


def _finetune_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, help="cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli or race")
    p.add_argument("--init", required=True, metavar="SOURCE",
                   help="a pre-training workdir, a HF / original / gpt1-jax checkpoint folder, none (random init), "
                        "or scratch:DIR (random init with DIR's architecture and tokenizer)")
    p.add_argument("--workdir", required=True, help="where config, results.json and predictions go")
    p.add_argument("--data-dir", default=None,
                   help="GLUE's TSV distribution (<dir>/<Task>/{train,dev,test}.tsv) or, for race, race.tar.gz; "
                        "default: download through tensorflow-datasets")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer .json or vocabulary folder (default: the one in SOURCE; for --init none, a BPE "
                        "trained on the task's training text)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--accum-steps", type=int, default=None, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--lm-coef", type=float, default=None, help="weight of the auxiliary LM loss (0: off)")
    p.add_argument("--max-train-examples", type=int, default=None, help="a random subset of this size (quick runs)")
    p.add_argument("--max-eval-examples", type=int, default=None,
                   help="a fixed random subset of N of each dev/test split")
    p.add_argument("--predict-test", action="store_true", help="also write GLUE's submission file DIR/<Task>.tsv")
    p.add_argument("--tfds-dir", default=None,
                   help="where tensorflow-datasets prepares GLUE (default: ~/.cache/gpt1_jax/tfds)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or status lines")


def _finetune(args: argparse.Namespace) -> int:
    from gpt1_jax.config import FinetuneConfig, resolve
    from gpt1_jax.finetune import run

    config = resolve(FinetuneConfig, args.config, overrides=_overrides(args, FINETUNE_FLAGS), mesh=args.mesh)
    run(config, Path(args.workdir), init=args.init, data_dir=args.data_dir, tokenizer=args.tokenizer,
        predict_test=args.predict_test, progress=not args.no_progress, tfds_dir=args.tfds_dir)
    return 0


# ---- evaluate -------------------------------------------------------------------------------------

def _evaluate_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True, help="a pre-training run directory")
    p.add_argument("--data", default=None, help="text source (default: the run's own validation split)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per batch (default: the run's)")
    p.add_argument("--max-batches", type=int, default=0, help="stop after this many batches (0: all)")


def _evaluate(args: argparse.Namespace) -> int:
    _refuse(args, "evaluate", {
        "config": "the run's saved config.yaml is used; change its fields with --set",
        "mesh": "evaluation runs data-parallel over all devices",
        "seed": "evaluation is deterministic",
    })
    from gpt1_jax.evaluate import evaluate_workdir

    result = evaluate_workdir(Path(args.workdir), data=args.data, step=args.step, batch_size=args.batch_size,
                              max_batches=args.max_batches, overrides=list(args.set))
    _print_json(result)
    return 0


# ---- sample ---------------------------------------------------------------------------------------

def _sample_flags(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--workdir", help="a pre-training run directory (its latest checkpoint and tokenizer)")
    where.add_argument("--init", help="a HF / original / gpt1-jax checkpoint folder or run directory")
    p.add_argument("--step", type=int, default=None, help="checkpoint step of a run directory (default: the latest)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer .json or vocabulary folder (default: the one in --workdir / --init)")
    p.add_argument("--prompt", default="the", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--num-samples", type=int, default=3)


def _sample(args: argparse.Namespace) -> int:
    """--config / --set give how the checkpoint runs (model.dtype, model.attention, ...); for OpenAI's
    original release, which stores no config, also its architecture (e.g. --config gpt1)."""
    _refuse(args, "sample", {"mesh": "sampling runs on one device"})
    from gpt1_jax.config import PretrainConfig, resolve
    from gpt1_jax.generate import check_room, sample
    from gpt1_jax.tokenizer import find_tokenizer
    from gpt1_jax.weights import load_pretrained

    source = Path(args.workdir or args.init)
    run_config = None
    if args.config is not None or args.set:
        saved = source / "config.yaml" if args.workdir else None
        run_config = resolve(PretrainConfig, args.config, saved=saved, overrides=args.set).model
    step = args.step
    if step is None and (source / "checkpoints").is_dir():  # a run workdir: say which checkpoint speaks
        from gpt1_jax.checkpoint import latest_step

        step = latest_step(source / "checkpoints")
    model_config, params = load_pretrained(source, run_config, step=step)
    tokenizer = find_tokenizer(args.tokenizer, source, model_vocab_size=model_config.vocab_size)
    if tokenizer is None:
        raise FileNotFoundError(f"{source}: no tokenizer in it; pass --tokenizer")
    seed = 0 if args.seed is None else args.seed
    prompt_ids = tokenizer.encode(args.prompt)
    if prompt_ids:  # an empty prompt is sample's own one-line error
        check_room(model_config, len(prompt_ids), args.max_new_tokens, flag="--max-new-tokens ")
    outputs = sample(model_config, params, prompt_ids, max_new_tokens=args.max_new_tokens,
                     temperature=args.temperature, top_k=args.top_k, seed=seed, num_samples=args.num_samples)
    print(f"# {source}{'' if step is None else f' step {step}'}, temperature {args.temperature}, top-k {args.top_k}")
    for ids in outputs:
        print(f"{args.prompt} >> {tokenizer.decode(ids)}")
    return 0


# ---- convert --------------------------------------------------------------------------------------

def _convert_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="an original release, HF or gpt1-jax checkpoint directory, or a run directory")
    p.add_argument("dst", help="output directory (must not exist or be empty, unless --overwrite)")
    p.add_argument("--to", choices=("hf", "jax"), default="hf", help="output format (default: hf)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty DST")
    p.add_argument("--step", type=int, default=None, help="checkpoint step of a run workdir (default: the latest)")
    p.add_argument("--n-heads", type=int, default=None,
                   help="head count of an original release (its files do not record it; default: d_model / 64)")
    _add_set(p, "a model config field: run-time ones (dtype, scan_layers, ...) anywhere, any on an original release")


def _convert(args: argparse.Namespace) -> int:
    from gpt1_jax.weights import convert

    overrides = ([f"n_heads={args.n_heads}"] if args.n_heads is not None else []) + list(args.set)
    config, out = convert(args.src, args.dst, to=args.to, overwrite=args.overwrite, overrides=overrides, step=args.step)
    tokenizer = "with its tokenizer" if (out / "tokenizer.json").is_file() else "without a tokenizer (none in SRC)"
    print(f"wrote {args.to} checkpoint of {config.num_params():,} parameters ({config.n_layers} layers x "
          f"{config.d_model}) {tokenizer} to {out}")
    return 0


# ---- verify ---------------------------------------------------------------------------------------

def _verify_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True, help="a pre-training or fine-tuning run directory")
    p.add_argument("--record-missing", action="store_true",
                   help="trust the checkpoints saved without digests (before gpt1-jax recorded them) and record "
                        "their digests now, so runs resume from them")


def _verify(args: argparse.Namespace) -> int:
    """One line per checkpoint; exit status 1 if any is damaged."""
    from gpt1_jax.integrity import DIGESTS, checkpoint_steps, record, verify_checkpoints

    directory = Path(args.workdir) / "checkpoints"
    if not directory.is_dir():
        raise FileNotFoundError(f"{args.workdir}: no checkpoints/ folder (not a run directory)")
    if args.record_missing:
        for step in checkpoint_steps(directory):
            if not (directory / str(step) / DIGESTS).exists():
                record(directory / str(step))
                print(f"step {step}: digests recorded (saved without them)", flush=True)
    results = verify_checkpoints(directory)
    if not results:
        raise FileNotFoundError(f"{directory}: no checkpoint")
    for step, problem in results:
        print(f"step {step}: " + ("ok" if problem is None else f"damaged: {problem}"), flush=True)
    config_problem = _config_problem(Path(args.workdir) / "config.yaml")
    print(f"config.yaml: {config_problem or 'ok'}", flush=True)
    return 1 if config_problem or any(problem is not None for _, problem in results) else 0


def _config_problem(path: Path) -> str | None:
    """What is wrong with a run's config.yaml (its guard, see gpt1_jax/config.py), or None."""
    from gpt1_jax.config import guarded_text

    if not path.is_file():
        return "missing"
    try:
        guarded_text(path)
    except ConfigError as e:
        return str(e).removeprefix(f"{path} ")
    return None


# ---- tokenize -------------------------------------------------------------------------------------

def _tokenize_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="the text source, spelled as the job will spell it (part of the "
                   "cache key): a .txt/.txt.gz file, directory or glob, 'default', or tfds:NAME")
    p.add_argument("--tokenizer", required=True, metavar="JSON|VOCAB_DIR|train",
                   help="the job's data.tokenizer: a tokenizer .json, OpenAI's vocabulary folder, or 'train' (a BPE "
                        "trained on --data into --workdir, as pretrain does)")
    p.add_argument("--workdir", default=None, help="with --tokenizer train: the run directory that keeps tokenizer.json")
    p.add_argument("--vocab-size", type=int, default=None, help="with --tokenizer train: BPE size (the job's "
                   "data.vocab_size; default 40478)")
    p.add_argument("--cache-dir", default=None, help="the job's data.cache_dir (default: ~/.cache/gpt1_jax/tokens)")
    p.add_argument("--wait", type=float, default=None, metavar="S",
                   help="seconds to wait for another process building the same cache (data.cache_wait_s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _tokenize(args: argparse.Namespace) -> int:
    """Build the token cache a job would build, ahead of it: one JSON line. Run on several processes
    (a pod), process 0 tokenises and the others wait for it, as inside a job."""
    import time

    from gpt1_jax.config import DataConfig
    from gpt1_jax.data.pipeline import tokenize_source

    if args.tokenizer == "train" and args.workdir is None:
        raise ConfigError("--tokenizer train needs --workdir (where pretrain will look for tokenizer.json)")
    if args.tokenizer != "train" and (args.workdir, args.vocab_size) != (None, None):
        raise ConfigError("--workdir and --vocab-size go with --tokenizer train only")
    if args.workdir is not None:  # the BPE goes where a pre-training run will look for it
        from gpt1_jax import workdir

        workdir.check(Path(args.workdir), workdir.Identity("pretrain"), "tokenize")
    fields = {"source": args.data, "tokenizer": args.tokenizer, "cache_dir": args.cache_dir,
              "vocab_size": args.vocab_size, "cache_wait_s": args.wait, "progress": not args.no_progress}
    config = DataConfig(**{k: v for k, v in fields.items() if v is not None})
    t0 = time.perf_counter()
    _, _, stream = tokenize_source(config, args.workdir)
    _print_json({"cache": str(stream.path), "n_tokens": len(stream), "n_docs": stream.meta["n_docs"],
                 "bytes": sum(f.stat().st_size for f in stream.path.iterdir()),
                 "seconds": round(time.perf_counter() - t0, 3), "from_cache": stream.from_cache})
    return 0


# ---- bench ----------------------------------------------------------------------------------------

BENCH_FLAGS = {"batch": ("data.global_batch_size={}",), "seq": ("data.seq_len={}",), "dtype": ("model.dtype={}",),
               "accum_steps": ("accum_steps={}",), "seed": ("seed={}",), "optim": ("optim.name={}",),
               "lr": ("optim.lr={}", "optim.schedule=constant", "optim.warmup_steps=0")}


def _bench_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=None, help="global batch, in sequences (default: the config's)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: the config's)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="compute dtype (params and optimizer state stay in param_dtype)")
    p.add_argument("--accum-steps", type=int, default=None, help="micro-batches per step")
    p.add_argument("--lr", type=float, default=None, help="a constant learning rate (default: the config's schedule)")
    p.add_argument("--optim", default=None, metavar="NAME",
                   help="the optimizer whose update is timed (gpt1_jax/optim.py OPTIMIZERS; default: the config's)")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps after compilation")
    p.add_argument("--compile-only", action="store_true", help="compile and report time, memory and FLOPs; do not run")
    p.add_argument("--peak-flops", type=float, default=None,
                   help="peak FLOP/s for MFU (default: the accelerator's table entry, or a measured matmul)")


def _bench(args: argparse.Namespace) -> int:
    from gpt1_jax import bench
    from gpt1_jax.config import PretrainConfig, resolve

    config = resolve(PretrainConfig, args.config, overrides=_overrides(args, BENCH_FLAGS), mesh=args.mesh)
    _print_json(bench.run(config, steps=args.steps, warmup=args.warmup, compile_only=args.compile_only,
                          peak_flops=args.peak_flops))
    return 0


# ---- the command line -----------------------------------------------------------------------------

class Verb(NamedTuple):
    help: str
    add_flags: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    runs_model: bool = True


VERBS: dict[str, Verb] = {
    "pretrain": Verb("pre-train GPT-1 on a text corpus (resumable; the main job)", _pretrain_flags, _pretrain),
    "evaluate": Verb("LM loss and perplexity of a pre-training checkpoint on a text source", _evaluate_flags,
                     _evaluate),
    "sample": Verb("generate text from a checkpoint", _sample_flags, _sample),
    "convert": Verb("convert checkpoints between the original release, HF and gpt1-jax", _convert_flags, _convert,
                    runs_model=False),
    "bench": Verb("time the sharded train step and print one JSON line", _bench_flags, _bench),
    "plan": Verb("compile the train step for a TPU pod (or the visible devices): HBM fit, collectives, roofline "
                 "step time; --mesh auto picks the mesh", _plan_flags, _plan),
    "finetune": Verb("fine-tune on a GLUE task or RACE with the auxiliary LM loss; results.json + predictions",
                     _finetune_flags, _finetune),
    "verify": Verb("check every checkpoint of a run against the digests recorded when it was saved",
                   _verify_flags, _verify, runs_model=False),
    "tokenize": Verb("build a corpus's token cache ahead of a job (once, however many processes); one JSON line",
                     _tokenize_flags, _tokenize, runs_model=False),
}


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations: `evaluate --init DIR` must not be read as `--init-timeout DIR`.
    parser = argparse.ArgumentParser(prog="gpt1-jax", description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    model_flags, multi_process = _model_flags(), _distributed_flags()
    for name, verb in VERBS.items():
        parents = [model_flags, multi_process] if verb.runs_model else [multi_process]
        p = sub.add_parser(name, help=verb.help, description=verb.help, parents=parents, allow_abbrev=False)
        verb.add_flags(p)
        p.set_defaults(run=verb.run)
    return parser


def _last_checkpoint(args: argparse.Namespace) -> int | None:
    """The newest finished checkpoint of a training verb's workdir (None: none, or not a training verb)."""
    from gpt1_jax.integrity import checkpoint_steps

    if args.verb not in ("pretrain", "finetune"):
        return None
    try:
        return checkpoint_steps(Path(args.workdir) / "checkpoints")[-1]
    except (OSError, IndexError):
        return None


def _interrupted_line(args: argparse.Namespace, error: KeyboardInterrupt) -> int:
    """Ctrl-C: one line saying what state things are in, exit status 130 (128 + SIGINT, as a shell says)."""
    from gpt1_jax.errors import Interrupted

    if os.environ.get(DEBUG_ENV):
        raise error
    if isinstance(error, Interrupted):  # in the training loop, which says what it saved
        what = str(error)
    elif args.verb in ("pretrain", "finetune"):  # before the loop (or after it finished)
        last = _last_checkpoint(args)
        what = ("interrupted (Ctrl-C) before training started; nothing was written half-way; run the same command "
                "to start again" if last is None else
                f"interrupted (Ctrl-C) outside training; nothing was written half-way and checkpoint {last} is kept; "
                "run the same command to resume")
    else:
        what = "interrupted (Ctrl-C); nothing was written half-way; run the same command to start again"
    close_open_bars()
    print(f"gpt1-jax {args.verb}: {what}", file=sys.stderr, flush=True)
    return 130


def _os_error_message(args: argparse.Namespace, e: OSError) -> str:
    """`cannot <do> PATH: <the system's words>; <what to do>` for an OSError that escaped a verb."""
    import errno

    name = e.filename if isinstance(e.filename, (str, bytes, os.PathLike)) else None  # not a file descriptor
    path = Path(os.fsdecode(name)) if name is not None else None
    where = "" if path is None else f" {path}" + (
        f" -> {os.fsdecode(e.filename2)}" if isinstance(e.filename2, (str, bytes)) else "")  # a rename's target
    reason = e.strerror or str(e) or type(e).__name__
    exists = path is not None and os.path.lexists(path)
    code = e.errno
    if code in (errno.EACCES, errno.EPERM):
        do = "create" if not exists else "read" if not os.access(path, os.R_OK) else "write"
        fix = "pick a folder you can write to, or fix its permissions (or its parent's)"
    elif code == errno.EROFS:
        do, fix = "write", "choose a folder on a writable disk"
    elif code in (errno.ENOSPC, errno.EDQUOT):
        do, fix = "write", "free some space or choose a folder on another disk"
        if (last := _last_checkpoint(args)) is not None:
            fix += f"; checkpoint {last} is kept, and the same command resumes from it"
    elif code == errno.EEXIST and exists and not path.is_dir():
        do, fix = "create the folder", "it is a file: choose another path (e.g. another --workdir) or remove the file"
    elif code == errno.EEXIST:
        do, fix = "create", "choose another path or remove what is there"
    elif code == errno.ENOTDIR and path is not None:
        file = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        do = "use"
        fix = (f"{file} is a file, not a folder: " if file is not None else "") + \
            "choose another path or move the file out of the way"
    elif code == errno.EISDIR:
        do, fix = "use", "it is a folder: give the path of a file"
    elif code in (errno.EMFILE, errno.ENFILE):
        do, fix = "open", "raise the limit (ulimit -n) and run again"
    elif code == errno.ENAMETOOLONG:
        do, fix = "use", "choose a shorter path"
    elif code == errno.EIO:
        do, fix = "use", "the disk reported an error: check it (dmesg), or choose another disk"
    else:
        do, fix = "use", "check the path and the disk it is on"
    return f"cannot {do}{where}: {reason}; {fix}" if where else f"{reason}; {fix}"


def _error_line(verb: str, error: BaseException, status: int, message: str | None = None) -> int:
    if os.environ.get(DEBUG_ENV):
        raise error
    close_open_bars()
    print(f"gpt1-jax {verb}: error: {error if message is None else message}", file=sys.stderr)
    # A save that failed (full disk) leaves orbax's async writer with a coroutine nobody awaits; Python warns
    # about it at exit, after this line, and the one line the user reads would no longer be the last.
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    return status


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    simulate_devices(getattr(args, "simulate_devices", None))
    with CtrlC() as ctrl_c:
        try:
            # Multi-process start-up (flags, GPT1_* env or a cluster JAX detects); nothing on a plain machine.
            distributed.initialize(args)
            if VERBS[args.verb].runs_model:
                compile_cache.enable()  # before the first compilation (after distributed start-up)
            status = args.run(args)
        except KeyboardInterrupt as e:  # Ctrl-C, anywhere (SIGTERM stops the training loop with status 0)
            ctrl_c.caught()
            status = _interrupted_line(args, e)
        except DivergenceError as e:  # the run stopped itself, keeping its last good checkpoint
            status = _error_line(args.verb, e, 1)
        except (GPT1JaxError, FileNotFoundError) as e:  # CheckpointWriteError too: it says which checkpoints are kept
            status = _error_line(args.verb, e, 2)
        except OSError as e:  # a folder it cannot write, a full or read-only disk, a file where a folder goes...
            status = _error_line(args.verb, e, 2, _os_error_message(args, e))
    return distributed.exit_status(status)  # multi-process: a failing process leaves at once


if __name__ == "__main__":
    sys.exit(main())
