"""gpt1_jax/hlo.py: a step's loops counted per trip. The reference is the same computation compiled without its loop:
XLA's own count of the unrolled program. On this host's CPU compiler; a model's step compiled for a TPU, through
sizing and `plan`: tests/e2e/test_plan.py."""

import jax
import jax.numpy as jnp
import pytest

from gpt1_jax.hlo import loop_factors, runs_per_step


def _layers(x, ws, unroll):
    def layer(h, w):
        return jnp.tanh(h @ w) + h, None
    return jax.lax.scan(layer, x, ws, unroll=unroll)[0].sum()


def _compiled(unroll: bool, n_layers: int = 6):
    # The gradient of the input too: else the unrolled program leaves out the first layer's input gradient, which a
    # loop's one body computes on every trip (not the same work: 6% more FLOPs here).
    x, ws = jnp.ones((64, 128)), jnp.ones((n_layers, 128, 128)) * 0.01
    return jax.jit(jax.grad(_layers, argnums=(0, 1)), static_argnums=2).lower(x, ws, unroll).compile()


def test_a_scans_body_counts_once_per_trip_as_the_unrolled_program_counts_it():
    looped, unrolled = _compiled(False), _compiled(True)
    assert " while(" in looped.as_text() and " while(" not in unrolled.as_text()
    assert max(runs_per_step(looped.as_text())[0].values()) == 6
    factors = loop_factors(looped.as_text())
    once, whole = looped.cost_analysis(), unrolled.cost_analysis()
    assert once["flops"] < 0.5 * whole["flops"]  # what XLA says of the loop: its body once
    assert factors["flops"] * once["flops"] == pytest.approx(whole["flops"], rel=0.01)
    # The loop moves more than the unrolled program (each trip writes its residuals into the stacked buffers), not
    # less: a body counted once moves less.
    assert once["bytes accessed"] < whole["bytes accessed"] < factors["bytes accessed"] * once["bytes accessed"] \
        < 3 * whole["bytes accessed"]
    assert loop_factors(unrolled.as_text()) is None


def test_a_nested_loop_multiplies_its_trips():
    def f(x, ws):  # 3 micro-batches, each through the 6 layers
        return jax.lax.scan(lambda c, xi: (c + _layers(xi, ws, False), None), 0.0, x)[0]

    def g(x, ws):
        return sum(_layers(x[i], ws, True) for i in range(3))

    x, ws = jnp.ones((3, 64, 128)), jnp.ones((6, 128, 128)) * 0.01
    looped = jax.jit(jax.grad(f, argnums=(0, 1))).lower(x, ws).compile()
    unrolled = jax.jit(jax.grad(g, argnums=(0, 1))).lower(x, ws).compile()
    assert max(runs_per_step(looped.as_text())[0].values()) == 18
    factors = loop_factors(looped.as_text())
    assert factors["flops"] * looped.cost_analysis()["flops"] == pytest.approx(unrolled.cost_analysis()["flops"], rel=0.01)



def test_text_the_analysis_cannot_read_leaves_the_loops_counted_once():
    text = _compiled(False).as_text().replace(" tanh(", " tanh_of_a_future_xla(")
    assert " while(" in text and loop_factors(text) is None


def test_a_client_without_an_analysis_leaves_it_to_this_hosts_cpu():
    """A TPU compiled from this host has a compile-only client, which cannot analyse: the CPU's generic one does."""
    text = _compiled(False).as_text()
    assert loop_factors(text, client=object()) == loop_factors(text, client=jax.devices("cpu")[0].client) is not None
