"""Offsets -> position ids, document ids, labels, masks: against token-by-token references."""

from __future__ import annotations

import numpy as np

from packer import masks


def test_three_document_row():
    offsets = [0, 3, 5, 6]
    assert masks.offsets_to_position_ids(offsets).tolist() == [0, 1, 2, 0, 1, 0]
    assert masks.offsets_to_document_ids(offsets).tolist() == [0, 0, 0, 1, 1, 2]
    assert masks.offsets_to_labels([10, 11, 12, 13, 14, 15], offsets).tolist() == [-100, 11, 12, -100, 14, -100]
    mask = masks.offsets_to_block_causal_mask(offsets).astype(int)
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]


def test_random_offsets_against_token_by_token_reference():
    rng = np.random.default_rng(0)
    for _ in range(100):
        lengths = rng.integers(1, 9, size=rng.integers(1, 7))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        pos, doc = [], []
        for d, n in enumerate(lengths):
            pos += list(range(n))
            doc += [d] * n
        assert masks.offsets_to_position_ids(offsets).tolist() == pos
        assert masks.offsets_to_document_ids(offsets).tolist() == doc
        T = len(doc)
        ref = [[doc[i] == doc[j] and j <= i for j in range(T)] for i in range(T)]
        assert masks.offsets_to_block_causal_mask(offsets).tolist() == ref
