"""Task heads and the token layout they read (gpt1_jax/data/layout.py): layouts, classify position, truncation,
similarity order-sum, the shared dropout mask of multiple choice, and the auxiliary LM loss against a float64
numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np

from gpt1_jax.data.layout import layout, pad_sequences
from tests.support.heads import M, TINY, _apply, _model


def test_similarity_adds_the_hidden_states_of_both_orders():
    model, params = _model("similarity", 1)
    seqs = [layout("similarity", ([5, 6, 7], [8, 9]), M, 64), layout("similarity", ([8, 9], [5, 6, 7]), M, 64)]
    tokens, _, clf_pos = pad_sequences(seqs, 16)
    out, _ = _apply(model, params, tokens, clf_pos, with_lm=False)
    # (a, b) and (b, a) give the same two sequences in swapped order: the sum makes them equal
    np.testing.assert_allclose(out[0], out[1], rtol=1e-6, atol=1e-6)
    # and it is W_y (h_ab + h_ba) + b, the hidden states taken at the _classify_ positions
    from gpt1_jax.model import GPT1

    h = jax.jit(GPT1(TINY).apply)({"params": params["transformer"]}, jnp.asarray(tokens[0]))
    h_sum = h[0, clf_pos[0, 0]] + h[1, clf_pos[0, 1]]
    lin = params["head"]["linear"]
    np.testing.assert_allclose(out[0], h_sum @ lin["kernel"] + lin["bias"], rtol=1e-5, atol=1e-5)
