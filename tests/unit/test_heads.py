"""Task heads and the token layout they read (gpt1_jax/data/layout.py): layouts, classify position, truncation,
similarity order-sum, the shared dropout mask of multiple choice, and the auxiliary LM loss against a float64
numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpt1_jax import heads
from gpt1_jax.data.layout import layout, pad_sequences
from tests.support.heads import M, TINY, _apply, _model


@pytest.mark.parametrize(
    "kind,segments,expected",
    [
        ("classification", ([1, 2, 3],), [[500, 1, 2, 3, 502]]),
        ("entailment", ([1, 2], [3, 4, 5]), [[500, 1, 2, 501, 3, 4, 5, 502]]),
        ("similarity", ([1, 2], [3]), [[500, 1, 2, 501, 3, 502], [500, 3, 501, 1, 2, 502]]),
        ("multiple_choice", ([1, 2], [[3], [4, 5], [6]]),
         [[500, 1, 2, 501, 3, 502], [500, 1, 2, 501, 4, 5, 502], [500, 1, 2, 501, 6, 502]]),
    ],
)
def test_layouts_and_classify_position(kind, segments, expected):
    seqs = layout(kind, segments, M, n_ctx=64)
    assert seqs == expected
    tokens, mask, clf_pos = pad_sequences([seqs], length=16)
    assert tokens.shape == (1, len(expected), 16)
    for n, seq in enumerate(expected):
        assert clf_pos[0, n] == len(seq) - 1
        assert tokens[0, n, clf_pos[0, n]] == M.classify
        assert mask[0, n].sum() == len(seq) and (tokens[0, n, len(seq):] == 0).all()


def test_truncation_keeps_n_ctx_half_minus_2_per_segment_and_drops_nothing():
    n_ctx = 64
    keep = n_ctx // 2 - 2
    long_a, long_b = list(range(1, 100)), list(range(200, 290))
    examples = [(long_a, long_b), (long_a[:5], long_b), (long_a, long_b[:3])]
    seqs = [layout("entailment", ex, M, n_ctx) for ex in examples]
    assert len(seqs) == len(examples)
    first = seqs[0][0]
    assert first == [500] + long_a[:keep] + [501] + long_b[:keep] + [502]
    assert seqs[1][0] == [500] + long_a[:5] + [501] + long_b[:keep] + [502]
    assert seqs[2][0] == [500] + long_a[:keep] + [501] + long_b[:3] + [502]
    assert max(len(s[0]) for s in seqs) <= n_ctx
    (mc,) = [layout("multiple_choice", (long_a, [long_b, long_b[:2]]), M, n_ctx)]
    assert [len(s) for s in mc] == [2 * keep + 3, keep + 2 + 3]


def test_multiple_choice_shares_one_dropout_mask_across_choices():
    head = heads.ClassifierHead("multiple_choice", 1, dropout=0.5)
    h_D = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    h_BND = jnp.asarray(np.broadcast_to(h_D, (16, 4, 64)))  # every choice of every example identical
    params = head.init(jax.random.key(0), h_BND)
    clean = head.apply(params, h_BND, deterministic=True)
    noisy = head.apply(params, h_BND, deterministic=False, rngs={"dropout": jax.random.key(1)})
    assert noisy.shape == (16, 4)
    np.testing.assert_array_equal(noisy, np.broadcast_to(noisy[:, :1], noisy.shape))  # same mask per example
    assert not np.allclose(noisy, clean)  # dropout did act
    assert len(np.unique(np.round(np.asarray(noisy[:, 0]), 5))) > 1  # masks differ between examples


def test_multiple_choice_identical_choices_identical_scores_through_the_model():
    model, params = _model("multiple_choice", 1, clf_dropout=0.5)
    seqs = [layout("multiple_choice", ([3, 4, 5], [[7, 8]] * 4), M, 64)] * 3
    tokens, _, clf_pos = pad_sequences(seqs, 16)
    out, _ = _apply(model, params, tokens, clf_pos, deterministic=False, with_lm=False,
                    rngs={"dropout": jax.random.key(3)})
    np.testing.assert_array_equal(out, np.broadcast_to(out[:, :1], out.shape))


def _lm_reference(logits, tokens, mask, weights):
    logits = logits.astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    per_seq = []
    for s in range(tokens.shape[0]):
        terms = [-logp[s, t - 1, tokens[s, t]] for t in range(1, tokens.shape[1]) if mask[s, t]]
        per_seq.append(np.mean(terms))  # over the real tokens after _start_
    per_seq = np.asarray(per_seq)
    return (per_seq * weights).sum() / weights.sum()


def test_aux_lm_loss_matches_float64_reference():
    rng = np.random.default_rng(0)
    S, T, V = 6, 12, 37
    lengths = [12, 5, 2, 9, 7, 3]
    tokens = rng.integers(0, V, (S, T))
    mask = np.zeros((S, T), np.float32)
    for s, n in enumerate(lengths):
        mask[s, :n] = 1
        tokens[s, n:] = 0
    logits = rng.standard_normal((S, T, V)).astype(np.float32) * 3
    weights = np.array([1, 1, 1, 0, 1, 1], np.float32)  # a padding row counts for nothing
    got = heads.lm_loss(jnp.asarray(logits), jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(weights))
    np.testing.assert_allclose(float(got), _lm_reference(logits, tokens, mask, weights), rtol=1e-5)
    # per-sequence averaging is not per-token averaging: the short sequences weigh as much as long ones
    flat = -np.log(np.take_along_axis(jax.nn.softmax(logits[:, :-1], -1), tokens[:, 1:, None], -1)[..., 0])
    per_token = (flat * mask[:, 1:] * weights[:, None]).sum() / (mask[:, 1:] * weights[:, None]).sum()
    assert abs(float(got) - per_token) > 1e-3


def test_task_losses():
    out = jnp.asarray([[2.0, -1.0], [0.5, 0.5], [9.0, 9.0]])
    labels = jnp.asarray([1, 0, 0])
    w = jnp.asarray([1.0, 1.0, 0.0])
    lp = np.log(np.exp(np.asarray(out, np.float64)) / np.exp(np.asarray(out, np.float64)).sum(-1, keepdims=True))
    expected = -(lp[0, 1] + lp[1, 0]) / 2
    np.testing.assert_allclose(float(heads.task_loss("classification", False, out, labels, w)), expected, rtol=1e-6)
    reg = jnp.asarray([[1.0], [3.0], [100.0]])
    np.testing.assert_allclose(float(heads.task_loss("similarity", True, reg, jnp.asarray([2.0, 3.5, 0.0]), w)),
                               (1.0 + 0.25) / 2, rtol=1e-6)


def test_lm_logits_cover_every_sequence_of_an_example():
    model, params = _model("multiple_choice", 1)
    seqs = [layout("multiple_choice", ([3, 4], [[7], [8], [9]]), M, 64)] * 2
    tokens, _, clf_pos = pad_sequences(seqs, 16)
    out, logits = _apply(model, params, tokens, clf_pos)
    assert out.shape == (2, 3) and logits.shape == (6, 16, TINY.vocab_size) and logits.dtype == jnp.float32
