"""Offsets -> position ids, document ids, labels, cu_seqlens and block-causal masks.

A row of 6 tokens holding documents of lengths 3, 2, 1 has

    offsets       [0, 3, 5, 6]
    position_ids  [0, 1, 2, 0, 1, 0]
    document_ids  [0, 0, 0, 1, 1, 2]
    labels        [-100, t1, t2, -100, t4, -100]   (input_ids, -100 at each document's first token)
    mask_TT       block-causal: query i sees key j iff j <= i and both are in the same document

        1 . . . . .
        1 1 . . . .
        1 1 1 . . .
        . . . 1 . .
        . . . 1 1 .
        . . . . . 1

numpy in, numpy out; no Python loop over tokens.
"""

from __future__ import annotations

import numpy as np

IGNORE_INDEX = -100


def segment_lengths(offsets) -> np.ndarray:
    return np.diff(np.asarray(offsets, dtype=np.int64))


def offsets_to_position_ids(offsets) -> np.ndarray:
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    return np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)


def offsets_to_document_ids(offsets) -> np.ndarray:
    lengths = segment_lengths(offsets)
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)


def offsets_to_labels(input_ids, offsets) -> np.ndarray:
    labels = np.asarray(input_ids, dtype=np.int64).copy()
    starts = np.asarray(offsets[:-1], dtype=np.int64)
    labels[starts[starts < len(labels)]] = IGNORE_INDEX
    return labels


def offsets_to_block_causal_mask(offsets) -> np.ndarray:
    """Dense [T, T] boolean mask, True where query i may attend to key j. O(T^2): opt-in only."""
    doc = offsets_to_document_ids(offsets)
    t = np.arange(len(doc))
    return (doc[:, None] == doc[None, :]) & (t[None, :] <= t[:, None])
