"""`gpt1-jax VERB ...`: the one command line. Every flag is declared here; each verb turns its flags into
a typed config (`gpt1_jax.config.resolve`) and makes one library call. No library module parses flags.

A flag that sets config fields is declared once, in CONFIG_FLAGS: the fields it sets, per config class,
and its help, which names those fields on every verb that takes it (docs/cli.md lists the table).
`--seed N` seeds every random choice a verb makes (initial weights, dropout, the order of the training
data, the tokens `sample` draws) and never which data is held out for evaluation; verbs that draw
nothing at random (evaluate, plan) do not take it.

The verbs that run a model (pretrain, finetune, evaluate, sample, bench, plan) share, declared once:
  --config PRESET|YAML   the run's config: a preset name or a YAML file of the verb's config class
  --set KEY=VALUE        any field of that config, dotted for nested ones (repeatable; wins over flags)
  --mesh AXIS=N,...      device mesh, e.g. data=2,fsdp=2,tensor=2
  --simulate-devices N   N CPU devices (to try meshes, or size a pod job, on one machine; on a 2-core CPU, 2
                         also train data-parallel 8-16% faster than 1: experiments/bench/README.md)
The verbs that read a model (sample, evaluate, finetune --init, convert) read the same sources, through
`load_pretrained` and `find_tokenizer`: a run workdir, a gpt1-jax or HF checkpoint folder, OpenAI's release.
Every verb also takes the multi-process flags (launch/README.md).

Errors: a project error (gpt1_jax.errors.GPT1JaxError) or an OS error (a missing file, a folder it cannot
write, a full or read-only disk) ends as the one line `gpt1-jax VERB: error: ...` on stderr, naming the
path and the fix, and exit status 2 (a diverged run: exit status 1); anything else is a bug and keeps its
traceback. Ctrl-C stops any verb in any phase with one line and exit status 130 (in training after a
checkpoint; gpt1_jax/interrupt.py); SIGTERM saves and exits 0. `verify` exits with status 1 when a
checkpoint or the run's config.yaml is damaged. GPT1_JAX_DEBUG=1 shows the traceback of a project error too.

Each verb imports its heavier library modules (orbax's checkpointing, the data pipeline, the training
loop, ...) inside its own function: `gpt1-jax --help` and a mistyped flag answer without loading them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import os
import select
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

import jax

from gpt1_jax import compile_cache, distributed, hugepages
from gpt1_jax import workdir as run_folder
from gpt1_jax.arguments import Parser, at_least, number_at_least
from gpt1_jax.config import (FINETUNE_DERIVED, OPTIMIZER_NAMES, SEED_RANGE, DataConfig, FinetuneConfig, ModelConfig,
                             PretrainConfig, TRACKER_NAMES, apply_overrides, check_not_derived, check_pretrain_schedule,
                             given_keys, guarded_text, hand_written, resolve)
from gpt1_jax.errors import (DEBUG_ENV, ConfigError, DataError, DivergenceError, GPT1JaxError, Interrupted,
                             WorkdirError, os_error_message)
from gpt1_jax.files import check_new_file, folder_problem
from gpt1_jax.integrity import DIGESTS, checkpoint_steps, newest_checkpoint, record, verify, verify_checkpoints
from gpt1_jax.interrupt import CtrlC, unwrapped_interrupts
from gpt1_jax.metrics import close_open_bars, json_safe, say
from gpt1_jax.weights import check_model_sets, convert, read_model

# ---- flags that set config fields: the one table -------------------------------------------------

class ConfigFlag(NamedTuple):
    """A flag and the config fields it sets to its value, per config class: PretrainConfig (pretrain, plan,
    bench, evaluate), FinetuneConfig (finetune), DataConfig (tokenize), ModelConfig (convert). A verb
    whose class is not listed may still take the flag as a plain argument (sample's --seed)."""
    fields: dict[type, tuple[str, ...]]
    help: str
    type: Callable[[str], Any] = str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


def on_off(text: str) -> bool:
    """A yes/no flag's value: on/true or off/false."""
    if text.lower() in ("on", "true"):
        return True
    if text.lower() in ("off", "false"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


SEED_HELP = ("one seed for every random choice the verb makes: initial weights, dropout, the order of the "
             "training data (finetune: also the --max-train-examples subset; bench: its random tokens), the tokens "
             "sample draws; never which data is held out for evaluation (data.split_seed, the --max-eval-examples "
             "subset). Default: the config's (sample: 0)")
CONFIG_FLAGS: dict[str, ConfigFlag] = {
    "--data": ConfigFlag({PretrainConfig: ("data.source",), DataConfig: ("source",)},
                         "the text: 'default' (CPython's docs), a .txt/.txt.gz file, folder or glob, tfds:NAME, "
                         "or hf:REPO (Hugging Face datasets; hf:json:FILES#FIELD for local files)"),
    "--steps": ConfigFlag({PretrainConfig: ("steps",)}, "total optimizer steps", int, "N"),
    "--batch-size": ConfigFlag({PretrainConfig: ("data.global_batch_size",), FinetuneConfig: ("batch_size",)},
                               "global batch: sequences (finetune: examples) per step", int, "N"),
    "--seq-len": ConfigFlag({PretrainConfig: ("data.seq_len",)}, "tokens per sequence", int, "N"),
    "--accum-steps": ConfigFlag({PretrainConfig: ("accum_steps",), FinetuneConfig: ("accum_steps",)},
                                "micro-batches per optimizer step", int, "N"),
    "--lr": ConfigFlag({PretrainConfig: ("optim.lr",), FinetuneConfig: ("optim.lr",)},
                       "peak learning rate (the schedule's height)", float),
    "--schedule": ConfigFlag({PretrainConfig: ("optim.schedule",)},
                             "learning-rate schedule (gpt1_jax/optim.py SCHEDULES): constant (the peak from step "
                             "0, no warmup), warmup_linear, warmup_cosine or warmup_constant", metavar="NAME"),
    "--optim": ConfigFlag({PretrainConfig: ("optim.name",)},
                          f"the optimizer: {', '.join(OPTIMIZER_NAMES)} (gpt1_jax/optim.py)", metavar="NAME"),
    "--dtype": ConfigFlag({PretrainConfig: ("model.dtype",)},
                          "compute dtype (parameters and optimizer state stay in model.param_dtype)",
                          choices=("float32", "bfloat16")),
    "--seed": ConfigFlag({PretrainConfig: ("seed", "data.seed"), FinetuneConfig: ("seed",)}, SEED_HELP,
                         at_least(SEED_RANGE[0], at_most=SEED_RANGE[1]), "N"),
    "--task": ConfigFlag({FinetuneConfig: ("task",)}, "cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli or race"),
    "--epochs": ConfigFlag({FinetuneConfig: ("epochs",)}, "passes over the training set", int, "N"),
    "--lm-coef": ConfigFlag({FinetuneConfig: ("lm_coef",)}, "weight of the auxiliary LM loss (0: off)", float),
    "--max-train-examples": ConfigFlag({FinetuneConfig: ("max_train_examples",)},
                                       "a random subset of N training examples (quick runs; 0: all)", int, "N"),
    "--max-eval-examples": ConfigFlag({FinetuneConfig: ("max_eval_examples",)},
                                      "a fixed random subset of N of each dev/test split (0: all)", int, "N"),
    "--holdout-fraction": ConfigFlag({FinetuneConfig: ("holdout_fraction",)},
                                     "hold out this share of the training set (the same examples for every seed) and "
                                     "choose the best epoch on it; dev is then only reported (0: choose on dev)",
                                     float, "F"),
    "--group-by-length": ConfigFlag({FinetuneConfig: ("group_by_length",)},
                                    "on: each training batch draws examples of near-equal length, so it pads little "
                                    "(about half the compute of a GLUE run); off: uniformly random batches, as the "
                                    "paper (default: off)", on_off, "on|off", (True, False)),
    "--profile": ConfigFlag({PretrainConfig: ("profile",), FinetuneConfig: ("profile",)},
                            "trace steps START to STOP (from 1) with jax.profiler into WORKDIR/profile/ (TensorBoard's "
                            "profile plugin, XProf, or ui.perfetto.dev); those steps are left out of tokens/s",
                            metavar="START:STOP"),
    "--tracker": ConfigFlag({PretrainConfig: ("tracker",), FinetuneConfig: ("tracker",)},
                            "where metrics go besides metrics.jsonl: tensorboard (pretrain's default), wandb (W&B, "
                            "from WANDB_* in the environment) or none (finetune's default)",
                            choices=TRACKER_NAMES),
    "--tokenizer": ConfigFlag({DataConfig: ("tokenizer",)}, "a tokenizer .json, or a vocabulary folder (OpenAI's "
                              "encoder_bpe_40000.json + vocab_40000.bpe, or HF's vocab.json + merges.txt)"),
    "--vocab-size": ConfigFlag({DataConfig: ("vocab_size",)}, "BPE merges to train (without the 3 fine-tuning markers)",
                               int, "N"),
    "--cache-dir": ConfigFlag({DataConfig: ("cache_dir",)}, "the token cache (default: ~/.cache/gpt1_jax/tokens)"),
    "--wait": ConfigFlag({DataConfig: ("cache_wait_s",)}, "seconds to wait for another process building the same cache",
                         float, "S"),
    "--n-heads": ConfigFlag({ModelConfig: ("n_heads",)},
                            "head count of an original release (its files do not record it; default: d_model / 64)",
                            int, "N"),
}


def _flag(p, config: type | None, name: str, *aliases: str, note: str | None = None, **kwargs) -> None:
    """Declares CONFIG_FLAGS[name] on `p` for a verb whose config is `config`: its help says which fields it
    sets (`note` adds what is particular to the verb), and `_overrides` sets them. `config` None: a plain
    argument the verb reads itself."""
    flag = CONFIG_FLAGS[name]
    fields = flag.fields.get(config, ())
    text = flag.help + (f"; {note}" if note else "") + (f" [sets {', '.join(fields)}]" if fields else "")
    spec = {"type": flag.type, "metavar": flag.metavar, "choices": flag.choices, "default": None, **kwargs}
    p.add_argument(name, *aliases, help=text, **spec)
    if fields:  # by flag, not by dest: a verb's own argument may share a dest (bench --steps)
        p.set_defaults(config_flags=(*(p.get_default("config_flags") or ()), name))


def _overrides(args: argparse.Namespace, config: type) -> list[str]:
    """`field=value` for each field of `config` that the given CONFIG_FLAGS set, then `--set`'s, so that
    `--set` wins. Values are JSON (a YAML subset): a path spelled `off` or `1e3` stays a string."""
    sets = []
    for name in getattr(args, "config_flags", ()):
        value = getattr(args, name[2:].replace("-", "_"))
        if value is not None:
            sets += [f"{field}={json.dumps(value)}" for field in CONFIG_FLAGS[name].fields[config]]
    return sets + list(getattr(args, "set", ()))


# ---- flags shared by several verbs ----------------------------------------------------------------

def _add_set(parser, text: str) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=text)


def _model_flags(refused: Iterable[str] = ()) -> argparse.ArgumentParser:
    """The flags of every verb that runs a model, as an argparse parent. A verb's `refused` ones are still parsed,
    so that passing one says why it does not apply, but its --help does not list them."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("run config (shared by every verb that runs a model)")

    def helps(flag: str, text: str) -> str:
        return argparse.SUPPRESS if flag in refused else text

    g.add_argument("--config", default=None, metavar="PRESET|YAML",
                   help=helps("config", "a preset name or a YAML file of the verb's config (default: the workdir's "
                                        "saved config where there is one, else the config's defaults)"))
    _add_set(g, helps("set", "any config field, dotted for nested ones: optim.lr=3e-4, model.dtype=bfloat16 "
                             "(repeatable; applied after the other flags)"))
    g.add_argument("--mesh", default=None, metavar="AXIS=N,...",
                   help=helps("mesh", "e.g. data=2,fsdp=2,tensor=2 (default: data over all devices); `plan` also "
                                      "takes auto"))
    g.add_argument("--simulate-devices", type=at_least(1, at_most=MAX_SIMULATED_DEVICES), default=None, metavar="N",
                   help=f"N fake CPU devices (at most {MAX_SIMULATED_DEVICES}; a pod: `plan --topology`): try a mesh, "
                   "or size a pod job, on one machine; on a 2-core CPU, 2 also train data-parallel 8-16%% faster "
                   "than 1 (experiments/bench/README.md)")
    return p


INIT_SOURCES = ("a pre-training or fine-tuning run workdir (--step picks its checkpoint), a gpt1-jax or HF "
                "checkpoint folder, or OpenAI's original release")


def _model_source_flags(p: argparse.ArgumentParser, workdir_help: str) -> None:
    """Where sample and evaluate read their model: the same sources as finetune --init and convert."""
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--workdir", help=workdir_help)
    where.add_argument("--init", metavar="SOURCE", help=INIT_SOURCES)
    p.add_argument("--step", type=at_least(0), default=None, metavar="N",
                   help="checkpoint step of a run workdir (default: the latest; a finished fine-tuning run's best "
                        "epoch, its results.json's `step`)")
    _flag(p, None, "--tokenizer", note="default: the one in the workdir or SOURCE")


def _no_progress_flag(p: argparse.ArgumentParser) -> None:
    """One flag for every verb with a long loop: a log file gets no bars or status lines; warnings still print."""
    p.add_argument("--no-progress", action="store_true", help="no progress bar or status lines (warnings still print)")


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


def _refuse(args: argparse.Namespace, verb: str, reasons: dict[str, str]) -> None:
    """A shared flag this verb cannot honour is an error, not silently ignored."""
    for flag, reason in reasons.items():
        value = getattr(args, flag)
        if value is not None and value != []:
            shown = f" {value[0]}" if isinstance(value, list) else ""  # --set's first KEY=VALUE
            raise ConfigError(f"--{flag.replace('_', '-')}{shown} does not apply to {verb}: {reason}")


def _speaks() -> bool:
    """Whether this process prints a verb's result: every process of a multi-process job computes it, and
    process 0 alone says it (N copies of one JSON line would break a script reading the job's log)."""
    return not jax.distributed.is_initialized() or jax.process_index() == 0


def _print_json(result: dict, every_process: bool = False) -> None:
    """`every_process`: a result that differs between hosts (the token cache each host reads)."""
    if every_process or _speaks():
        print(json.dumps(json_safe(result)), flush=True)


# XLA:CPU starts a thread and a client per fake device: 4,096 start in 3 s, 8,192 in 21 s, 20,000 ran for minutes
# and 100,000 aborted in C++ (pthread_create failed). A pod is sized with the TPU compiler instead (`plan`).
MAX_SIMULATED_DEVICES = 8192


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

def _pretrain_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", default=None, help="run directory: config, tokenizer, checkpoints, metrics "
                   "(a saved config.yaml there is the default --config: running again resumes); required but with "
                   "--dry-run, which writes nothing")
    # The optimizer flags set their fields only, as --set would (bench --lr once also made the schedule constant)
    for name in ("--data", "--steps", "--batch-size", "--seq-len", "--accum-steps", "--optim", "--lr", "--schedule",
                 "--seed", "--profile", "--tracker"):
        _flag(p, PretrainConfig, name)
    p.add_argument("--dry-run", action="store_true", help="compile the step for the mesh, print per-device memory "
                   "and FLOPs as one JSON line; no data, no training (size a pod job with --simulate-devices)")
    _no_progress_flag(p)


def _check_config_kept(workdir: Path) -> None:
    """A run folder with checkpoints but no config.yaml (deleted?), resumed without --config: the defaults would meet
    the checkpoints' model and tokenizer in a misleading refusal."""
    if not (workdir / "config.yaml").is_file() and newest_checkpoint(workdir / "checkpoints") is not None:
        raise WorkdirError(f"{workdir} holds checkpoints but no config.yaml (deleted?): restore it, or give the run's "
                           "own --config and flags to resume it")


def _pretrain(args: argparse.Namespace) -> int:
    if args.workdir is None and not args.dry_run:
        raise ConfigError("--workdir is required: the run's folder (only --dry-run, which writes nothing, runs "
                          "without one)")
    workdir = None if args.workdir is None else Path(args.workdir)
    if workdir is not None:  # before its config.yaml is read as ours
        run_folder.check(workdir, run_folder.Identity("pretrain"), "pretrain")
    overrides = _overrides(args, PretrainConfig)
    if not args.dry_run and "model.vocab_size" in given_keys(overrides):
        # The run would replace it with its tokenizer's size without a word (a dry run has no tokenizer: it sizes it).
        raise ConfigError("model.vocab_size follows the run's tokenizer (the BPE's entries + 3 fine-tuning markers): "
                          "set data.vocab_size for the size of the BPE trained on the corpus, or data.tokenizer")
    if args.config is None and workdir is not None:
        _check_config_kept(workdir)
    config = resolve(PretrainConfig, args.config, saved=None if workdir is None else workdir / "config.yaml",
                     overrides=overrides, mesh=args.mesh)
    check_pretrain_schedule(config, overrides, args.config)
    from gpt1_jax.pretrain import run, with_schedule_span

    if args.dry_run:
        from gpt1_jax.bench import optimizer_fields
        from gpt1_jax.sizing import dry_run

        said = functools.partial(say, who="pretrain --dry-run") if _speaks() and not args.no_progress else None
        config = with_schedule_span(config)
        _print_json({**dry_run(config, said), **optimizer_fields(config.optim)})  # bench's report of the same step
        return 0
    return _exit_status(run(config, workdir, progress=not args.no_progress))


def _exit_status(outcome) -> int:
    """A training run's outcome as the verb's exit status: finished, or stopped by SIGTERM with its checkpoint
    saved (a scheduler's pre-emption: the same command resumes), 0; diverged, its error line and 1."""
    if outcome.status == "diverged":
        raise outcome.divergence()
    return 0


# ---- plan -----------------------------------------------------------------------------------------

def _plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default=None, metavar="GEN:SHAPE",
                   help="a TPU slice to compile for, no TPU needed: v5e:16x16, v5p:8x8x8, v4:4x4x4, v6e:16x16 "
                        "(needs pip install -e \".[tpu]\"); default: the visible devices (e.g. one GPU host)")
    p.add_argument("--num-slices", type=int, default=1, metavar="N",
                   help="N slices of --topology joined over DCN (multi-slice; the data axis spans them)")
    _flag(p, PretrainConfig, "--batch-size")
    _flag(p, PretrainConfig, "--seq-len")
    p.add_argument("--compile-top", type=int, default=3, metavar="K",
                   help="with --mesh auto: how many of the analytically best candidates to compile (default 3); "
                        "the best of each tensor size near the top are compiled too")
    p.add_argument("--skip-baselines", action="store_true",
                   help="with --mesh auto: do not also compile the data-only and fsdp-only meshes (faster on big pods)")


def _plan(args: argparse.Namespace) -> int:
    """One JSON line on stdout, a short table on stderr; a plan that does not fit: one line, exit 2."""
    from gpt1_jax import plan

    mesh_auto = args.mesh == "auto"
    if args.compile_top < 1:
        raise ConfigError(f"--compile-top must be >= 1, got {args.compile_top}")
    config = resolve(PretrainConfig, args.config, overrides=_overrides(args, PretrainConfig),
                     mesh=None if mesh_auto else args.mesh)
    where = plan.target(args.topology, args.num_slices)
    # every process of a job (a TPU VM's workers, launch/tpu.sh) compiles the plan; process 0 alone says it
    speaks = _speaks()
    status = functools.partial(say, who="plan") if speaks else (lambda line: None)
    status(f"compiling the train step for {where.name} ({len(where.devices)} x {where.device_kind})")
    if mesh_auto:
        result = plan.auto(config, where, compile_top=args.compile_top, baselines=not args.skip_baselines,
                           progress=status)
    else:
        result = plan.plan(config, where)
    if speaks:
        print(plan.table(result), file=sys.stderr, flush=True)
    _print_json(result)
    return 0


# ---- finetune -------------------------------------------------------------------------------------

def _finetune_flags(p: argparse.ArgumentParser) -> None:
    _flag(p, FinetuneConfig, "--task", required=True)
    p.add_argument("--init", required=True, metavar="SOURCE",
                   help=f"{INIT_SOURCES}; none (random init), or scratch:DIR (random init with DIR's architecture "
                        f"and tokenizer)")
    p.add_argument("--step", type=at_least(0), default=None, metavar="N",
                   help="checkpoint step of an --init run workdir (default: its latest; a finished fine-tuning "
                        "run's best epoch, its results.json's `step`)")
    p.add_argument("--workdir", required=True, help="where config, results.json and predictions go")
    p.add_argument("--data-dir", default=None,
                   help="GLUE's TSV distribution (<dir>/<Task>/{train,dev,test}.tsv) or, for race, race.tar.gz; "
                        "default: download through tensorflow-datasets")
    _flag(p, None, "--tokenizer", note="default: the one in SOURCE; for --init none, a BPE trained on the task's "
                                       "training text")
    for name in ("--epochs", "--batch-size", "--accum-steps", "--lr", "--lm-coef", "--seed", "--max-train-examples",
                 "--max-eval-examples", "--holdout-fraction", "--group-by-length", "--profile", "--tracker"):
        _flag(p, FinetuneConfig, name)
    p.add_argument("--predict-test", action="store_true", help="also write GLUE's submission file DIR/<Task>.tsv")
    p.add_argument("--tfds-dir", default=None,
                   help="where tensorflow-datasets prepares GLUE (default: ~/.cache/gpt1_jax/tfds)")
    _no_progress_flag(p)


def _finetune(args: argparse.Namespace) -> int:
    from gpt1_jax.finetune import run

    overrides = _overrides(args, FinetuneConfig)
    # a flag, --set, or a hand-written --config file (one written before config.yaml had its guard line holds the
    # placeholders FinetuneConfig's optim has: not given)
    placeholders = {k: getattr(FinetuneConfig().optim, k.removeprefix("optim.")) for k in FINETUNE_DERIVED}
    given = given_keys(overrides) | {k for k, v in hand_written(args.config, FinetuneConfig).items()
                                     if k not in placeholders or v != placeholders[k]}
    check_not_derived(given)  # the placeholder total (1) refused a large warmup; a small one was replaced silently
    if "task" in given_keys(args.set):  # it won over --task: `--task rte --set task=cola` fine-tuned CoLA
        raise ConfigError("--set task=...: the task is --task's; give it there")
    source = Path(args.init.removeprefix("scratch:"))
    if args.init != "none" and source.is_dir():  # its architecture is the files' own (scratch: too)
        check_model_sets(source, [f"{k.removeprefix('model.')}=" for k in sorted(given) if k.startswith("model.")],
                         preset=args.config)
    # The run folder's own config is the default, as --help says (only a fine-tuning run's: another job's folder is
    # refused by the run itself, in one line)
    held = run_folder.read(args.workdir) if Path(args.workdir).is_dir() else None
    saved = Path(args.workdir) / "config.yaml" if held is not None and held.kind == "finetune" else None
    if saved is not None and args.config is None:
        _check_config_kept(Path(args.workdir))
    config = resolve(FinetuneConfig, args.config, saved=saved, overrides=overrides, mesh=args.mesh)
    return _exit_status(run(config, Path(args.workdir), init=args.init, init_step=args.step, data_dir=args.data_dir,
                            tokenizer=args.tokenizer, predict_test=args.predict_test,
                            progress=not args.no_progress, tfds_dir=args.tfds_dir))


# ---- sample and evaluate: a model from --workdir or --init -----------------------------------------

class _Model(NamedTuple):
    config: ModelConfig
    params: Any
    tokenizer: Any  # a GPT1Tokenizer
    tokenizer_path: str  # where a data pipeline reads the same tokenizer
    step: int | None  # a run workdir's checkpoint; None for a checkpoint folder


def _open_model(args: argparse.Namespace, runtime: ModelConfig | None, sets: list[str]) -> _Model:
    """The model --workdir or --init names (INIT_SOURCES), read as finetune --init and convert read theirs:
    read_model gives the architecture its files record, run as `runtime` runs (None: as saved) with
    `sets` (model fields: run-time ones, or any on an original release); find_tokenizer gives --tokenizer,
    else the one in the folder."""
    from gpt1_jax.tokenizer import find_tokenizer

    source = Path(args.workdir or args.init)
    # the step read, to say which checkpoint it was: of a run training now, the newest when the read began can be
    # deleted under it (keep_checkpoints=1); read_model then reads the next
    model_config, params, step = read_model(source, runtime, step=args.step, overrides=sets)
    tokenizer = find_tokenizer(args.tokenizer, source, model_vocab_size=model_config.vocab_size)
    if tokenizer is None:
        raise FileNotFoundError(f"{source}: no tokenizer in it; pass --tokenizer")
    return _Model(model_config, params, tokenizer, args.tokenizer or str(source), step)


def _model_sets(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the `model.*` overrides, as load_pretrained takes them, the others)."""
    model = [o.strip().removeprefix("model.") for o in overrides if o.strip().startswith("model.")]
    return model, [o for o in overrides if not o.strip().startswith("model.")]


def _runtime(args: argparse.Namespace) -> ModelConfig | None:
    """How --config runs a model (its dtype, attention, ...); for OpenAI's release, which records no config,
    also its architecture (e.g. --config gpt1). None: as the model's files say."""
    return None if args.config is None else resolve(PretrainConfig, args.config).model


def _evaluate_flags(p: argparse.ArgumentParser) -> None:
    _model_source_flags(p, "a pre-training run directory (refuses any other run; --init takes every source)")
    _flag(p, None, "--data", note="default: a pre-training run's own validation split (other sources need it)")
    _flag(p, PretrainConfig, "--batch-size", note="default: the run's, else --config's")
    _flag(p, PretrainConfig, "--seq-len", note="default: the run's, else the model's whole context (n_positions)")
    p.add_argument("--max-batches", type=at_least(0), default=0, metavar="N", help="stop after this many batches (0: all)")
    _no_progress_flag(p)


def _evaluate(args: argparse.Namespace) -> int:
    """A pre-training run is evaluated as it was configured (its saved config.yaml, its validation split);
    any other model source on --data, in windows of its whole context, with --config's other settings."""
    from gpt1_jax.evaluate import evaluate, pretraining_run

    source = Path(args.workdir or args.init)
    run = args.workdir is not None or pretraining_run(source, required=False)
    if run:
        _refuse(args, "evaluate", {"config": "the run's saved config.yaml is used; change its fields with --set"})
        pretraining_run(source, required=True)
    elif args.data is None and source.exists():  # a source that is not there: reading it says so, below
        raise ConfigError(f"--init {source} is not a pre-training run, so it has no validation split of its own: "
                          "pass --data (a text source)")
    base = resolve(PretrainConfig, args.config, saved=source / "config.yaml" if run else None)
    sets, others = _model_sets(_overrides(args, PretrainConfig))
    model = _open_model(args, _runtime(args), sets)
    data = base.data if run else dataclasses.replace(base.data, seq_len=model.config.n_positions)
    config = apply_overrides(dataclasses.replace(base, model=model.config, data=data), others)
    result = evaluate(config, model.params, run=source if run else None, data=args.data,
                      tokenizer=model.tokenizer_path, max_batches=args.max_batches, progress=not args.no_progress)
    _print_json({"source": str(source), "step": model.step, **result})
    return 0


def _sample_flags(p: argparse.ArgumentParser) -> None:
    _model_source_flags(p, "a run directory (its latest checkpoint and tokenizer)")
    _flag(p, None, "--seed")
    p.add_argument("--prompt", default="the", help="text to continue")
    p.add_argument("--max-new-tokens", type=at_least(1), default=40)
    p.add_argument("--temperature", type=number_at_least(0.0), default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=at_least(0), default=40, help="0 = the whole vocabulary")
    p.add_argument("--num-samples", type=at_least(1), default=3)
    _no_progress_flag(p)


def _sample(args: argparse.Namespace) -> int:
    """--config / --set model.* give how the checkpoint runs (model.dtype, model.attention, ...)."""
    from gpt1_jax.generate import check_room, sample
    from gpt1_jax.tokenizer import SPECIAL_TOKENS

    sets, others = _model_sets(args.set)
    if others:
        raise ConfigError(f"--set {others[0]} does not apply to sample: it takes model.* fields (how the checkpoint "
                          "runs)")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:  # bytes Python could not decode in this locale (it keeps them as lone surrogates)
        try:  # UTF-8 bytes read under a C/POSIX locale: the argument's own bytes say what was typed
            args.prompt = os.fsencode(args.prompt).decode("utf-8")
        except UnicodeDecodeError:
            raise DataError("--prompt is not UTF-8 text: give the prompt in UTF-8") from None
    model = _open_model(args, _runtime(args), sets)
    prompt_ids = model.tokenizer.encode(args.prompt)
    if prompt_ids:  # an empty prompt is sample's own one-line error
        check_room(model.config, len(prompt_ids), args.max_new_tokens, flag="--max-new-tokens ")
    step = "" if model.step is None else f" step {model.step}"
    how = "greedy (temperature 0)" if args.temperature == 0 else f"temperature {args.temperature}, top-k {args.top_k}"
    if _speaks() and prompt_ids:  # before the one compiled program that generates it all (a minute on 117M)
        print(f"# {Path(args.workdir or args.init)}{step}, {how}", flush=True)
    if _speaks() and prompt_ids and not args.no_progress:
        print(f"sample: generating {args.max_new_tokens} tokens x {args.num_samples} "
              f"sample{'s' * (args.num_samples > 1)} ...", file=sys.stderr, flush=True)
    markers = [model.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]  # fine-tuning's inputs, never text
    outputs = sample(model.config, model.params, prompt_ids, max_new_tokens=args.max_new_tokens,
                     temperature=args.temperature, top_k=args.top_k, seed=args.seed or 0, num_samples=args.num_samples,
                     never=[i for i in markers if i is not None])
    if _speaks():
        for ids in outputs:
            print(f"{args.prompt} >> {model.tokenizer.decode(ids)}")
    return 0


# ---- convert --------------------------------------------------------------------------------------

def _convert_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", nargs="?", help=INIT_SOURCES + " (or --init)")
    p.add_argument("dst", nargs="?", help="output directory (must not exist or be empty, unless --overwrite; or --out)")
    # The flags every other verb reads a model with and writes a file with: `convert --init X --out Y` was refused
    # as "unrecognized arguments: --init --out".
    p.add_argument("--init", default=None, metavar="SRC", help="SRC, as sample, evaluate and finetune take it")
    p.add_argument("--out", default=None, metavar="DST", help="DST")
    p.add_argument("--to", choices=("hf", "jax"), default="hf", help="output format (default: hf)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty DST")
    p.add_argument("--step", type=at_least(0), default=None,
                   help="checkpoint step of a run workdir (default: the latest; a finished fine-tuning run's best "
                        "epoch, its results.json's `step`)")
    _flag(p, ModelConfig, "--n-heads")
    _add_set(p, "a model config field: run-time ones (dtype, scan_layers, ...) anywhere, any on an original release")


def _convert_paths(args: argparse.Namespace) -> tuple[str, str]:
    """(SRC, DST) from the positional arguments and --init / --out: the positionals fill, in order, what the flags
    leave."""
    given = [a for a in (args.src, args.dst) if a is not None]
    wanted = [name for name, flag in (("SRC", args.init), ("DST", args.out)) if flag is None]
    if len(given) != len(wanted):
        if len(given) < len(wanted):
            missing = wanted[len(given):]
            said = f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing"
        else:
            extra = given[len(wanted):]
            said = f"{' '.join(extra)}: {'a path' if len(extra) == 1 else 'paths'} too many"
        raise ConfigError(f"convert needs the model it reads and the folder it writes, once each: {said}; "
                          "gpt1-jax convert SRC DST, or --init SRC --out DST")
    rest = iter(given)
    return (args.init if args.init is not None else next(rest)), (args.out if args.out is not None else next(rest))


def _convert(args: argparse.Namespace) -> int:
    # Every other verb spells a model field `model.dtype`; here the config is the model's own: both spellings go.
    overrides = [o.removeprefix("model.") for o in _overrides(args, ModelConfig)]
    args.src, args.dst = _convert_paths(args)
    config, out, step = convert(args.src, args.dst, to=args.to, overwrite=args.overwrite, overrides=overrides,
                                step=args.step)
    tokenizer = "with its tokenizer" if (out / "tokenizer.json").is_file() else "without a tokenizer (none in SRC)"
    read = "" if step is None else f" from {args.src} step {step}"  # a run's: its newest, or its best epoch
    print(f"wrote {args.to} checkpoint of {config.num_params():,} parameters ({config.n_layers} layers x "
          f"{config.d_model}) {tokenizer}{read} to {out}")
    return 0


# ---- verify ---------------------------------------------------------------------------------------

def _verify_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True,
                   help="a pre-training or fine-tuning run directory, or a `convert --to jax` folder")
    p.add_argument("--record-missing", action="store_true",
                   help="trust the checkpoints (or a `convert --to jax` folder's weights) saved without digests "
                        "(before gpt1-jax recorded them) and record their digests now, so runs resume from them")


def _verify(args: argparse.Namespace) -> int:
    """One line per checkpoint; exit status 1 if any is damaged."""
    directory = Path(args.workdir) / "checkpoints"
    if not Path(args.workdir).exists():
        raise FileNotFoundError(f"{args.workdir} does not exist: give a run's workdir")
    if not directory.is_dir() and (Path(args.workdir) / "params").is_dir():
        return _verify_weights_folder(Path(args.workdir), args.record_missing)
    if not directory.is_dir():
        raise FileNotFoundError(f"{args.workdir}: no checkpoints/ folder (not a run directory)")
    if args.record_missing:
        from gpt1_jax.checkpoint import unreadable

        for step in checkpoint_steps(directory):
            if not (directory / str(step) / DIGESTS).exists():
                problem = unreadable(directory, step)
                if problem is None:
                    record(directory / str(step))
                print(f"step {step}: " + ("digests recorded (saved without them)" if problem is None else
                                          f"not recorded: it does not read back ({problem})"), flush=True)
    if not checkpoint_steps(directory):
        raise FileNotFoundError(f"{directory}: no checkpoint")
    damaged = 0
    for step, problem in verify_checkpoints(directory):
        damaged += problem is not None
        print(f"step {step}: " + ("ok" if problem is None else f"damaged: {problem}"), flush=True)
    config_problem = _config_problem(Path(args.workdir) / "config.yaml")
    print(f"config.yaml: {config_problem or 'ok'}", flush=True)
    return 1 if config_problem or damaged else 0


def _verify_weights_folder(folder: Path, record_missing: bool) -> int:
    """A `convert --to jax` folder: its weights (params/) against their digests, as a run's checkpoints."""
    params = folder / "params"
    if not (params / DIGESTS).exists():
        if not record_missing:
            print(f"params: no {DIGESTS} (written before `convert --to jax` kept digests: --record-missing records "
                  "them once it reads back)", flush=True)
            return 1
        read_model(folder)  # a folder that does not read back is one error line, and nothing is recorded
        record(params)
        print("params: digests recorded (written without them)", flush=True)
    problem = verify(params)
    print("params: " + ("ok" if problem is None else f"damaged: {problem}"), flush=True)
    config_problem = _config_problem(folder / "config.yaml")
    print(f"config.yaml: {config_problem or 'ok'}", flush=True)
    return 1 if config_problem or problem else 0


def _config_problem(path: Path) -> str | None:
    """What is wrong with a run's config.yaml (its guard, see gpt1_jax/config.py), or None."""
    if not path.is_file():
        return "missing"
    try:
        guarded_text(path)
    except ConfigError as e:
        return str(e).removeprefix(f"{path} ")
    return None


# ---- tokenize -------------------------------------------------------------------------------------

def _tokenize_flags(p: argparse.ArgumentParser) -> None:
    # The fields are the job's data.* ones: the cache key is made of them.
    _flag(p, DataConfig, "--data", required=True, note="spelled as the job spells it: part of the cache key")
    _flag(p, DataConfig, "--tokenizer", required=True, metavar="JSON|VOCAB_DIR|train",
          note="or 'train': a BPE trained on --data into --workdir, as pretrain does")
    p.add_argument("--workdir", default=None, help="with --tokenizer train: the run directory that keeps tokenizer.json")
    p.add_argument("--config", default=None, metavar="PRESET|YAML",
                   help="the pre-training config the job will run, whose data.* this builds (default: the workdir's "
                        "saved config where there is one, else pretrain's defaults): its BPE size is the preset's")
    _flag(p, DataConfig, "--vocab-size", note="with --tokenizer train (default: --config's, as pretrain trains it)")
    for name in ("--cache-dir", "--wait"):
        _flag(p, DataConfig, name)
    _no_progress_flag(p)


def _tokenize(args: argparse.Namespace) -> int:
    """Build the token cache a job would build, ahead of it: one JSON line. Run on several processes
    (a pod), process 0 tokenises and the others wait for it, as inside a job; each says which cache it read."""
    from gpt1_jax.data.pipeline import tokenize_source

    if args.tokenizer == "train" and args.workdir is None:
        raise ConfigError("--tokenizer train needs --workdir (where pretrain will look for tokenizer.json)")
    if args.tokenizer != "train" and (args.workdir, args.vocab_size) != (None, None):
        raise ConfigError("--workdir and --vocab-size go with --tokenizer train only")
    if args.workdir is not None:  # the BPE goes where a pre-training run will look for it
        run_folder.check(Path(args.workdir), run_folder.Identity("pretrain"), "tokenize")
    # The job's own data config, so the BPE and the cache keys are pretrain's (its size follows the preset's model:
    # a bare DataConfig trained 40,478 tokens, `--config gpt1` 40,475, and pretrain trained its own again).
    job = resolve(PretrainConfig, args.config, saved=None if args.workdir is None else Path(args.workdir) / "config.yaml")
    config = apply_overrides(dataclasses.replace(job.data, progress=not args.no_progress), _overrides(args, DataConfig))
    t0 = time.perf_counter()
    _, _, stream = tokenize_source(config, args.workdir)
    _print_json({"cache": str(stream.path), "n_tokens": len(stream), "n_docs": stream.meta["n_docs"],
                 "bytes": sum(f.stat().st_size for f in stream.path.iterdir()),
                 "seconds": round(time.perf_counter() - t0, 3), "from_cache": stream.from_cache},
                every_process=True)  # each host says which cache it reads, and whether it built it
    return 0


# ---- bench ----------------------------------------------------------------------------------------

def _bench_flags(p: argparse.ArgumentParser) -> None:
    _flag(p, PretrainConfig, "--batch-size", "--batch", note="--batch: its older spelling")
    _flag(p, PretrainConfig, "--seq-len", "--seq", note="--seq: its older spelling")
    for name in ("--dtype", "--accum-steps", "--optim", "--lr", "--schedule", "--seed"):
        _flag(p, PretrainConfig, name)
    p.add_argument("--steps", type=int, default=5, help="timed steps (bench's own count, not the config's steps)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps after compilation")
    p.add_argument("--compile-only", action="store_true", help="compile and report time, memory and FLOPs; do not run")
    p.add_argument("--peak-flops", type=number_at_least(0.0, above=True), default=None,
                   help="peak FLOP/s for MFU (default: the accelerator's table entry, or a measured matmul)")
    _no_progress_flag(p)


def _bench(args: argparse.Namespace) -> int:
    from gpt1_jax import bench

    config = resolve(PretrainConfig, args.config, overrides=_overrides(args, PretrainConfig), mesh=args.mesh)
    _print_json(bench.run(config, steps=args.steps, warmup=args.warmup, compile_only=args.compile_only,
                          peak_flops=args.peak_flops, progress=not args.no_progress))
    return 0


# ---- predict --------------------------------------------------------------------------------------

def _predict_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True,
                   help="a finished fine-tuning run (finetune --workdir): its config, tokenizer and the best epoch's "
                        "checkpoint (results.json's step)")
    p.add_argument("input", metavar="INPUT",
                   help="a TSV whose header names the task's text columns as GLUE's dev/test files do (rte: sentence1, "
                        "sentence2; sst2: sentence; mrpc: '#1 String', '#2 String'), in any order, other columns "
                        "ignored (a label, say); its index column, if any, names the output rows (else 0, 1, ...). "
                        "cola and sst2 also take plain text, one input per line. - reads standard input")
    p.add_argument("--format", choices=("auto", "tsv", "text"), default="auto",
                   help="how INPUT is read: tsv; text (one input per line); auto (default): a TSV when its first line "
                        "holds a tab or is the task's one column name (sentence), else text")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="write the predictions to FILE, whole or not at all (default: standard output)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out FILE")
    p.add_argument("--batch-size", type=at_least(1), default=None, metavar="N",
                   help="inputs per batch, a multiple of the device count (default: the run's eval batch size)")
    _no_progress_flag(p)


def _predict(args: argparse.Namespace) -> int:
    """`index<TAB>prediction` lines, GLUE's submission layout with label names (STS-B: the score), on standard output
    or in --out FILE; a bar of the batches and a closing line on stderr."""
    from gpt1_jax.predict import predict, write_tsv

    if args.overwrite and args.out is None:
        raise ConfigError("--overwrite goes with --out FILE")
    if args.out is not None:  # before the model runs
        check_new_file(Path(args.out), args.overwrite)
    result = predict(args.workdir, args.input, fmt=args.format, batch_size=args.batch_size,
                     progress=not args.no_progress)
    if not _speaks():
        return 0
    if args.out is None:
        sys.stdout.write(result.tsv())
        sys.stdout.flush()
    else:
        write_tsv(result, args.out, overwrite=args.overwrite)
    if not args.no_progress:
        run = result.run
        say(f"{len(result.values)} predictions of {run.workdir} epoch {run.epoch} (step {run.step})"
            f"{'' if args.out is None else f' -> {args.out}'}", who=f"predict {run.task.name}")
    return 0


# ---- compare --------------------------------------------------------------------------------------

def _compare_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="pre-training run workdirs (one draws its curves alone)")
    p.add_argument("--out", default="compare.png", metavar="FILE",
                   help="the figure, in the format its suffix names (.png, .pdf, .svg; default: compare.png here); an "
                        "existing file is replaced only with --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def _compare_out(out: Path, overwrite: bool) -> None:
    """Refuses a figure that would replace a file nobody said to replace, or that matplotlib cannot write (its
    error named neither --out nor the formats it knows)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    check_new_file(out, overwrite)
    if out.suffix.lstrip(".").lower() not in formats:
        raise ConfigError(f"--out {out}: name a figure file ending in one of {', '.join('.' + f for f in formats)}")
    if problem := folder_problem(out):
        raise ConfigError(f"--out {out}: {problem}")


def _compare(args: argparse.Namespace) -> int:
    """The runs' losses against tokens seen in one figure, and a table of where each ended on stdout."""
    from gpt1_jax.metrics import comparison_table, plot_comparison, read_run

    if len({Path(run).resolve() for run in args.runs}) < len(args.runs):
        raise ConfigError("a run is given twice: name each run once")
    runs = [read_run(run) for run in args.runs]
    out = Path(args.out)
    _compare_out(out, args.overwrite)
    plot_comparison(runs, out)
    print(comparison_table(runs), flush=True)
    say(f"figure: {out}", who="compare")
    return 0


# ---- the command line -----------------------------------------------------------------------------

class Verb(NamedTuple):
    help: str
    add_flags: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    runs_model: bool = True
    # Steps long enough for glibc's huge-page tunable to pay for re-executing the process (gpt1_jax/hugepages.py).
    huge_pages: bool = False
    # Shared model flags the verb never honours, and why: kept out of its --help, an error when passed.
    refuses: dict[str, str] = {}


VERBS: dict[str, Verb] = {
    "pretrain": Verb("pre-train GPT-1 on a text corpus (resumable; the main job)", _pretrain_flags, _pretrain,
                     huge_pages=True),
    "evaluate": Verb("LM loss and perplexity of a model (a pre-training run, any checkpoint folder, OpenAI's "
                     "release) on a text source", _evaluate_flags, _evaluate,
                     refuses={"mesh": "evaluation runs on the run's mesh, or data-parallel over all devices"}),
    "sample": Verb("generate text from a checkpoint", _sample_flags, _sample,
                   refuses={"mesh": "sampling runs on one device"}),
    "convert": Verb("convert checkpoints between the original release, HF and gpt1-jax", _convert_flags, _convert,
                    runs_model=False),
    "bench": Verb("time the sharded train step and print one JSON line", _bench_flags, _bench, huge_pages=True),
    "plan": Verb("compile the train step for a TPU pod (or the visible devices): HBM fit, collectives, roofline "
                 "step time; --mesh auto picks the mesh", _plan_flags, _plan),
    "finetune": Verb("fine-tune on a GLUE task or RACE with the auxiliary LM loss; results.json + predictions",
                     _finetune_flags, _finetune, huge_pages=True),
    "verify": Verb("check every checkpoint of a run against the digests recorded when it was saved",
                   _verify_flags, _verify, runs_model=False),
    "tokenize": Verb("build a corpus's token cache ahead of a job (once, however many processes); one JSON line",
                     _tokenize_flags, _tokenize, runs_model=False),
    "compare": Verb("overlay pre-training runs' losses against tokens seen in one figure; a table of each run's end",
                    _compare_flags, _compare, runs_model=False),
    "predict": Verb("a finished fine-tuning run's classifier on new inputs (a TSV, or plain text one input a line): "
                    "index<TAB>prediction lines", _predict_flags, _predict,
                    refuses={"config": "the run's own config.yaml is used", "set": "the run's own config.yaml is used",
                             "mesh": "predictions run data-parallel over all devices"}),
}


class _PrintVersions(argparse.Action):
    """argparse's own version action wraps its text at the terminal's width and reads it on every start-up."""

    def __call__(self, parser, namespace, values, option_string=None):
        versions = run_folder.software()  # what a run records in its run.json
        package, python = versions.pop("gpt1-jax"), versions.pop("python")
        print(f"gpt1-jax {package} ({', '.join(f'{name} {v}' for name, v in versions.items())}; Python {python})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations: `evaluate --init DIR` must not be read as `--init-timeout DIR`.
    parser = Parser(prog="gpt1-jax", description=__doc__.split(". ")[0] + ".", allow_abbrev=False)
    parser.add_argument("--version", action=_PrintVersions, nargs=0,
                        help="this package's version and those of the libraries that decide its numbers, then exit")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    multi_process = _distributed_flags()
    for name, verb in VERBS.items():
        parents = [_model_flags(verb.refuses), multi_process] if verb.runs_model else [multi_process]
        p = sub.add_parser(name, help=verb.help, description=verb.help, parents=parents, allow_abbrev=False)
        verb.add_flags(p)
        p.set_defaults(run=verb.run)
    return parser


def _last_checkpoint(args: argparse.Namespace) -> int | None:
    """The newest finished checkpoint of a training verb's workdir (None: none, or not a training verb)."""
    if args.verb not in ("pretrain", "finetune") or args.workdir is None:  # None: a dry run's
        return None
    return newest_checkpoint(Path(args.workdir) / "checkpoints")


def _interrupted_line(args: argparse.Namespace, error: KeyboardInterrupt) -> int:
    """Ctrl-C: one line saying what state things are in, exit status 130 (128 + SIGINT, as a shell says)."""
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


def _error_line(verb: str, error: BaseException, status: int, message: str | None = None) -> int:
    if os.environ.get(DEBUG_ENV):
        raise error
    close_open_bars()
    print(f"gpt1-jax {verb}: error: {error if message is None else message}", file=sys.stderr)
    # A save that failed (full disk) leaves orbax's async writer with a coroutine nobody awaits; Python warns
    # about it at exit, after this line, and the one line the user reads would no longer be the last.
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    return status


# The flags that name a folder or file: '~' is the home folder in each, as in the shell, and as in --data and the
# config's paths (a quoted '~/run' made a folder named '~', whose model then met the home folder's tokenizer).
PATH_FLAGS = ("workdir", "init", "config", "data_dir", "tfds_dir", "tokenizer", "src", "dst", "out", "runs",
              "input")


def _home(value: str) -> str:
    prefix = "scratch:" if value.startswith("scratch:") else ""  # --init scratch:DIR
    path = value.removeprefix(prefix)
    return prefix + os.path.expanduser(path) if path.startswith("~") else value


def _expand_home(args: argparse.Namespace) -> None:
    for name in PATH_FLAGS:
        value = getattr(args, name, None)
        if isinstance(value, str):
            setattr(args, name, _home(value))
        elif isinstance(value, list):  # compare's RUNs
            setattr(args, name, [_home(v) for v in value])


def _standard_streams() -> None:
    """A stream closed when the command started (`2>&-`): /dev/null in its place, so that writing to it does not end
    a run half-made, and no file the run opens takes its descriptor (and XLA's log lines with it). Text that the
    terminal's encoding cannot show is escaped, not an error."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
    for name, fd in (("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "w", closefd=False))
        stream = getattr(sys, name)
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no descriptor (a caller's stand-in for stdout)
        return False


def _start_backend() -> None:
    """JAX_PLATFORMS naming hardware this machine lacks ends inside JAX in a traceback (a bare AssertionError for
    cuda): one line instead, before anything is read or written."""
    try:
        jax.devices()
    except (RuntimeError, AssertionError) as e:
        asked = os.environ.get("JAX_PLATFORMS")
        why = str(e).split(" (set JAX_PLATFORMS")[0].splitlines()[0] if str(e) else "no such device on this machine"
        raise ConfigError(f"JAX cannot start {f'JAX_PLATFORMS={asked}' if asked else 'its backend'}: {why}") from None


def _out_of_memory(e: BaseException, kept: int | None) -> str:
    """A batch too large for the device (`--batch-size 100000`) ended in XLA's RESOURCE_EXHAUSTED traceback."""
    said = str(e).splitlines()[0].removeprefix("RESOURCE_EXHAUSTED: ").rstrip(".")
    return (f"the device ran out of memory ({said}): lower --batch-size (training: or split each step with "
            "--accum-steps), or spread the model over more devices (--mesh)"
            + (f"; checkpoint {kept} is kept" if kept is not None else ""))


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a command line: the process is the command's alone
        # What the imports made (~120,000 objects: jax, flax, optax, ...) lives as long as the process; frozen, the
        # cyclic collector stops walking it at every full pass. A tiny pre-training run spent 0.34 of its 3.4 CPU-s
        # in collections, 0.20 with it (2026-11-30). Not in a caller's process (a test calling main): its garbage
        # would stay frozen with it.
        gc.freeze()
    _standard_streams()
    args = build_parser().parse_args(argv)
    _expand_home(args)
    if argv is None and VERBS[args.verb].huge_pages:  # a command line, not a call from Python
        hugepages.reexec_with_huge_pages()
    simulate_devices(getattr(args, "simulate_devices", None))
    with CtrlC() as ctrl_c:
        try:
            with unwrapped_interrupts():  # one that JAX's C++ wrapped in another error is Ctrl-C all the same
                _refuse(args, args.verb, VERBS[args.verb].refuses)  # before any process waits on the others
                # Multi-process start-up (flags, GPT1_* env or a cluster JAX detects); nothing on a plain machine.
                distributed.initialize(args)
                if VERBS[args.verb].runs_model:
                    _start_backend()
                    compile_cache.enable()  # before the first compilation (after distributed start-up)
                status = args.run(args)
        except KeyboardInterrupt as e:  # Ctrl-C, anywhere (SIGTERM stops the training loop with status 0)
            ctrl_c.caught()
            status = _interrupted_line(args, e)
            if isinstance(e, Interrupted) and e.together:  # the others saved this step too and end with it
                return status
        except DivergenceError as e:  # the run stopped itself, keeping its last good checkpoint
            status = _error_line(args.verb, e, 1)
        except BrokenPipeError as e:
            if not _stdout_gone():  # another pipe (a helper process, a socket): an error like any other
                status = _error_line(args.verb, e, 2, os_error_message(e, _last_checkpoint(args)))
            else:  # the reader of the output went away (`| head -1`): quiet, as `yes | head -1` is
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())  # nor a second error at exit, flushing what is left
                os.close(devnull)
                status = 128 + signal.SIGPIPE
        except GPT1JaxError as e:  # CheckpointWriteError too: it says which checkpoints are kept
            status = _error_line(args.verb, e, 2)
        except OSError as e:  # a folder it cannot write, a full or read-only disk, a file where a folder goes...
            status = _error_line(args.verb, e, 2, os_error_message(e, _last_checkpoint(args)))
        except jax.errors.JaxRuntimeError as e:
            if not str(e).startswith("RESOURCE_EXHAUSTED"):
                raise
            status = _error_line(args.verb, e, 2, _out_of_memory(e, _last_checkpoint(args)))
    return distributed.exit_status(status)  # multi-process: a failing process leaves at once


if __name__ == "__main__":
    sys.exit(main())
