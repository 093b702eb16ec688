"""Bin packing: hand cases, and equality with the textbook O(N x bins) FFD and BFD."""

from __future__ import annotations

import numpy as np
import pytest

from packer.binpack import lower_bound, pack, summarize


def textbook(lengths, capacity, algorithm):
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties in input order
    room, bins = [], [None] * len(lengths)
    for i in order:
        fits = [b for b, r in enumerate(room) if r >= lengths[i]]
        if not fits:
            room.append(capacity)
            b = len(room) - 1
        elif algorithm == "ffd":
            b = fits[0]
        else:
            b = min(fits, key=lambda b: (room[b], b))
        room[b] -= lengths[i]
        bins[i] = b
    return bins


def test_four_items_context_eight():
    assert pack([5, 3, 4, 2], 8).tolist() == [0, 0, 1, 1]  # 5+3 | 4+2


def test_ffd_and_bfd_differ_where_they_should():
    # 7 -> bin0 (room 3); 5 -> bin1 (room 5); 4 fits only bin1 (room 1); the 1 fits both:
    # first fit takes bin0, best fit the tighter bin1.
    assert pack([7, 5, 4, 1], 10, "ffd").tolist() == [0, 1, 1, 0]
    assert pack([7, 5, 4, 1], 10, "bfd").tolist() == [0, 1, 1, 1]


def test_ties_keep_input_order():
    assert pack([3, 3, 3, 3], 6).tolist() == [0, 0, 1, 1]
    assert pack([2, 4, 2, 4], 6).tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("algorithm", ["ffd", "bfd"])
def test_equals_textbook_on_random_inputs(algorithm):
    rng = np.random.default_rng(0)
    for trial in range(200):
        capacity = int(rng.integers(1, 64))
        n = int(rng.integers(1, 80))
        lengths = rng.integers(1, capacity + 1, size=n)
        bins = pack(lengths, capacity, algorithm)
        assert bins.tolist() == textbook(lengths.tolist(), capacity, algorithm), (trial, algorithm)
        load = np.bincount(bins, weights=lengths)
        assert load.max() <= capacity
        assert bins.max() + 1 >= lower_bound(lengths, capacity)


def test_out_of_range_lengths_name_the_first_offender():
    with pytest.raises(ValueError, match=r"lengths\[2\] = 9 is outside \[1, 8\]"):
        pack([1, 8, 9, 0], 8)
    with pytest.raises(ValueError, match=r"lengths\[0\] = 0"):
        pack([0], 8)


def test_summary_fill_rate():
    lengths = np.array([5, 3, 4, 2])
    s = summarize(lengths, pack(lengths, 8), 8)
    assert (s.n_bins, s.n_tokens, s.lower_bound) == (2, 14, 2)
    assert s.fill_rate == 14 / 16
