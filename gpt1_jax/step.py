"""The train step as a pure function, and its sharded, compiled form.

`train_step(state, batch)` = LM loss -> gradients (accumulated over micro-batches) -> optax update ->
metrics. It is pure: the dropout key is `fold_in(fold_in(key(seed), step), micro_batch)`, so a resumed
run replays the same masks. `Trainer` wraps it in `jax.jit` with in/out shardings from
`gpt1_jax.sharding` and donates the old state.

Mixed precision comes from ModelConfig: `dtype` is the compute dtype (activations, matmul inputs),
`param_dtype` the storage dtype of params, and so of gradients and the optimizer state. The LM logits
and the loss are always float32.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from gpt1_jax import sharding as shd
from gpt1_jax.config import ConfigError, ModelConfig
from gpt1_jax.model import GPT1, init_params
from gpt1_jax.optim import OptimConfig, make_optimizer, make_schedule

# "inputs" [B, T] int32, "targets" [B, T] int32 (the next tokens), optional "weights" [B, T] float per
# target (0 for padding or prompts). The data pipeline cuts (T+1)-token windows into exactly this.
Batch = dict[str, jax.Array]


def lm_batch(windows_BT1) -> Batch:
    """[B, T+1] token windows -> {"inputs", "targets"}: every position predicts its next token."""
    return {"inputs": windows_BT1[:, :-1], "targets": windows_BT1[:, 1:]}


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: number of updates applied
    params: Any  # unboxed arrays in param_dtype
    opt_state: Any


# ---- loss -----------------------------------------------------------------------------------------

def lm_loss_sums(logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array):
    """(sum of weighted cross-entropies, sum of weights). Sums, not means, so micro-batches and
    evaluation batches add up to exactly the large batch's loss."""
    losses_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT)
    weights_BT = weights_BT.astype(jnp.float32)
    return jnp.sum(losses_BT * weights_BT), jnp.sum(weights_BT)


def _loss_sums(params, inputs_BT, targets_BT, weights_BT, rng, config: ModelConfig, deterministic: bool = False):
    model = GPT1(config)
    variables = {"params": params}
    rngs = {} if deterministic else {"dropout": rng}
    h_BTD = model.apply(variables, inputs_BT, deterministic=deterministic, rngs=rngs)
    logits_BTV = model.apply(variables, h_BTD, method=GPT1.logits)
    return lm_loss_sums(logits_BTV, targets_BT, weights_BT)


def _weights(batch: Batch) -> jax.Array:
    weights_BT = batch.get("weights")
    return jnp.ones(batch["targets"].shape, jnp.float32) if weights_BT is None else weights_BT


def eval_sums(params, batch: Batch, *, config: ModelConfig):
    """(loss sum, weight sum) without dropout: the evaluation counterpart of the train loss."""
    return _loss_sums(params, batch["inputs"], batch["targets"], _weights(batch), None, config, deterministic=True)


# ---- gradients ------------------------------------------------------------------------------------

def _split_micro(x_B, accum_steps: int):
    """[B, ...] -> [k, B/k, ...] taking rows j, j+k, j+2k, ... for micro-batch j: each micro-batch then
    draws rows from every data shard, so no device idles while another holds a whole micro-batch."""
    B = x_B.shape[0]
    return jnp.swapaxes(x_B.reshape(B // accum_steps, accum_steps, *x_B.shape[1:]), 0, 1)


def loss_and_grads(params, batch: Batch, rng: jax.Array, *, config: ModelConfig, accum_steps: int = 1):
    """(mean loss, gradients of the mean loss, total weight) over the batch; with accum_steps=k the batch
    runs as k sequential micro-batches whose summed gradients equal the whole batch's."""
    inputs_BT, targets_BT, weights_BT = batch["inputs"], batch["targets"], _weights(batch)
    grad_fn = jax.value_and_grad(_loss_sums, has_aux=True)

    if accum_steps == 1:
        (loss_sum, weight_sum), grads = grad_fn(params, inputs_BT, targets_BT, weights_BT, rng, config)
    else:
        micro = [_split_micro(x, accum_steps) for x in (inputs_BT, targets_BT, weights_BT)]

        def body(carry, xs):
            loss_acc, weight_acc, grads_acc = carry
            i, in_BT, tgt_BT, w_BT = xs
            in_BT = nn.with_logical_constraint(in_BT, ("batch", "length"))
            (loss_sum, weight_sum), grads = grad_fn(params, in_BT, tgt_BT, w_BT, jax.random.fold_in(rng, i), config)
            grads_acc = jax.tree.map(jnp.add, grads_acc, grads)
            return (loss_acc + loss_sum, weight_acc + weight_sum, grads_acc), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        init = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), zeros)
        (loss_sum, weight_sum, grads), _ = jax.lax.scan(
            body, init, (jnp.arange(accum_steps), *micro)
        )
    denom = jnp.maximum(weight_sum, 1.0)
    grads = jax.tree.map(lambda g: (g / denom).astype(g.dtype), grads)
    return loss_sum / denom, grads, weight_sum


def dropout_rng(seed: int, step: jax.Array) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), step)


def train_step(
    state: TrainState,
    batch: Batch,
    *,
    config: ModelConfig,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    accum_steps: int = 1,
    seed: int = 0,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One update. Metrics: loss (before the update), grad_norm (before clipping), lr (used here)."""
    loss, grads, n_tokens = loss_and_grads(
        state.params, batch, dropout_rng(seed, state.step), config=config, accum_steps=accum_steps
    )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "lr": jnp.asarray(schedule(state.step), jnp.float32),
        "tokens": n_tokens,
    }
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


# ---- sharded and compiled ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Programs:
    boxed_params: Any  # abstract (eval_shape) parameters in their logical-axis boxes
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    init: Callable
    step: Callable
    grads: Callable
    eval_sums: Callable


@functools.lru_cache(maxsize=32)
def _programs(config: ModelConfig, optim: OptimConfig, rules: shd.Rules, accum_steps: int, seed: int) -> _Programs:
    """The pure functions for one setup, built once: jax caches traces and compilations by function
    identity, so equal Trainers (tests, restarts in one process) share them instead of recompiling.
    Each binds its logical-axis rules itself, because jax's caches cannot see flax's rules context."""
    boxed_params = jax.eval_shape(functools.partial(init_params, config), jax.random.key(0))
    tx = make_optimizer(optim, nn.meta.unbox(boxed_params))
    schedule = make_schedule(optim)

    def with_rules(fn):
        @functools.wraps(fn)
        def wrapped(*args):
            with nn.logical_axis_rules(rules):
                return fn(*args)
        return wrapped

    def init(key):
        params = nn.meta.unbox(init_params(config, key))
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    def step(state, batch):
        return train_step(state, batch, config=config, tx=tx, schedule=schedule, accum_steps=accum_steps, seed=seed)

    def grads(params, batch, step_):
        return loss_and_grads(params, batch, dropout_rng(seed, step_), config=config, accum_steps=accum_steps)

    def evaluate(params, batch):
        return eval_sums(params, batch, config=config)

    return _Programs(boxed_params, tx, schedule, with_rules(init), with_rules(step), with_rules(grads), with_rules(evaluate))


@dataclasses.dataclass
class Trainer:
    """Everything needed to run the step on a mesh: shardings, the compiled step, state init."""

    config: ModelConfig
    optim: OptimConfig
    mesh: Any
    rules: shd.Rules = shd.DEFAULT_RULES
    accum_steps: int = 1
    seed: int = 0

    def __post_init__(self):
        if self.accum_steps < 1:
            raise ConfigError(f"accum_steps must be >= 1, got {self.accum_steps}")
        self.rules = tuple(self.rules)
        programs = _programs(self.config, self.optim, self.rules, self.accum_steps, self.seed)
        self.tx, self.schedule = programs.tx, programs.schedule
        self.abstract_params = nn.meta.unbox(programs.boxed_params)
        self.param_shardings = shd.logical_shardings(programs.boxed_params, self.mesh, self.rules)
        abstract_opt = jax.eval_shape(self.tx.init, self.abstract_params)
        opt_shardings = shd.like_params_shardings(abstract_opt, self.abstract_params, self.param_shardings, self.mesh)
        self.state_shardings = TrainState(
            step=shd.replicated(self.mesh), params=self.param_shardings, opt_state=opt_shardings
        )
        self.abstract_state = TrainState(
            step=jax.ShapeDtypeStruct((), jnp.int32), params=self.abstract_params, opt_state=abstract_opt
        )
        self.batch_sharding = shd.batch_sharding(self.mesh)
        self.metrics_sharding = shd.replicated(self.mesh)
        self._step = jax.jit(
            programs.step,
            in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=(self.state_shardings, self.metrics_sharding),
            donate_argnums=(0,),
        )
        self._grads = jax.jit(
            programs.grads,
            in_shardings=(self.param_shardings, self.batch_sharding, shd.replicated(self.mesh)),
            out_shardings=(self.metrics_sharding, self.param_shardings, self.metrics_sharding),
        )
        self._init = jax.jit(programs.init, out_shardings=self.state_shardings)
        self._eval_sums = jax.jit(
            programs.eval_sums,
            in_shardings=(self.param_shardings, self.batch_sharding),
            out_shardings=(self.metrics_sharding, self.metrics_sharding),
        )

    # Flax's logical constraints only bind under an active mesh + rules (STACK.md), at trace time.
    def _context(self):
        import contextlib

        stack = contextlib.ExitStack()
        stack.enter_context(jax.set_mesh(self.mesh))
        stack.enter_context(nn.logical_axis_rules(self.rules))  # for tx.init and eager callers
        return stack

    def init(self, seed: int | None = None) -> TrainState:
        """Fresh state, created already sharded (FSDP params never exist whole on one device)."""
        with self._context():
            return self._init(jax.random.key(self.seed if seed is None else seed))

    def state_from_params(self, params) -> TrainState:
        params = jax.device_put(nn.meta.unbox(params), self.param_shardings)
        with self._context():
            opt_state = jax.jit(self.tx.init, out_shardings=self.state_shardings.opt_state)(params)
        return TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), shd.replicated(self.mesh)),
                          params=params, opt_state=opt_state)

    def abstract_state_sharded(self) -> TrainState:
        """ShapeDtypeStructs with this mesh's shardings: the target for restoring a checkpoint onto it."""
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), self.abstract_state, self.state_shardings
        )

    def put_batch(self, batch: Batch) -> Batch:
        """This process's rows of a global batch (numpy) -> global arrays sharded over data x fsdp."""
        B = batch["inputs"].shape[0] * jax.process_count()
        divisor = shd.batch_divisor(self.mesh) * self.accum_steps
        if B % divisor:
            raise ConfigError(
                f"batch {B} is not divisible by data x fsdp x accum_steps = {divisor} (mesh {dict(self.mesh.shape)})"
            )
        return {k: jax.make_array_from_process_local_data(self.batch_sharding, v) for k, v in batch.items()}

    def step(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        with self._context():
            return self._step(state, batch)

    def eval_sums(self, params, batch: Batch):
        """(loss sum, weight sum) of a batch, no dropout, no update."""
        with self._context():
            return self._eval_sums(params, batch)

    def grads(self, params, batch: Batch, step: int = 0):
        """(loss, grads, weight) without an update: for tests and diagnostics."""
        with self._context():
            return self._grads(params, batch, jnp.asarray(step, jnp.int32))

    def lower(self, batch_shape: tuple[int, int]):
        """The step lowered for abstract inputs: `.compile()` it to time compilation alone."""
        B, T = batch_shape
        tokens = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=self.batch_sharding)
        with self._context():
            return self._step.lower(self.abstract_state_sharded(), {"inputs": tokens, "targets": tokens})


def state_bytes(state: TrainState) -> tuple[int, int]:
    """(bytes of the whole state, most bytes held by any one device)."""
    total = 0
    per_device: dict[Any, int] = {}
    for leaf in jax.tree.leaves(state):
        total += leaf.nbytes
        for shard in leaf.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    return total, max(per_device.values())
