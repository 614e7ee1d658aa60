"""Every typed config of the project, its named presets, YAML files and `key=value` overrides.

Every config is a frozen dataclass, so a config is a value: it can be hashed, passed to `jax.jit` as a
static argument and written to a workdir as YAML. Bad values fail here, with one line naming the
field, instead of as a shape error deep inside a compiled program.

  ModelConfig      GPT-1's architecture and how it runs (dtype, attention, scan, remat)
  OptimConfig      optimizer and schedule by name (gpt1_jax/optim.py builds them)
  MeshConfig       mesh axis sizes and logical-rule overrides (gpt1_jax/sharding.py builds the mesh)
  DataConfig       the pre-training text pipeline (gpt1_jax/data/pipeline.py)
  PretrainConfig   one pre-training run (`gpt1-jax pretrain`), presets `small`, `tiny`, `gpt1`
  FinetuneConfig   one fine-tuning run (`gpt1-jax finetune`)
`resolve` is the one place a run's config is assembled: preset or YAML < saved config < flags < `--set`.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar

import yaml

from gpt1_jax.errors import ConfigError
from gpt1_jax.files import atomic_write_text

T = TypeVar("T")

DTYPES = ("float32", "bfloat16", "float16")
MAX_VOCAB = 1 << 22  # BPE entries: far above any GPT's vocabulary, far below what exhausts memory in training it
# What every consumer takes: the train step carries the seed as an int32 (gpt1_jax/step.py Trainer.hyper) and
# numpy's generators refuse negative ones (fine-tuning's subsets and order); beyond, an OverflowError mid-run.
SEED_RANGE = (0, (1 << 31) - 1)
ATTENTION_IMPLS = ("auto", "xla", "xla_blocked", "dot_product", "cudnn")
REMAT_POLICIES = ("none", "full", "dots", "attention")

# How a model runs, not which weights it has: free to differ between a checkpoint and the run using it.
# (`scan_layers` changes the parameter tree's layout; weights.py converts between the two layouts.)
RUNTIME_FIELDS = ("dtype", "param_dtype", "attention", "scan_layers", "remat", "embd_dropout", "attn_dropout",
                  "resid_dropout")


def check_seeds(config, prefix: str, names: tuple[str, ...]) -> None:
    for name in names:
        if not SEED_RANGE[0] <= getattr(config, name) <= SEED_RANGE[1]:
            raise ConfigError(f"{prefix}{name} must be between {SEED_RANGE[0]} and {SEED_RANGE[1]}, got "
                              f"{getattr(config, name)}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """GPT-1's hyper-parameters (docs/gpt1.md). Field names follow the paper, not HF's `n_*` names."""

    vocab_size: int = 40478
    n_positions: int = 512
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_mlp: int = 3072
    embd_dropout: float = 0.1
    attn_dropout: float = 0.1
    resid_dropout: float = 0.1
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02
    dtype: str = "float32"  # compute dtype of matmuls and activations
    param_dtype: str = "float32"  # storage dtype of parameters (and so of the optimizer state)
    attention: str = "auto"  # see gpt1_jax.attention.causal_attention
    # Unrolled blocks by default: on CPU the unrolled step ran 11-16% faster in fp32 and 26-50% in bf16 at
    # 117M (experiments/bench/README.md), for ~3 s more compilation; scan keeps compile time flat in depth.
    scan_layers: bool = False
    remat: str = "none"  # rematerialisation per block: none | full | dots | attention (only the attention core)

    def __post_init__(self):
        positive = ("vocab_size", "n_positions", "d_model", "n_layers", "n_heads", "d_mlp")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}")
        for name in ("embd_dropout", "attn_dropout", "resid_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 < self.layer_norm_eps < math.inf:  # LayerNorm divides by sqrt(var + eps): NaN from step 1
            raise ConfigError(f"model.layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if not 0 <= self.init_std < math.inf:
            raise ConfigError(f"model.init_std must be >= 0, got {self.init_std}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ConfigError(f"model.{name}={getattr(self, name)!r} is not one of {', '.join(DTYPES)}")
        if self.attention not in ATTENTION_IMPLS:
            raise ConfigError(f"model.attention={self.attention!r} is not one of {', '.join(ATTENTION_IMPLS)}")
        if self.attention == "cudnn" and self.dtype == "float32":  # cuDNN's flash kernel has no float32
            raise ConfigError("model.attention='cudnn' needs model.dtype=bfloat16 or float16, got float32; "
                              "or set attention=auto")
        if self.remat not in REMAT_POLICIES:
            raise ConfigError(f"model.remat={self.remat!r} is not one of {', '.join(REMAT_POLICIES)}")

    def architecture(self) -> dict[str, Any]:
        """The fields that define the weights (everything but RUNTIME_FIELDS)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in RUNTIME_FIELDS}

    def with_runtime_of(self, other: ModelConfig) -> ModelConfig:
        """This architecture, run as `other` runs (its dtype, dropout, attention, scan, remat)."""
        return dataclasses.replace(self, **{n: getattr(other, n) for n in RUNTIME_FIELDS})

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def num_params(self) -> int:
        """All parameters (embeddings included), as the release counts them: 116,534,784 for `gpt1`."""
        d, f, L = self.d_model, self.d_mlp, self.n_layers
        block = (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 4 * d
        return self.vocab_size * d + self.n_positions * d + L * block


MODEL_PRESETS: dict[str, ModelConfig] = {
    # The released 117M model.
    "gpt1": ModelConfig(),
    # A few million parameters: CPU pre-training experiments with a corpus-trained 8k BPE.
    "small": ModelConfig(vocab_size=8192, n_positions=256, d_model=256, n_layers=4, n_heads=4, d_mlp=1024),
    # Tests: compiles and runs in seconds.
    "tiny": ModelConfig(vocab_size=512, n_positions=64, d_model=64, n_layers=2, n_heads=4, d_mlp=256),
    # GPT-1's architecture (vocabulary, 512 positions, post-LN blocks, tied head), wider and deeper, at
    # GPT-3's shapes for those sizes: pod-scale plans (experiments/scale/). bf16 compute over fp32
    # parameters, and layers scanned so compile time stays flat in depth, as pods run them.
    "gpt1-350m": ModelConfig(d_model=1024, n_layers=24, n_heads=16, d_mlp=4096, dtype="bfloat16", scan_layers=True),
    "gpt1-1.3b": ModelConfig(d_model=2048, n_layers=24, n_heads=16, d_mlp=8192, dtype="bfloat16", scan_layers=True),
    "gpt1-6.7b": ModelConfig(d_model=4096, n_layers=32, n_heads=32, d_mlp=16384, dtype="bfloat16", scan_layers=True),
    "gpt1-13b": ModelConfig(d_model=5120, n_layers=40, n_heads=40, d_mlp=20480, dtype="bfloat16", scan_layers=True),
}


def model_preset(name: str) -> ModelConfig:
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}") from None


# The names `optim.name` and `optim.schedule` may take. What each means lives beside its code, in
# gpt1_jax/optim.py's OPTIMIZERS and SCHEDULES; that module imports this one, so the names are kept here
# (as LOGICAL_AXES and TASK_NAMES below are), and tests/unit/test_config.py holds each tuple to its registry.
# OPTIMIZER_READS: the OptimConfig fields each optimizer's builder reads besides OPTIM_SHARED, which all of them read
# (the schedule, clipping, decay). A field given to an optimizer that ignores it trained without effect while
# config.yaml recorded it (check_optim_reads); tests/e2e/test_optim.py holds the table to the builders' updates.
OPTIM_SHARED = ("name", "lr", "schedule", "warmup_steps", "total_steps", "weight_decay", "clip_norm")
OPTIMIZER_READS: dict[str, tuple[str, ...]] = {
    "gpt1_adam": ("state_dtype",),  # b1, b2, eps: the paper's, GPT1_ADAM (check_given_optim)
    "adamw": ("b1", "b2", "eps", "state_dtype"),
    "lion": ("b1", "b2", "state_dtype"),
    "adafactor": ("adafactor_decay_rate", "adafactor_momentum", "state_dtype"),
    "sgd": ("momentum", "state_dtype"),
    "sgd_nesterov": ("momentum", "state_dtype"),
    "muon": ("b1", "b2", "eps", "state_dtype", "muon_beta", "muon_ns_steps", "muon_consistent_rms",
             "muon_adam_lr_ratio"),  # b1, b2 and eps also for the AdamW half
    "schedule_free_adamw": ("b2", "eps", "sf_b1", "sf_weight_lr_power"),  # no first moment for state_dtype to narrow
    "lamb": ("b1", "b2", "eps", "state_dtype"),
}
OPTIMIZER_NAMES = tuple(OPTIMIZER_READS)
# state_dtype narrows first moments (optim.py NARROWED_STATE); these optimizers keep one only while this field is > 0
FIRST_MOMENT_FIELD = {"adafactor": "adafactor_momentum", "sgd": "momentum", "sgd_nesterov": "momentum"}
SCHEDULE_NAMES = ("warmup_linear", "warmup_cosine", "warmup_constant", "constant")
DECAYING_SCHEDULES = ("warmup_linear", "warmup_cosine")  # to 0 at total_steps; the other two hold the peak lr
TRACKER_NAMES = ("tensorboard", "wandb", "none")  # gpt1_jax/tracker.py


GPT1_ADAM = (0.9, 0.999, 1e-8)  # Adam's b1, b2, eps in GPT-1 (the defaults below; gpt1_adam pins them)


def override_key(item: str) -> str:
    """The dotted key a `key=value` override sets."""
    return item.partition("=")[0].strip()


def given_keys(overrides) -> set[str]:
    """The dotted keys a list of `key=value` overrides sets (`optim={lr: 1e-3}` sets optim.lr)."""
    keys = set()
    for o in overrides:
        key, raw = override_key(o), o.partition("=")[2]
        try:  # a mapping in either YAML form (`optim={lr: 1e-3}`, `optim=lr: 1e-3`)
            value = read_yaml(raw) if raw.strip() else None
        except yaml.YAMLError:  # apply_overrides says so
            value = None
        if value is None and "." not in key:  # `optim=null`: nothing given for the section (apply_overrides)
            continue
        keys |= {key} if not isinstance(value, dict) else {f"{key}.{k}" for k in flat_fields(value)}
    return keys


def flat_fields(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's nested dict as {"optim.lr": ..., ...}."""
    out = {}
    for k, v in values.items():
        out.update(flat_fields(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


# What a fine-tuning run derives from its data (gpt1_jax/finetune.py): a value given for it was replaced silently.
FINETUNE_DERIVED = ("optim.total_steps", "optim.warmup_steps")


def check_not_derived(given: set[str]) -> None:
    """Refuses (one line) a fine-tuning setting the run derives, of the keys a user gave: `gpt1-jax finetune`'s and
    the experiments' tables' (a sweep's --set of one was replaced in every run without a word)."""
    if derived := sorted(given & set(FINETUNE_DERIVED)):
        raise ConfigError(f"{derived[0]} is derived in fine-tuning: total_steps from --epochs and the training "
                          "examples, warmup_steps from warmup_fraction (the paper's 0.2%): set those instead")


def _given(field: str, given: set[str] | None) -> bool:
    """Whether `optim.<field>` is one a user gave (None: every one, a YAML file of theirs)."""
    return given is None or "optim" in given or f"optim.{field}" in given


def check_given_optim(optim: OptimConfig, given: set[str] | None = None) -> None:
    """Settings a user gives (a flag, --set, a YAML file: `given` None) and would train without effect, or on NaN,
    are refused; only those given, so a run saved otherwise stays readable and resumable. gpt1_adam trains with
    GPT1_ADAM whatever the config says (config.yaml recorded the other b2, training used 0.999); lr 0 trains
    nothing; eps 0 divides by zero where a gradient is exactly 0 (an unused embedding row)."""
    for name in ("lr", "eps"):
        if _given(name, given) and not getattr(optim, name) > 0:
            raise ConfigError(f"optim.{name} must be a finite number > 0, got {getattr(optim, name)}")
    if any(_given(f, given) for f in ("name", "b1", "b2", "eps")) and optim.name == "gpt1_adam" \
            and (optim.b1, optim.b2, optim.eps) != GPT1_ADAM:
        raise ConfigError(f"optim.name=gpt1_adam is the paper's Adam, b1 {GPT1_ADAM[0]}, b2 {GPT1_ADAM[1]}, eps "
                          f"{GPT1_ADAM[2]}, got b1 {optim.b1}, b2 {optim.b2}, eps {optim.eps}: leave them out (it uses "
                          "the paper's), or set optim.name=adamw to choose them")
    if _given("adafactor_decay_rate", given) and not 0 < optim.adafactor_decay_rate <= 1:  # decay 1 - t^-rate
        raise ConfigError(f"optim.adafactor_decay_rate must lie in (0, 1], got {optim.adafactor_decay_rate}")
    if _given("sf_weight_lr_power", given) and not 0 <= optim.sf_weight_lr_power < math.inf:
        raise ConfigError(f"optim.sf_weight_lr_power must be a finite number >= 0, got {optim.sf_weight_lr_power}")
    if given is not None:  # for a file, resolve does it: with the keys the file gives, not all of them
        check_optim_reads(optim, given)


def check_optim_reads(optim: OptimConfig, given: set[str]) -> None:
    """Refuses a given `optim.*` field the run would not read (config.yaml recorded it as if it had trained with it):
    one the optimizer ignores (OPTIMIZER_READS), a warmup under the constant schedule, a state_dtype with no first
    moment to narrow; and a decaying schedule chosen with schedule-free, whose averaging stands in for the decay."""
    reads = OPTIM_SHARED + OPTIMIZER_READS[optim.name]
    if optim.name == "gpt1_adam":  # at the paper's values (check_given_optim refuses others) it trains with them
        reads += ("b1", "b2", "eps")
    for field in (f.name for f in dataclasses.fields(optim)):
        if f"optim.{field}" in given and field not in reads:
            readers = ", ".join(name for name, read in OPTIMIZER_READS.items() if field in read)
            raise ConfigError(f"optim.{field}={getattr(optim, field)} is not read by optim.name={optim.name}, only by "
                              f"{readers}: leave it out, or choose one of those")
    if "optim.warmup_steps" in given and optim.warmup_steps > 0 and optim.schedule == "constant":
        raise ConfigError(f"optim.warmup_steps={optim.warmup_steps} is not read by optim.schedule=constant (it trains "
                          "at the peak lr from the first step): set optim.schedule=warmup_constant to warm up first")
    if "optim.state_dtype" in given and (field := FIRST_MOMENT_FIELD.get(optim.name)) and getattr(optim, field) == 0:
        raise ConfigError(f"optim.state_dtype={optim.state_dtype} is not read by optim.name={optim.name} with "
                          f"optim.{field}=0 (it keeps no first moment to store): give {field} > 0, or leave it out")
    # Both given: a job's own decaying schedule (fine-tuning's warmup_linear) still trains schedule-free as asked.
    if {"optim.name", "optim.schedule"} <= given and optim.name.startswith("schedule_free") \
            and optim.schedule in DECAYING_SCHEDULES:
        raise ConfigError(f"optim.schedule={optim.schedule} decays the lr, which optim.name={optim.name} does not "
                          "want (its average of the iterates stands in for the decay): choose warmup_constant or "
                          "constant")


# The optimizers that divide by a root of second moments plus eps. Their state takes the parameters' dtype, and in
# float16 eps and the small moments are 0: each of them (tiny, lr 3e-3) had NaN parameters after its first update,
# where sgd, sgd_nesterov and lion ended 50 steps within 0.01 of their float32 losses.
SECOND_MOMENT_OPTIMIZERS = ("gpt1_adam", "adamw", "adafactor", "lamb", "schedule_free_adamw", "muon")


def check_storage(model: ModelConfig, optim: OptimConfig) -> None:
    """A training run whose optimizer cannot update parameters stored in model.param_dtype is refused."""
    if model.param_dtype == "float16" and optim.name in SECOND_MOMENT_OPTIMIZERS:
        raise ConfigError(f"model.param_dtype=float16 cannot train with optim.name={optim.name}: its state takes the "
                          f"parameters' dtype, where eps ({optim.eps:g}) and small second moments are 0, so its first "
                          "update divides by zero; keep model.param_dtype float32 (model.dtype=float16 still computes "
                          "in float16) or bfloat16, or choose sgd, sgd_nesterov or lion")


def check_pretrain_schedule(config, overrides, spec: str | None = None) -> None:
    """pretrain's schedule spans its steps (pretrain.with_schedule_span): a given optim.total_steps would be replaced
    by --steps, and a given warmup that reaches the last step by one ending before it, each without a word (and
    config.yaml recorded the replacement). Given: by a flag, --set, or a hand-written YAML file `spec` (whose
    total_steps may only repeat its own steps; a run's own config.yaml, with what the run derived, counts as a
    preset does). pretrain calls it; `bench` and `plan` time or compile steps and take the schedule as it is."""
    given = given_keys(overrides)
    if "optim.total_steps" in given:
        raise ConfigError("optim.total_steps is the run's --steps in pre-training (the schedule spans the run): "
                          "set --steps (or `steps=`) instead")
    file = hand_written(spec, PretrainConfig)
    if "optim.total_steps" in file and file["optim.total_steps"] != file.get("steps", PretrainConfig.steps):
        raise ConfigError(f"config file {spec}: optim.total_steps={file['optim.total_steps']} is not its steps "
                          f"({file.get('steps', PretrainConfig.steps)}): the schedule spans the run in pre-training; "
                          "leave optim.total_steps out and set steps")
    given |= set(file)
    optim = config.optim
    # Step k trains at the schedule's value at k - 1, and a decay starts at the peak: a warmup of steps - 1 left the
    # last step at the peak lr, decaying nothing, so a decaying schedule's warmup ends two steps before the run does.
    # warmup_constant's may end at the last step; `constant` has none (a given one is refused: check_optim_reads).
    decays = optim.schedule in DECAYING_SCHEDULES
    most = max(config.steps - 2, 0) if decays else config.steps - 1
    if _given("warmup_steps", given) and optim.schedule != "constant" and optim.warmup_steps > most:
        what = "leaves none of the run's {} steps to decay over" if decays else \
            "is as long as the run's {} steps or longer (it would end a step before the last)"
        raise ConfigError(f"optim.warmup_steps={optim.warmup_steps} {what.format(config.steps)} ({optim.schedule}): "
                          f"set it to {most} or less")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    name: str = "gpt1_adam"
    lr: float = 2.5e-4  # peak lr (pre-training value; fine-tuning used 6.25e-5)
    schedule: str = "warmup_cosine"
    warmup_steps: int = 2000
    total_steps: int = 100_000
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    clip_norm: float = 1.0  # 0 disables clipping
    # Storage dtype of the optimizer's first moments (gpt1_jax/optim.py NARROWED_STATE); updates are still computed in
    # float32. bfloat16 (MaxText's mu_dtype) takes a quarter off Adam's state, half off Lion's and SGD's momentum.
    state_dtype: str = "float32"
    momentum: float = 0.9  # sgd, sgd_nesterov
    # muon: momentum of the orthogonalised matrices, Newton-Schulz steps, update RMS matching
    # (optax's `consistent_rms`: 0.2 ~ AdamW's update RMS, so one lr suits both halves; 0 = Keller
    # Jordan's sqrt(max(1, fan_out/fan_in)) scaling, whose lr is ~10-50x AdamW's), and the lr of the
    # AdamW half (embeddings, biases, LayerNorm) as a multiple of `lr`.
    muon_beta: float = 0.95
    muon_ns_steps: int = 5
    muon_consistent_rms: float = 0.2
    muon_adam_lr_ratio: float = 1.0
    # schedule_free_adamw: b1 is the interpolation y = (1-b1) z + b1 x (the base RMS scaling uses b2, eps);
    # weight_lr_power weighs the running average by lr^power (down-weights warmup).
    sf_b1: float = 0.9
    sf_weight_lr_power: float = 2.0
    # adafactor: decay exponent of the second-moment estimate; momentum (0: none, Adafactor's default)
    adafactor_decay_rate: float = 0.8
    adafactor_momentum: float = 0.0

    def __post_init__(self):
        if self.name not in OPTIMIZER_NAMES:
            raise ConfigError(f"optim.name={self.name!r} is not one of {', '.join(OPTIMIZER_NAMES)}")
        if self.schedule not in SCHEDULE_NAMES:
            raise ConfigError(f"optim.schedule={self.schedule!r} is not one of {', '.join(SCHEDULE_NAMES)}")
        if self.state_dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"optim.state_dtype={self.state_dtype!r} is not one of float32, bfloat16")
        for name in ("lr", "eps", "weight_decay", "clip_norm", "muon_consistent_rms", "muon_adam_lr_ratio"):
            if not 0 <= getattr(self, name) < math.inf:  # nan passed a plain `< 0` test
                # lr and eps of 0 are refused where given (check_given_optim): a run saved with one stays readable
                rule = "> 0" if name in ("lr", "eps") else ">= 0"
                raise ConfigError(f"optim.{name} must be a finite number {rule}, got {getattr(self, name)}")
        for name in ("b1", "b2", "momentum", "muon_beta", "adafactor_momentum"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"optim.{name} must lie in [0, 1), got {getattr(self, name)}")
        if not 0 < self.sf_b1 < 1:
            raise ConfigError(f"optim.sf_b1 must lie in (0, 1), got {self.sf_b1}")
        for name, least in (("muon_ns_steps", 1), ("warmup_steps", 0), ("total_steps", 1)):
            if getattr(self, name) < least:
                raise ConfigError(f"optim.{name} must be >= {least}, got {getattr(self, name)}")
        if self.schedule != "constant" and self.warmup_steps > self.total_steps:
            raise ConfigError(f"optim.warmup_steps={self.warmup_steps} exceeds total_steps={self.total_steps}")


MESH_AXES = ("data", "fsdp", "tensor")
MeshAxes = str | tuple[str, ...] | None  # one logical axis -> mesh axes (None: replicated)
# The model's logical axis names, those `mesh.rules` may remap: gpt1_jax/sharding.py's DEFAULT_RULES maps each.
LOGICAL_AXES = ("batch", "vocab", "heads", "mlp", "embed", "positions", "length", "qkv", "kv", "layers")


def rule_axes(value: Any, name: str | None = None) -> MeshAxes:
    """A `mesh.rules` entry's mesh axes ("fsdp", "data,fsdp", a list of them; None, "" or "none": replicated),
    each checked against MESH_AXES, none twice; `name`: the logical axis they are for, named in the error."""
    if value in (None, "", "none", "None"):
        return None
    if not isinstance(value, (str, list, tuple)):
        raise ConfigError(f"mesh.rules: {value!r} is not mesh axes (a name such as fsdp, a list of names, or null)")
    parts = tuple(p.strip() for p in value.split(",") if p.strip()) if isinstance(value, str) else tuple(value)
    for p in parts:
        if p not in MESH_AXES:
            raise ConfigError(f"mesh.rules: unknown mesh axis {p!r}; known: {', '.join(MESH_AXES)}")
    # jax refuses such a spec (DuplicateSpecError) only once the run has written its tokenizer
    if twice := next((p for i, p in enumerate(parts) if p in parts[:i]), None):
        raise ConfigError(f"mesh.rules: {name or 'a logical axis'} maps to mesh axis {twice!r} twice "
                          f"({', '.join(parts)}); a dimension is split over each mesh axis at most once")
    return parts[0] if len(parts) == 1 else parts


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axis sizes; -1 means "all remaining devices" (at most one axis may say so)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    # Hook for multi-slice: how many slices each axis spans over DCN (1 = within one slice).
    dcn_data: int = 1
    dcn_fsdp: int = 1
    dcn_tensor: int = 1
    # Logical name -> mesh axes ("fsdp", "data,fsdp", or "" / None for replicated); replaces that
    # name's entry in DEFAULT_RULES. A mapping in YAML: `rules: {vocab: null, embed: fsdp}`.
    rules: tuple[tuple[str, MeshAxes], ...] = ()

    def __post_init__(self):
        sizes = [self.data, self.fsdp, self.tensor]
        if any(s == 0 or s < -1 for s in sizes):
            raise ConfigError(f"mesh sizes must be positive or -1, got data={self.data}, fsdp={self.fsdp}, tensor={self.tensor}")
        if sizes.count(-1) > 1:
            raise ConfigError("at most one mesh axis may be -1 (the rest of the devices)")
        if any(d < 1 for d in (self.dcn_data, self.dcn_fsdp, self.dcn_tensor)):
            raise ConfigError("mesh dcn_* sizes must be >= 1")
        if isinstance(self.rules, Mapping):  # from YAML: normalise to a hashable tuple
            object.__setattr__(self, "rules", tuple(self.rules.items()))
        elif isinstance(self.rules, list):  # a saved config.yaml writes the tuple as a list of pairs
            object.__setattr__(self, "rules", tuple(tuple(r) for r in self.rules))
        for name, axes in self.rules:
            if name not in LOGICAL_AXES:
                raise ConfigError(f"mesh.rules: unknown logical axis {name!r}; known: {', '.join(LOGICAL_AXES)}")
            rule_axes(axes, name)  # checked with the config, not once the run has written its tokenizer

    def axis_sizes(self, n_devices: int) -> dict[str, int]:
        """{'data': .., 'fsdp': .., 'tensor': ..} resolving -1, checked against the device count."""
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        known = math.prod(s for s in sizes.values() if s != -1)
        for axis, s in sizes.items():
            if s == -1:
                if n_devices % known:
                    raise ConfigError(f"mesh {self.spec()} does not divide {n_devices} devices")
                sizes[axis] = n_devices // known
        if math.prod(sizes.values()) != n_devices:
            raise ConfigError(f"mesh {self.spec()} needs {math.prod(sizes.values())} devices, have {n_devices}: give "
                              "--mesh AXIS=N,... for these (a checkpoint restores onto any mesh), or --simulate-devices")
        return sizes

    def spec(self) -> str:
        return f"data={self.data},fsdp={self.fsdp},tensor={self.tensor}"


def parse_mesh(text: str) -> MeshConfig:
    """`"data=2,fsdp=2,tensor=2"` -> MeshConfig. Unnamed axes are 1, except `data`, which takes the rest
    of the devices unless another axis says -1: `tensor=2` on 8 devices is data=4 x tensor=2."""
    values: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if key == "auto":
            raise ConfigError("--mesh auto is plan's: `gpt1-jax plan --config ... --topology ... --mesh auto` chooses "
                              "one and prints it as a --mesh for this command")
        if not sep or key not in MESH_AXES + ("dcn_data", "dcn_fsdp", "dcn_tensor"):
            raise ConfigError(f"--mesh item {item!r} is not AXIS=SIZE with AXIS one of {', '.join(MESH_AXES)} (or, "
                              "over the slices of a multi-slice job, dcn_data, dcn_fsdp, dcn_tensor)")
        try:
            values[key] = int(raw)
        except ValueError:
            raise ConfigError(f"--mesh size {raw!r} for {key} is not an integer") from None
    if "data" not in values and -1 in values.values():
        values["data"] = 1  # another axis already takes the rest
    return MeshConfig(**values)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The pre-training text pipeline (gpt1_jax/data/pipeline.py)."""

    source: str = "default"  # "default"/"pydoc", a path/dir/glob, or "tfds:NAME[/CONFIG][:SPLIT]"
    seq_len: int = 512  # GPT-1's context
    global_batch_size: int = 64  # windows per optimizer step over all processes (GPT-1: 64)
    val_fraction: float = 0.01  # share of windows held out
    split_seed: int = 0  # which windows are held out; separate from `seed` so reshuffling keeps val fixed
    seed: int = 0  # order of the train windows
    tokenizer: str = "train"  # "train" (on the source, kept in workdir), a .json, or OpenAI's vocab dir
    vocab_size: int = 40478  # BPE size when training (without the 3 fine-tuning markers)
    cache_dir: str | None = None  # token cache; None: $XDG_CACHE_HOME/gpt1_jax/tokens
    # Seconds a process waits for another to tokenise (or train the BPE) before failing: process 0 of a
    # pod job, or another job holding the cache's lock (gpt1_jax/data/once.py). ~1B tokens take minutes.
    cache_wait_s: float = 3600.0
    progress: bool = True  # tqdm bars while training the tokenizer / tokenising

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ConfigError(f"data.seq_len must be >= 1, got {self.seq_len}")
        if self.global_batch_size < 1:
            raise ConfigError(f"data.global_batch_size must be >= 1, got {self.global_batch_size}")
        if not 1 <= self.vocab_size <= MAX_VOCAB:  # a larger one ended in the BPE trainer's allocation failure
            raise ConfigError(f"data.vocab_size must be between 1 and {MAX_VOCAB:,}, got {self.vocab_size}")
        check_seeds(self, "data.", ("seed", "split_seed"))
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction must be in [0, 1), got {self.val_fraction}")
        if not self.cache_wait_s > 0:
            raise ConfigError(f"data.cache_wait_s must be > 0 seconds, got {self.cache_wait_s}")


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """Everything a pre-training run needs; written to `<workdir>/config.yaml`.

    Defaults are the `small` preset scaled for a 2-core CPU (a few minutes on the embedded corpus);
    `--config gpt1` switches to the paper's numbers (batch 64 x 512, lr 2.5e-4, 2000 warmup steps).
    `model.vocab_size` always follows the tokenizer (BPE merges + the 3 fine-tuning markers).
    """

    model: ModelConfig = MODEL_PRESETS["small"]
    optim: OptimConfig = OptimConfig(lr=1e-3, warmup_steps=30, total_steps=300)
    data: DataConfig = DataConfig(source="default", seq_len=128, global_batch_size=16, val_fraction=0.05,
                                  vocab_size=MODEL_PRESETS["small"].vocab_size - 3)
    mesh: MeshConfig = MeshConfig()
    steps: int = 300
    seed: int = 0
    accum_steps: int = 1
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    keep_steps: tuple[int, ...] = ()  # checkpoints kept for good besides the last `keep_checkpoints`
    eval_every: int = 100
    eval_batches: int = 16  # cap on validation batches per evaluation (0: the whole split)
    log_every: int = 1
    profile: str = ""  # "START:STOP": a jax.profiler trace of those steps into <workdir>/profile/ ("": none)
    stats_every: int = 0  # per-layer parameter, gradient and update norms every N steps (gpt1_jax/layer_stats.py; 0: off)
    tracker: str = "tensorboard"  # where metrics go besides metrics.jsonl: tensorboard, wandb or none (gpt1_jax/tracker.py)

    def __post_init__(self):
        if isinstance(self.keep_steps, list):  # from YAML
            object.__setattr__(self, "keep_steps", tuple(int(s) for s in self.keep_steps))
        for name in ("steps", "accum_steps", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_seeds(self, "", ("seed",))
        for name in ("checkpoint_every", "eval_every", "eval_batches", "log_every", "stats_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if any(s < 1 for s in self.keep_steps):
            raise ConfigError(f"keep_steps must list steps >= 1, got {list(self.keep_steps)}")
        if self.data.seq_len > self.model.n_positions:
            raise ConfigError(f"data.seq_len={self.data.seq_len} is longer than the model's context "
                              f"model.n_positions={self.model.n_positions}")
        check_tracker(self.tracker)
        if (window := profile_window(self.profile)) and window[1] > self.steps:
            raise ConfigError(f"profile {self.profile} ends after the run's last step ({self.steps})")


# Per-preset training defaults: the paper's for gpt1 (and its larger siblings), scaled down for the CPU presets.
_GPT1_TRAINING: dict[str, Any] = dict(
    optim=OptimConfig(lr=2.5e-4, warmup_steps=2000, total_steps=100_000), steps=100_000,
    data=DataConfig(seq_len=512, global_batch_size=64, val_fraction=0.01), eval_every=1000, checkpoint_every=1000)
_PRETRAIN_PRESETS: dict[str, dict[str, Any]] = {
    "gpt1": _GPT1_TRAINING, "gpt1-350m": _GPT1_TRAINING, "gpt1-1.3b": _GPT1_TRAINING, "gpt1-6.7b": _GPT1_TRAINING,
    "gpt1-13b": _GPT1_TRAINING,
    "small": {},
    "tiny": dict(optim=OptimConfig(lr=3e-3, warmup_steps=5, total_steps=50), steps=50,
                 data=DataConfig(seq_len=64, global_batch_size=8, vocab_size=509, val_fraction=0.05),
                 checkpoint_every=25, eval_every=25),
}


# GLUE's tasks (gpt1_jax/data/glue.py's GLUE_TASKS), then RACE (gpt1_jax/data/race.py).
TASK_NAMES = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "race")


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tuning run; written to `<workdir>/config.yaml`.

    With a pre-trained SOURCE the architecture comes from the checkpoint; `model`'s RUNTIME_FIELDS
    (dropout, dtype, attention, scan, remat) still apply. `optim.total_steps` and `optim.warmup_steps`
    are derived from the data (epochs x batches, `warmup_fraction`). Defaults are the paper's: lr 6.25e-5,
    batch 32, 3 epochs, warmup 0.2% then linear decay to 0, lm_coef 0.5, dropout 0.1 (classifier too).
    """

    task: str = "cola"
    model: ModelConfig = MODEL_PRESETS["gpt1"]
    optim: OptimConfig = OptimConfig(lr=6.25e-5, schedule="warmup_linear", warmup_steps=0, total_steps=1)
    mesh: MeshConfig = MeshConfig()
    epochs: int = 3
    batch_size: int = 32
    eval_batch_size: int = 0  # 0: batch_size
    accum_steps: int = 1
    warmup_fraction: float = 0.002
    lm_coef: float = 0.5  # λ of the auxiliary LM loss; 0 disables it (Table 5's "no aux LM")
    clf_dropout: float = 0.1
    seed: int = 0
    n_ctx: int = 0  # 0: the model's n_positions; each segment keeps n_ctx//2 - 2 tokens
    max_train_examples: int = 0  # 0: all; else a fixed random subset (quick runs)
    max_eval_examples: int = 0  # 0: all; else a fixed random subset of each dev/test split (same for every seed)
    # > 0: this share of the training set is held out (the same examples for every seed) and the best epoch is
    # chosen on it; dev is then only reported, never used to choose. 0: the best epoch by dev, as the paper.
    holdout_fraction: float = 0.0
    # True: each training batch draws examples of near-equal length (gpt1_jax/data/tasks.epoch_order), so it pads
    # little: about half the compute of a GLUE run. False: uniformly random batches, as the paper.
    group_by_length: bool = False
    race_levels: str = "middle,high"
    init_layers: int = -1  # pre-trained blocks kept (Figure 2 left); -1: all; the rest start fresh
    checkpoint_every: int = 0  # steps between checkpoints besides each epoch's end (0: epoch ends only)
    keep_checkpoints: int = 2
    profile: str = ""  # "START:STOP": a jax.profiler trace of those steps into <workdir>/profile/ ("": none)
    stats_every: int = 0  # per-layer parameter, gradient and update norms every N steps (gpt1_jax/layer_stats.py; 0: off)
    tracker: str = "none"  # besides metrics.jsonl and results.json: tensorboard, wandb or none (gpt1_jax/tracker.py)

    def __post_init__(self):
        for name in ("epochs", "batch_size", "accum_steps", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_seeds(self, "", ("seed",))
        for name in ("eval_batch_size", "n_ctx", "max_train_examples", "max_eval_examples", "checkpoint_every",
                     "stats_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.warmup_fraction <= 1:
            raise ConfigError(f"warmup_fraction must lie in [0, 1], got {self.warmup_fraction}")
        if not 0 <= self.holdout_fraction < 1:
            raise ConfigError(f"holdout_fraction must lie in [0, 1), got {self.holdout_fraction}")
        if not 0 <= self.lm_coef < math.inf:
            raise ConfigError(f"lm_coef must be a number >= 0, got {self.lm_coef}")
        if not 0 <= self.clf_dropout < 1:
            raise ConfigError(f"clf_dropout must be in [0, 1), got {self.clf_dropout}")
        if self.init_layers < -1:
            raise ConfigError(f"init_layers must be >= -1 (-1: all), got {self.init_layers}")
        object.__setattr__(self, "task", task_key(self.task))  # one spelling recorded: `RTE` and `rte` are one run
        profile_window(self.profile)  # validates (the last step is known once the task's data is read)
        check_tracker(self.tracker)


def check_tracker(name: str) -> None:
    if name not in TRACKER_NAMES:
        raise ConfigError(f"tracker={name!r} is not one of {', '.join(TRACKER_NAMES)}")


def profile_window(text: str) -> tuple[int, int] | None:
    """`profile` ("START:STOP", steps counted from 1, both profiled) -> (START, STOP); "" -> None."""
    if not text:
        return None
    try:
        first, last = (int(part) for part in str(text).split(":"))
    except ValueError:
        raise ConfigError(f"profile {text!r}: expected START:STOP, two step numbers (e.g. 10:15)") from None
    if not 1 <= first <= last:
        raise ConfigError(f"profile {text!r}: expected 1 <= START <= STOP")
    return first, last


def task_key(name: str) -> str:
    """A fine-tuning task's canonical name (`SST-2` -> `sst2`), or one error line naming the known ones."""
    key = name.lower().replace("-", "")
    if key not in TASK_NAMES:
        raise ConfigError(f"unknown task {name!r}; known: {', '.join(TASK_NAMES)}")
    return key


def preset(cls: type[T], name: str) -> T:
    """A run config of `cls` (PretrainConfig or FinetuneConfig) for the model preset `name`."""
    model = model_preset(name)
    if cls is PretrainConfig:
        base = PretrainConfig(model=model, **_PRETRAIN_PRESETS.get(name, {}))
        # BPE merges = the model's vocabulary less the 3 markers, so the table size is what the preset says.
        return dataclasses.replace(base, data=dataclasses.replace(base.data, vocab_size=model.vocab_size - 3))
    return cls(model=model)


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Turns a YAML/CLI value into the field's declared type (strings from `key=value` included)."""
    kind = typing.get_origin(annotation) or annotation
    if kind in (typing.Union, types.UnionType):  # `str | None` and the like: null (or None, as Python spells it)
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None or value == "None":
            if len(options) < len(typing.get_args(annotation)):
                return None
        for option in options:
            try:
                return _coerce(value, option, key)
            except ConfigError:
                pass
        names = [getattr(typing.get_origin(a) or a, "__name__", str(a)) for a in typing.get_args(annotation)]
        raise ConfigError(f"{key} must be {' or '.join(n.replace('NoneType', 'null') for n in names)}, got {value!r}")
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        return from_dict(kind, value, prefix=f"{key}.")
    if kind is tuple:
        return _coerce_tuple(value, typing.get_args(annotation), key)
    if isinstance(value, str) and kind in (int, float):
        try:  # YAML 1.1 reads "1e-4" as a string; Python's parsers do not
            value = kind(value)
        except ValueError:
            raise ConfigError(f"{key} must be {kind.__name__}, got {value!r}") from None
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, float) and math.isnan(value):  # compares false with every bound
        raise ConfigError(f"{key} must be a number, got nan")
    if kind in (int, float, str) and not (isinstance(value, kind) and not isinstance(value, bool)):
        raise ConfigError(f"{key} must be {kind.__name__}, got {value!r}")
    return value


def _coerce_tuple(value: Any, items: tuple, key: str) -> tuple:
    """A YAML list (or, for pairs such as mesh.rules, a mapping) -> the field's tuple, each item coerced."""
    if isinstance(value, Mapping):
        value = list(value.items())
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list, got {value!r}")
    if len(items) == 2 and items[1] is Ellipsis:
        return tuple(_coerce(v, items[0], f"{key}[{i}]") for i, v in enumerate(value))
    if len(value) != len(items):
        raise ConfigError(f"{key} must hold {len(items)} items, got {value!r}")
    return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, items)))


def from_dict(cls: type[T], values: dict[str, Any], prefix: str = "") -> T:
    """Builds `cls` from a plain mapping, naming the first unknown or ill-typed key."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:  # a file's misspelt key: only its own level is at hand here
            raise _unknown_key(f"{prefix}{key}", names, [f"{prefix}{name}" for name in names])
    return cls(**{k: _coerce(v, hints[k], prefix + k) for k, v in values.items()})


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def _spanned(values: dict[str, Any]) -> dict[str, Any]:
    """A pre-training schedule spans the run's steps (pretrain.with_schedule_span, which also ends the warmup
    before them): a --set optim.warmup_steps above the preset's total was refused against a total the run
    replaces anyway. (A total given by the user is refused by check_pretrain_schedule.)"""
    if "steps" in values and isinstance(values.get("optim"), dict):
        optim = values["optim"]
        steps, warmup = values["steps"], optim.get("warmup_steps", 0)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (steps, warmup)):  # else from_dict says so
            optim["total_steps"] = max(steps, warmup, 1)
    return values


def _unknown_key(key: str, level: Iterable[str], every: list[str]) -> ConfigError:
    """`unknown config key` with what it likely meant of `every` dotted key: the same name in another section (`lr`
    -> `optim.lr`) or the closest spelling (`model.n_layer` -> `model.n_layers`); then the names of `level`, the
    level it reached."""
    name = key.rsplit(".", 1)[-1]
    meant = [k for k in every if k.rsplit(".", 1)[-1] == name] or difflib.get_close_matches(key, every, n=1, cutoff=0.8)
    hint = f" (did you mean {' or '.join(meant)}?)" if meant else ""
    return ConfigError(f"unknown config key {key!r}{hint}; known: {', '.join(sorted(level))}")


def apply_overrides(config: T, overrides: list[str] | tuple[str, ...]) -> T:
    """`["d_model=128", "optim.lr=1e-3"]` -> a new config; dotted keys reach nested dataclasses."""
    values = to_dict(config)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        *parents, leaf = key.strip().split(".")
        node = values
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise _unknown_key(key.strip(), node, list(flat_fields(values)))
            node = node[part]
        if leaf not in node:
            raise _unknown_key(key.strip(), node, list(flat_fields(values)))
        try:
            value = read_yaml(raw) if raw.strip() else raw
            # `model=null` or `model=`: nothing given for the section, as `model:` in a file (_merged). Sections are
            # top-level only: a field that holds a mapping (mesh.rules) set to null is the field's value, as before
            if not parents and isinstance(node[leaf], dict) and (value is None or not raw.strip()):
                continue
            # a mapping for a section sets those fields, as a YAML file's section does (it replaced the whole section
            # with the class's defaults: `--set model={n_layers: 1}` was GPT-1's full width)
            section = isinstance(value, dict) and isinstance(node[leaf], dict)
            node[leaf] = _merged(node[leaf], value) if section else value
        except yaml.YAMLError as e:
            why = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({why})") from None
    config = from_dict(type(config), _spanned(values))
    given = given_keys(overrides)
    if hasattr(config, "optim") and any(k == "optim" or k.startswith("optim.") for k in given):
        check_given_optim(config.optim, given)
    return config


# A run's own config.yaml is guarded like its checkpoints: the first line marks a file gpt1-jax wrote, the
# last holds the sha256 of everything above it. A file cut short or damaged then names itself on resume
# instead of filling the lost fields with defaults. Files without the first line (hand-written configs,
# runs saved before the guard) are read as they are.
GUARD_LINE = ("# gpt1-jax run config, guarded by the sha256 on its last line: change fields with --set KEY=VALUE "
              "(to keep a hand edit, delete this line)\n")
_DIGEST_PREFIX = "# sha256 "


class _ConfigLoader(yaml.SafeLoader):
    """YAML as configs read it: `10:15` stays a string (YAML 1.1 reads digits around colons as one base-60
    number, 615), integers are decimal, and a key given twice is an error rather than the last one silently."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):  # `? [a, b]` or `{[a]: 1}`: a TypeError in `seen` below
                kind = {"dict": "mapping"}.get(type(key).__name__, type(key).__name__)  # still empty here: no repr
                raise yaml.constructor.ConstructorError(None, None, f"a key must be a name, not a {kind}",
                                                        key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


_ConfigLoader.yaml_implicit_resolvers = {  # PyYAML's int and float resolvers, less their base-60 forms
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
# Integers are decimal, as YAML 1.2 and every flag read them: YAML 1.1 read `010` as 8 (`--seed 010` was 10).
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9][0-9_]*$"), list("-+0123456789"))
_ConfigLoader.add_constructor("tag:yaml.org,2002:int",
                              lambda loader, node: int(loader.construct_scalar(node).replace("_", ""), 10))
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


class _ConfigDumper(yaml.SafeDumper):
    """YAML as configs write it: a string that _ConfigLoader would read as a number (`08`, a corpus file's name;
    YAML 1.1 writes it bare, being no 1.1 int) is quoted, so a run's config.yaml reads back as it was."""


_ConfigDumper.yaml_implicit_resolvers = _ConfigLoader.yaml_implicit_resolvers


def read_yaml(text: str) -> Any:
    """A config's YAML (a file's text or a `key=value` override's value) -> plain Python values."""
    return yaml.load(text, Loader=_ConfigLoader)


def _is_empty(text: str) -> bool:
    """Whether a YAML file's text holds nothing but blank lines and comments (it reads as null)."""
    return all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines())


def guarded_text(path: Path) -> str:
    """The YAML of `path`, verified against its digest line when it carries the guard line."""
    data = path.read_bytes()
    text = data.decode("utf-8", errors="replace")
    if not text.startswith(GUARD_LINE):
        if _is_empty(text):  # it read as the defaults: a run resumed as another model, with misleading errors
            raise ConfigError(f"{path} is empty: restore it, or start the run in another folder")
        return text
    body, _, last = text.rstrip("\n").rpartition("\n")
    if not last.startswith(_DIGEST_PREFIX):
        raise ConfigError(f"{path} is cut short (its closing sha256 line is missing): restore it from a copy, or "
                          "start a new run in another folder")
    if hashlib.sha256((body + "\n").encode("utf-8")).hexdigest() != last[len(_DIGEST_PREFIX):].strip():
        raise ConfigError(f"{path} is damaged or was edited by hand (it no longer matches the sha256 on its last "
                          "line): restore it, or delete its first line to accept it as it is")
    return body


def read_config_file(path: str | Path, *, given: bool = False) -> dict[str, Any]:
    """A YAML config file's mapping, as written (guarded files verified), or one line saying what is wrong.
    `given`: a file of the user's `--config` (else a run's own config.yaml), whose fix differs when it is empty."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} " + ("is a folder, not a file" if path.is_dir() else "does not exist"))
    if given and _is_empty(path.read_text(encoding="utf-8", errors="replace")):
        raise ConfigError(f"config file {path} is empty: write in it the settings to change (e.g. `seed: 1`), "
                          f"or give --config a preset ({', '.join(MODEL_PRESETS)})")
    try:
        values = read_yaml(guarded_text(path)) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        why = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML: {why}{where}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must hold a mapping at its top level")
    return values


def _merged(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` over `base`, section by section (a section given in part keeps the rest of `base`'s)."""
    out = dict(base)
    for key, value in given.items():
        if value is None and isinstance(out.get(key), dict):  # `model:` with every line commented out: left out
            continue
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_yaml(cls: type[T], path: str | Path, over: T | None = None, *, given: bool = False) -> T:
    """`cls` from a YAML file (`given`: the user's `--config`, see read_config_file); the fields it leaves out are
    `over`'s (a run's defaults), else the classes'."""
    values = read_config_file(path, given=given)
    return from_dict(cls, values if over is None else _spanned(_merged(to_dict(over), values)))


def save_yaml(config: Any, path: str | Path) -> None:
    """Atomically (readers see the old file or the new one), with the guard and digest lines."""
    body = GUARD_LINE + yaml.dump(to_dict(config), Dumper=_ConfigDumper, sort_keys=False)
    atomic_write_text(Path(path), body + f"{_DIGEST_PREFIX}{hashlib.sha256(body.encode('utf-8')).hexdigest()}\n")


def hand_written(spec: str | None, cls: type | None = None) -> dict[str, Any]:
    """The dotted keys and values a `--config` YAML file written by hand gives ({} for a preset, nothing, or a run's
    own config.yaml, derived fields included: its guard line marks what gpt1-jax wrote, and one saved before the
    guard, or with it deleted, holds every field of `cls`, as no file written by hand does)."""
    if not is_config_file(spec) or written_by_gpt1_jax(spec):
        return {}
    values = read_config_file(spec, given=True)
    if cls is not None and {f.name for f in dataclasses.fields(cls)} <= set(values):
        return {}
    return flat_fields({k: v for k, v in values.items() if v is not None})  # `optim: null` gives nothing (_merged)


def written_by_gpt1_jax(path: str | Path) -> bool:
    """Whether the file starts with GUARD_LINE (a config.yaml gpt1-jax wrote)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(len(GUARD_LINE)) == GUARD_LINE
    except OSError:
        return False


def is_config_file(spec: str | None) -> bool:
    """Whether `--config SPEC` names a YAML file (else a preset, or nothing)."""
    return spec is not None and spec not in MODEL_PRESETS and (spec.endswith((".yaml", ".yml")) or Path(spec).is_file())


def resolve(cls: type[T], spec: str | None, *, saved: str | Path | None = None, overrides=(), mesh: str | None = None) -> T:
    """The one way a run's config is assembled, each step over the one before:
    `spec` (a preset name or a YAML file of `cls`; None: `saved` if it exists, else the default) <
    `mesh` (`--mesh data=2,fsdp=2`: the axis sizes; the rules stay) < `overrides` (`key=value`, flags first,
    then `--set`, which wins over everything)."""
    if spec is None and saved is not None and Path(saved).is_file():
        config = load_yaml(cls, saved)
    elif spec is None:
        config = cls()
    elif spec in MODEL_PRESETS:
        config = preset(cls, spec)
    elif is_config_file(spec):
        # the fields a file leaves out are those the job runs by default
        config = load_yaml(cls, spec, over=cls(), given=True)
    else:
        raise ConfigError(f"--config {spec!r}: not a preset ({', '.join(MODEL_PRESETS)}) nor a YAML file")
    if mesh:
        config = dataclasses.replace(config, mesh=dataclasses.replace(parse_mesh(mesh), rules=config.mesh.rules))
    config = apply_overrides(config, list(overrides))
    if hasattr(config, "optim") and is_config_file(spec):  # the file's settings with the flags': `optim: {b2: 0.95}`
        check_given_optim(config.optim)                      # and `--set optim.name=adamw` was refused as gpt1_adam's
        check_optim_reads(config.optim, set(hand_written(spec, cls)) | given_keys(overrides))
    return config
