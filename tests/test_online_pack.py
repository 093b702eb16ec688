"""Online packing of lengths (packer/online_pack.py), without torch: the buffer's pack/carry rule and the
fill rate the online packer reaches (the dataset that runs these steps: tests/train/test_online.py)."""

from __future__ import annotations

import numpy as np

from packer.binpack import pack, split_documents
from packer.online_pack import CarryPolicy, online_fill_rate, pack_buffer


def test_pack_buffer_hand_case():
    emitted, carried = pack_buffer([5, 3, 4, 2, 6, 1], 8)  # FFD: 6+2 | 5+3 | 4+1 (5/8 < 0.99)
    assert [b.tolist() for b in emitted] == [[3, 4], [0, 1]]
    assert [b.tolist() for b in carried] == [[2, 5]]
    emitted, carried = pack_buffer([5, 3, 4, 2, 6, 1], 8, final=True)
    assert [b.tolist() for b in emitted] == [[3, 4], [0, 1], [2, 5]] and carried == []


def test_pack_buffer_carries_at_most_max_carry_bins_least_filled_first():
    lengths = [5] * 6 + [3, 7]  # FFD bins: 7 | 5+3 | 5 | 5 | 5 | 5 | 5 (fills 7, 8, 5, 5, 5, 5, 5)
    emitted, carried = pack_buffer(lengths, 8, policy=CarryPolicy(min_fill=0.9, max_carry_bins=3))
    assert len(carried) == 3 and all(len(b) == 1 and lengths[b[0]] == 5 for b in carried)
    assert sorted(np.concatenate(emitted + carried).tolist()) == list(range(8))
    assert any(lengths[b[0]] == 7 for b in emitted)  # 7/8 < 0.9 too, but fuller than the carried ones
    _, none = pack_buffer(lengths, 8, policy=CarryPolicy(max_carry_bins=0))
    assert none == []


def test_online_fill_rate_with_one_buffer_is_offline_ffd():
    lengths = np.random.default_rng(1).integers(1, 3000, 2000)
    r = online_fill_rate(lengths, 1024, buffer_docs=10_000)
    _, _, pieces = split_documents(lengths, 1024)
    assert r["sequences"] == int(pack(pieces, 1024).max()) + 1 and r["tokens"] == int(lengths.sum())
    small = online_fill_rate(lengths, 1024, buffer_docs=100)
    assert small["tokens"] == int(lengths.sum()) and small["buffers"] == 21
    assert small["sequences"] >= r["sequences"] >= r["lower_bound_rows"]
    assert 0 < small["max_carry_bins"] <= 32 and small["max_carry_tokens"] <= 32 * 1024


def test_carry_stays_bounded_when_every_bin_is_under_filled():
    lengths = np.full(5000, 600)  # one per bin of 1024: every bin is 59% full, forever
    r = online_fill_rate(lengths, 1024, buffer_docs=500, policy=CarryPolicy(max_carry_bins=4))
    assert r["max_carry_bins"] == 4 and r["max_carry_tokens"] == 4 * 600 and r["sequences"] == 5000
