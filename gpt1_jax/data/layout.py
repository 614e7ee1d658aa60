"""The fine-tuning token layout (docs/gpt1.md): how an example's token segments become the sequences a head reads.

Every example becomes N sequences of one layout, so one model function serves every head (gpt1_jax/heads.py):
  classification   N=1   [_start_] text [_classify_]
  entailment       N=1   [_start_] premise [_delimiter_] hypothesis [_classify_]
  similarity       N=2   both orders, [_start_] a [_delimiter_] b [_classify_] and b/a; hidden states added
  multiple_choice  N=C   [_start_] context [_delimiter_] answer_k [_classify_], one score per choice
Each segment keeps its first `n_ctx//2 - 2` tokens (the original's rule), so a sequence never exceeds
n_ctx and no example is ever dropped for being long. Batches are right-padded with 0 plus a mask, and
each sequence's `_classify_` position is recorded (`clf_pos`) for the head to read, not searched for.
Token ids and numpy only, so the data side (gpt1_jax/data/tasks.py) batches examples without the model side.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from gpt1_jax.errors import ConfigError

KINDS = ("classification", "entailment", "similarity", "multiple_choice")


@dataclasses.dataclass(frozen=True)
class Markers:
    start: int
    delimiter: int
    classify: int

    @classmethod
    def of(cls, tokenizer) -> Markers:
        return cls(tokenizer.start_id, tokenizer.delimiter_id, tokenizer.classify_id)


def max_segment_len(n_ctx: int) -> int:
    """Tokens kept per segment: two segments plus 3 markers always fit in n_ctx."""
    if n_ctx < 6:
        raise ConfigError(f"n_ctx={n_ctx} is too short for [_start_] a [_delimiter_] b [_classify_]")
    return n_ctx // 2 - 2


def sequence(segments: Sequence[Sequence[int]], markers: Markers, n_ctx: int) -> list[int]:
    """[_start_] seg_1 [_delimiter_] seg_2 ... [_classify_], each segment truncated to n_ctx//2 - 2."""
    keep = max_segment_len(n_ctx)
    out = [markers.start]
    for i, seg in enumerate(segments):
        if i:
            out.append(markers.delimiter)
        out.extend(int(t) for t in seg[:keep])
    out.append(markers.classify)
    return out


def layout(kind: str, segments: Sequence, markers: Markers, n_ctx: int) -> list[list[int]]:
    """One example's sequences. `segments`: (text,) | (premise, hypothesis) | (a, b) | (context, [answers])."""
    if kind == "classification":
        (text,) = segments
        return [sequence([text], markers, n_ctx)]
    if kind == "entailment":
        premise, hypothesis = segments
        return [sequence([premise, hypothesis], markers, n_ctx)]
    if kind == "similarity":
        a, b = segments
        return [sequence([a, b], markers, n_ctx), sequence([b, a], markers, n_ctx)]
    if kind == "multiple_choice":
        context, answers = segments
        return [sequence([context, ans], markers, n_ctx) for ans in answers]
    raise ValueError(f"unknown head kind {kind!r}; known: {', '.join(KINDS)}")


def pad_sequences(examples: Sequence[Sequence[Sequence[int]]], length: int):
    """Examples of N sequences -> tokens_BNT int32 (0-padded), mask_BNT float32, clf_pos_BN int32."""
    B, N = len(examples), len(examples[0])
    tokens_BNT = np.zeros((B, N, length), np.int32)
    mask_BNT = np.zeros((B, N, length), np.float32)
    clf_pos_BN = np.zeros((B, N), np.int32)
    for b, seqs in enumerate(examples):
        if len(seqs) != N:
            raise ValueError(f"example {b} has {len(seqs)} sequences, the batch's first has {N}")
        for n, seq in enumerate(seqs):
            if len(seq) > length:
                raise ValueError(f"sequence of {len(seq)} tokens does not fit length {length}")
            tokens_BNT[b, n, : len(seq)] = seq
            mask_BNT[b, n, : len(seq)] = 1.0
            clf_pos_BN[b, n] = len(seq) - 1  # the _classify_ marker closes every sequence
    return tokens_BNT, mask_BNT, clf_pos_BN
