"""The one training engine: a pure step built from an init function and a loss function, compiled and
sharded by `Trainer`.

    loss_fn(params, batch, rng, deterministic) -> (loss_sum, weight_sum, aux_sums)

Sums, not means: micro-batches, devices and evaluation batches then add up to exactly the large
batch's loss, and the mean is taken once (`loss_sum / weight_sum`). `aux_sums` is a dict of further
sums reported beside the loss (e.g. the task and LM parts of a fine-tuning loss). The LM objective
(`lm_functions`) is one such pair; each fine-tuning head is another (gpt1_jax/heads.py).

The step is pure: the dropout key is `fold_in(fold_in(key(seed), step), micro_batch)`, so a resumed run
replays the same masks. `Trainer` wraps it in `jax.jit` with out shardings from gpt1_jax/sharding.py and
donates the old state; inputs carry their shardings (`put_batch`, `init`, checkpoint restore).

The peak lr and the dropout seed are arguments of the compiled programs (`Hyper`), not constants in them:
the runs of a sweep that differ only in lr or seed (Table 5's grid and seeds, the optimizer study's lr
ladder) share one compilation, in this process and in the persistent cache.

Mixed precision comes from ModelConfig: `dtype` is the compute dtype (activations, matmul inputs),
`param_dtype` the storage dtype of params, and so of gradients and the optimizer state. The LM logits
and the losses are always float32 (docs/numerics.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gpt1_jax import sharding as shd
from gpt1_jax.config import ConfigError, MeshConfig, ModelConfig, OptimConfig
from gpt1_jax.layer_stats import layer_stats
from gpt1_jax.model import GPT1, init_params
from gpt1_jax.optim import make_optimizer, make_schedule

# Leaves are [B, ...] arrays, the batch axis first. LM batches: "inputs" [B, T] int32, "targets" [B, T]
# int32 (the next tokens), optional "weights" [B, T] float per target (0 for padding).
Batch = dict[str, jax.Array]
LossFn = Callable[..., tuple[jax.Array, jax.Array, dict[str, jax.Array]]]


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: number of updates applied
    params: Any  # unboxed arrays in param_dtype
    opt_state: Any


# ---- the LM objective ------------------------------------------------------------------------------

def lm_batch(windows_BT1) -> Batch:
    """[B, T+1] token windows -> {"inputs", "targets"}: every position predicts its next token."""
    return {"inputs": windows_BT1[:, :-1], "targets": windows_BT1[:, 1:]}


def lm_loss_sums(logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array):
    """(sum of weighted cross-entropies, sum of weights)."""
    losses_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT)
    weights_BT = weights_BT.astype(jnp.float32)
    return jnp.sum(losses_BT * weights_BT), jnp.sum(weights_BT)


@functools.lru_cache(maxsize=64)
def lm_functions(config: ModelConfig) -> tuple[Callable, LossFn]:
    """(init_fn, loss_fn) of next-token prediction for `config`. Cached, so equal configs give the same
    function objects and jax's caches (keyed by identity) reuse their compilations."""
    model = GPT1(config)

    def init_fn(rng):
        return init_params(config, rng)

    def loss_fn(params, batch, rng, deterministic):
        variables = {"params": params}
        rngs = {} if deterministic else {"dropout": rng}
        # both uses of the tied table read one copy per batch group: its two gradients cross devices once, not each
        table_GVD = model.apply(variables, method=GPT1.group_table)
        h_BTD = model.apply(variables, batch["inputs"], deterministic=deterministic, rngs=rngs, table_GVD=table_GVD)
        logits_BTV = model.apply(variables, h_BTD, table_GVD, method=GPT1.logits)
        weights_BT = batch.get("weights")
        if weights_BT is None:
            weights_BT = jnp.ones(batch["targets"].shape, jnp.float32)
        loss_sum, weight_sum = lm_loss_sums(logits_BTV, batch["targets"], weights_BT)
        return loss_sum, weight_sum, {}

    return init_fn, loss_fn


# ---- gradients -----------------------------------------------------------------------------------

def _split_micro(x_B, accum_steps: int):
    """[B, ...] -> [k, B/k, ...] taking rows j, j+k, j+2k, ... for micro-batch j: each micro-batch then
    draws rows from every data shard, so no device idles while another holds a whole micro-batch."""
    B = x_B.shape[0]
    return jnp.swapaxes(x_B.reshape(B // accum_steps, accum_steps, *x_B.shape[1:]), 0, 1)


def accumulated(loss_fn: LossFn, accum_steps: int):
    """`loss_fn` -> fn(params, batch, rng) -> ((loss_sum, weight_sum, aux_sums), grads of loss_sum), the
    batch run as `accum_steps` sequential micro-batches whose summed gradients equal the whole batch's."""
    grad_fn = jax.value_and_grad(lambda p, b, r: _as_aux(loss_fn(p, b, r, False)), has_aux=True)

    def one(params, batch, rng):
        (loss_sum, (weight_sum, aux)), grads = grad_fn(params, batch, rng)
        return (loss_sum, weight_sum, aux), grads

    if accum_steps == 1:
        return one

    def many(params, batch, rng):
        micro = jax.tree.map(lambda x: _split_micro(x, accum_steps), batch)

        def body(carry, xs):
            i, mb = xs
            mb = {k: nn.with_logical_constraint(v, ("batch",) + (None,) * (v.ndim - 1)) for k, v in mb.items()}
            sums, grads = one(params, mb, jax.random.fold_in(rng, i))
            return jax.tree.map(jnp.add, carry, (sums, grads)), None

        zero_sums, zero_grads = jax.eval_shape(one, params, jax.tree.map(lambda x: x[0], micro), rng)
        init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (zero_sums, zero_grads))
        out, _ = jax.lax.scan(body, init, (jnp.arange(accum_steps), micro))
        return out

    return many


def _as_aux(sums):
    loss_sum, weight_sum, aux = sums
    return loss_sum, (weight_sum, aux)


def dropout_rng(seed: int | jax.Array, step: jax.Array) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), step)


@flax.struct.dataclass
class Hyper:
    """What a run sets that its compiled programs take as inputs: the schedule's peak lr, the dropout seed."""
    lr: jax.Array  # float32 scalar
    seed: jax.Array  # int32 scalar


def _mean_metrics(loss_sum, weight_sum, aux) -> dict[str, jax.Array]:
    denom = jnp.maximum(weight_sum, 1.0)
    return {"loss": loss_sum / denom, **{k: v / denom for k, v in aux.items()}, "weight": weight_sum}


def train_step(state: TrainState, batch: Batch, *, loss_fn: LossFn, tx: optax.GradientTransformation,
               schedule: optax.Schedule, accum_steps: int = 1, seed: int | jax.Array = 0,
               stats: bool = False) -> tuple[TrainState, dict]:
    """One update. Metrics: loss and aux means (before the update), grad_norm (before clipping), lr; with `stats`
    also the per-layer norms of gpt1_jax/layer_stats.py (the update itself is the same)."""
    (loss_sum, weight_sum, aux), grads = accumulated(loss_fn, accum_steps)(state.params, batch, dropout_rng(seed, state.step))
    denom = jnp.maximum(weight_sum, 1.0)
    grads = jax.tree.map(lambda g: (g / denom).astype(g.dtype), grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {**_mean_metrics(loss_sum, weight_sum, aux), "grad_norm": optax.tree.norm(grads),
               "lr": jnp.asarray(schedule(state.step), jnp.float32)}
    if stats:
        metrics.update(layer_stats(state.params, grads, updates))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


# ---- sharded and compiled ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Programs:
    boxed_params: Any  # abstract (eval_shape) parameters in their logical-axis boxes
    init_opt: Callable  # params -> optimizer state (its layout is the same at every lr)
    init: Callable
    step: Callable
    step_stats: Callable  # the same step, also returning the per-layer statistics
    grads: Callable
    eval: Callable
    predict: Callable | None


@functools.lru_cache(maxsize=32)
def _programs(init_fn, loss_fn, predict_fn, optim: OptimConfig, rules: shd.Rules, accum_steps: int) -> _Programs:
    """The pure functions for one setup, built once: jax caches traces and compilations by function
    identity, so equal Trainers (tests, restarts in one process, a sweep's runs) share them instead of
    recompiling. `optim.lr` is not read (the step takes it in `Hyper`): callers pass one lr for all.
    Each binds its logical-axis rules itself, because jax's caches cannot see flax's rules context."""
    with nn.logical_axis_rules(rules):
        boxed_params = jax.eval_shape(init_fn, jax.random.key(0))
    abstract_params = nn.meta.unbox(boxed_params)
    init_opt = make_optimizer(optim, abstract_params).init

    def with_rules(fn):
        @functools.wraps(fn)
        def wrapped(*args):
            with nn.logical_axis_rules(rules):
                return fn(*args)
        return wrapped

    def init(key):
        params = nn.meta.unbox(init_fn(key))
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=init_opt(params))

    def step(state, batch, hyper: Hyper, stats=False):
        tx, schedule = make_optimizer(optim, abstract_params, hyper.lr), make_schedule(optim, hyper.lr)
        return train_step(state, batch, loss_fn=loss_fn, tx=tx, schedule=schedule, accum_steps=accum_steps,
                          seed=hyper.seed, stats=stats)

    def grads(params, batch, step_, hyper: Hyper):
        (loss_sum, weight_sum, aux), g = accumulated(loss_fn, accum_steps)(params, batch, dropout_rng(hyper.seed, step_))
        denom = jnp.maximum(weight_sum, 1.0)
        return loss_sum / denom, jax.tree.map(lambda x: (x / denom).astype(x.dtype), g), weight_sum

    def evaluate(params, batch):
        return loss_fn(params, batch, None, True)

    return _Programs(boxed_params, init_opt, with_rules(init), with_rules(step),
                     with_rules(functools.partial(step, stats=True)), with_rules(grads),
                     with_rules(evaluate), with_rules(predict_fn) if predict_fn is not None else None)


@dataclasses.dataclass
class Trainer:
    """A model's step, evaluation and prediction compiled for a mesh: shardings, state init, batch placement.

    `init_fn(rng)` returns fresh parameters in their logical-axis boxes (they give the shardings);
    `loss_fn` is as in this module's docstring; `predict_fn(params, batch)` (optional) returns outputs.
    """

    init_fn: Callable
    loss_fn: LossFn
    optim: OptimConfig
    mesh: Any
    rules: shd.Rules = shd.DEFAULT_RULES
    accum_steps: int = 1
    seed: int = 0
    predict_fn: Callable | None = None

    def __post_init__(self):
        if self.accum_steps < 1:
            raise ConfigError(f"accum_steps must be >= 1, got {self.accum_steps}")
        self.rules = tuple(self.rules)
        # One lr for every key: the programs take the real one (and the seed) as inputs, in `self.hyper`.
        programs = _programs(self.init_fn, self.loss_fn, self.predict_fn, dataclasses.replace(self.optim, lr=1.0),
                             self.rules, self.accum_steps)
        self.abstract_params = nn.meta.unbox(programs.boxed_params)
        # The same optimizer with the lr as a constant, for callers outside the compiled step (diagnostics).
        self.tx, self.schedule = make_optimizer(self.optim, self.abstract_params), make_schedule(self.optim)
        self.param_shardings = shd.logical_shardings(programs.boxed_params, self.mesh, self.rules)
        abstract_opt = jax.eval_shape(self.tx.init, self.abstract_params)
        opt_shardings = shd.like_params_shardings(abstract_opt, self.abstract_params, self.param_shardings, self.mesh)
        replicated = shd.replicated(self.mesh)
        self.state_shardings = TrainState(step=replicated, params=self.param_shardings, opt_state=opt_shardings)
        self.abstract_state = TrainState(
            step=jax.ShapeDtypeStruct((), jnp.int32), params=self.abstract_params, opt_state=abstract_opt
        )
        # Inputs keep the shardings they were placed with (put_batch, init, restore); outputs are pinned.
        self._step = jax.jit(programs.step, out_shardings=(self.state_shardings, replicated), donate_argnums=(0,))
        # A second program for the steps that log per-layer statistics: the others pay nothing for them.
        self._step_stats = jax.jit(programs.step_stats, out_shardings=(self.state_shardings, replicated),
                                   donate_argnums=(0,))
        self._grads = jax.jit(programs.grads, out_shardings=(replicated, self.param_shardings, replicated))
        self._init = jax.jit(programs.init, out_shardings=self.state_shardings)
        self._eval = jax.jit(programs.eval, out_shardings=replicated)
        self._predict = jax.jit(programs.predict, out_shardings=replicated) if programs.predict else None
        self._init_opt = jax.jit(programs.init_opt, out_shardings=opt_shardings)

    @functools.cached_property
    def hyper(self) -> Hyper:
        """This run's lr and seed, placed on first use: a pod plan's mesh (gpt1_jax/plan.py) has no devices."""
        return jax.device_put(Hyper(lr=jnp.asarray(self.optim.lr, jnp.float32), seed=jnp.asarray(self.seed, jnp.int32)),
                              shd.replicated(self.mesh))

    # Flax's logical constraints only bind under an active mesh + rules (docs/stack.md), at trace time.
    def _context(self):
        stack = contextlib.ExitStack()
        stack.enter_context(jax.set_mesh(self.mesh))
        stack.enter_context(nn.logical_axis_rules(self.rules))  # for tx.init and eager callers
        return stack

    def init(self, seed: int | None = None) -> TrainState:
        """Fresh state, created already sharded (FSDP params never exist whole on one device: out_shardings).
        Under the rules without the mesh: the init's forward pass, whose activations the mesh would constrain, is
        dead code, and outside it the model's init is the trace the run's shape check made (gpt1_jax/model.py)."""
        with nn.logical_axis_rules(self.rules):
            return self._init(jax.random.key(self.seed if seed is None else seed))

    def place_params(self, params):
        """Any params of this model's shapes (host or device, boxed or not) -> placed on the mesh in the
        storage dtype."""
        # Host copies: a process may put host data on devices of other processes, not its own device's arrays
        # (loaded weights are those; evaluate in a multi-process job died on "cross-host device transfers").
        params = jax.tree.map(lambda x, a: np.asarray(jax.device_get(x)).astype(a.dtype), nn.meta.unbox(params),
                              self.abstract_params)
        return jax.device_put(params, self.param_shardings)

    def state_from_params(self, params) -> TrainState:
        params = self.place_params(params)
        with self._context():
            opt_state = self._init_opt(params)
        return TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), shd.replicated(self.mesh)),
                          params=params, opt_state=opt_state)

    def abstract_state_sharded(self) -> TrainState:
        """ShapeDtypeStructs with this mesh's shardings: the target for restoring a checkpoint onto it."""
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), self.abstract_state, self.state_shardings
        )

    def check_batch_size(self, global_batch: int, what: str = "global batch", train: bool = True) -> None:
        check_batch_size(self.mesh, global_batch, self.accum_steps if train else 1, what)

    def put_batch(self, batch, train: bool = True) -> Batch:
        """This process's rows of a global batch (numpy) -> global arrays, the batch axis over data x fsdp;
        `train=False` for evaluation and prediction, which do not split it into micro-batches."""
        self.check_batch_size(next(iter(batch.values())).shape[0] * jax.process_count(), train=train)
        return {k: jax.make_array_from_process_local_data(shd.batch_sharding(self.mesh, v.ndim), v)
                for k, v in batch.items()}

    def step(self, state: TrainState, batch: Batch, stats: bool = False) -> tuple[TrainState, dict[str, jax.Array]]:
        """One update; `stats`: its metrics also hold the per-layer statistics (gpt1_jax/layer_stats.py)."""
        with self._context():
            return (self._step_stats if stats else self._step)(state, batch, self.hyper)

    def compile(self, state: TrainState, batch: Batch, stats: bool = False) -> None:
        """Compiles `step` for these inputs without running it: a later `step` on inputs of the same shapes and
        shardings dispatches at once (jax.jit keeps the executable)."""
        with self._context():
            (self._step_stats if stats else self._step).lower(state, batch, self.hyper).compile()

    def compile_eval(self, params, batch: Batch, predict: bool = False) -> None:
        """Compiles `eval_sums` (`predict`: `predict`) for these inputs without running it, as `compile` does the
        step: a profile window's evaluation then runs in the trace without its compilation."""
        with self._context():
            (self._predict if predict else self._eval).lower(params, batch).compile()

    def eval_sums(self, params, batch: Batch):
        """(loss sum, weight sum, aux sums) of a batch, no dropout, no update."""
        with self._context():
            return self._eval(params, batch)

    def predict(self, params, batch: Batch):
        with self._context():
            return self._predict(params, batch)

    def grads(self, params, batch: Batch, step: int = 0):
        """(loss, grads, weight) without an update: for tests and diagnostics."""
        with self._context():
            return self._grads(params, batch, jnp.asarray(step, jnp.int32), self.hyper)

    def lower(self, batch_spec: dict[str, jax.ShapeDtypeStruct]):
        """The step lowered for abstract inputs (shapes of the global batch): `.compile()` it to time
        compilation alone or to read its memory and cost analyses; the executable takes (state, batch,
        `self.hyper`)."""
        batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shd.batch_sharding(self.mesh, len(v.shape)))
                 for k, v in batch_spec.items()}
        with self._context():
            hyper = Hyper(lr=jax.ShapeDtypeStruct((), jnp.float32, sharding=shd.replicated(self.mesh)),
                          seed=jax.ShapeDtypeStruct((), jnp.int32, sharding=shd.replicated(self.mesh)))
            return self._step.lower(self.abstract_state_sharded(), batch, hyper)


def lm_batch_spec(batch: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    return {"inputs": tokens, "targets": tokens}


def check_batch_size(mesh, global_batch: int, accum_steps: int = 1, what: str = "global batch") -> None:
    """The one divisibility rule: a batch splits over data x fsdp devices and, to train, into micro-batches
    (`accum_steps`; 1 for evaluation). Jobs call it with the mesh alone, before reading any data."""
    if jax.process_count() > 1 and shd.batch_rows_shared_by_processes(mesh):
        raise ConfigError(f"mesh {dict(mesh.shape)} gives {jax.process_count()} processes the same rows of each batch "
                          f"(data x fsdp = {shd.batch_divisor(mesh)}), and each reads rows of its own: every step would "
                          "train on part of its batch; give data x fsdp a multiple of the process count")
    divisor = shd.batch_divisor(mesh) * accum_steps
    if global_batch % divisor:
        raise ConfigError(f"{what} {global_batch} is not divisible by data x fsdp" + (" x accum_steps" if accum_steps > 1 else "")
                          + f" = {divisor} (mesh {dict(mesh.shape)}" + (f", accum_steps {accum_steps})" if accum_steps > 1 else ")"))


@functools.lru_cache(maxsize=16)
def _lm_param_boxes(config: ModelConfig, rules: shd.Rules):
    with nn.logical_axis_rules(rules):
        return jax.eval_shape(lm_functions(config)[0], jax.random.key(0))


def check_mesh_divides(config: ModelConfig, mesh: MeshConfig, sizes: dict[str, int]) -> None:
    """The Trainer's ConfigError for a mesh axis that does not divide a dimension its rules split over it (heads
    over tensor, embed over fsdp), without building one: pretrain asks before reading data, plan's search per mesh."""
    rules = shd.logical_rules(mesh.rules)
    # the parameters' shapes only: traced with XLA's attention where cudnn's is asked for (it needs the GPU); any
    # other setting as the run has it, so that the run's Trainer reuses this trace
    if config.attention == "cudnn":
        config = dataclasses.replace(config, attention="xla")
    shd.fitted_specs(_lm_param_boxes(config, rules), sizes, rules)


def make_trainer(init_fn, loss_fn, optim: OptimConfig, mesh: MeshConfig | Any, *, accum_steps: int = 1, seed: int = 0,
                 predict_fn=None, devices=None) -> Trainer:
    """The one builder: mesh (from a MeshConfig over `devices`, default all visible ones, or a mesh already
    built) + logical-axis rules + Trainer. `devices` may be a TPU topology's (gpt1_jax/plan.py)."""
    if isinstance(mesh, MeshConfig):
        rules = shd.logical_rules(mesh.rules)
        mesh = shd.make_mesh(mesh, devices=devices)
    else:
        rules = shd.DEFAULT_RULES
    return Trainer(init_fn, loss_fn, optim, mesh, rules, accum_steps, seed, predict_fn)


def lm_trainer(config: ModelConfig, optim: OptimConfig, mesh: MeshConfig | Any, *, accum_steps: int = 1,
               seed: int = 0, devices=None) -> Trainer:
    """A Trainer of next-token prediction: pre-training, evaluation, benchmarks, pod plans."""
    return make_trainer(*lm_functions(config), optim, mesh, accum_steps=accum_steps, seed=seed, devices=devices)


def state_bytes(state: TrainState) -> tuple[int, int]:
    """(bytes of the whole state, most bytes held by any one device)."""
    total = 0
    per_device: dict[Any, int] = {}
    for leaf in jax.tree.leaves(state):
        total += leaf.nbytes
        for shard in leaf.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    return total, max(per_device.values())
