"""Bin packing: hand cases, and equality with the textbook O(N x bins) FFD and BFD."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.binpack import lower_bound, pack


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


def assert_valid_packing(lengths, bins, capacity):
    """Every item in exactly one bin, bins numbered 0..n-1 with none empty, none over capacity."""
    lengths = np.asarray(lengths, dtype=np.int64)
    assert bins.dtype == np.int64 and bins.shape == lengths.shape
    n_bins = int(bins.max()) + 1
    assert bins.min() == 0
    load = np.bincount(bins, weights=lengths, minlength=n_bins)
    assert (load > 0).all() and load.max() <= capacity
    assert n_bins >= lower_bound(lengths, capacity)


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


def test_class_stops_inside_a_run_of_equal_bins():
    # Three 6s open bins 0-2 (room 4 each, one run). Two 4s use bins 0 and 1 and stop inside
    # the run; the 3 then goes to bin 2 (FFD: first with room; BFD: least room that fits).
    assert pack([6, 6, 6, 4, 4, 3], 10, "ffd").tolist() == [0, 1, 2, 0, 1, 2]
    assert pack([6, 6, 6, 4, 4, 3], 10, "bfd").tolist() == [0, 1, 2, 0, 1, 2]
    # Capacity 10, three 3s and a 1 after a 6: bin0 room 4 takes one 3 (room 1), the next
    # two 3s open bin1 (room 4, a partial new bin); the 1 goes to bin0 (FFD) or bin0 (BFD, room 1).
    assert pack([6, 3, 3, 3, 1], 10, "ffd").tolist() == [0, 0, 1, 1, 0]
    assert pack([6, 3, 3, 3, 1], 10, "bfd").tolist() == [0, 0, 1, 1, 0]


def test_edge_shapes():
    assert pack([], 8).tolist() == []
    assert pack([8], 8).tolist() == [0]
    assert pack([1, 1, 1], 1).tolist() == [0, 1, 2]
    assert pack(np.full(5, 8, dtype=np.uint16), 8).tolist() == [0, 1, 2, 3, 4]
    assert pack(np.array([2, 2, 2], dtype=np.int8), 4).tolist() == [0, 0, 1]
    assert pack(np.array([3, 70_000, 2], dtype=np.uint64), 70_000).tolist() == [1, 0, 1]


@pytest.mark.parametrize("algorithm", ["ffd", "bfd"])
def test_equals_textbook_on_seeded_random_inputs(algorithm):
    rng = np.random.default_rng(0)
    differs = 0
    for trial in range(200):
        capacity = int(rng.integers(1, 64))
        n = int(rng.integers(1, 80))
        pool = rng.integers(1, capacity + 1, size=int(rng.integers(1, 6)))  # few values: many ties
        lengths = rng.choice(pool, size=n) if trial % 2 else rng.integers(1, capacity + 1, size=n)
        bins = pack(lengths, capacity, algorithm)
        assert bins.tolist() == textbook(lengths.tolist(), capacity, algorithm), (trial, algorithm)
        assert_valid_packing(lengths, bins, capacity)
        other = "bfd" if algorithm == "ffd" else "ffd"
        differs += textbook(lengths.tolist(), capacity, other) != bins.tolist()
    assert differs > 10  # the inputs do tell first fit from best fit


@pytest.mark.parametrize("algorithm", ["ffd", "bfd"])
def test_equals_textbook_on_web_like_lengths(algorithm):
    # Lognormal document lengths split at the capacity, like the benchmark, at a size where
    # the runs of equal bins get long and split many times.
    rng = np.random.default_rng(7)
    capacity = 512
    docs = np.minimum(rng.lognormal(np.log(75), 1.18, size=1500).astype(np.int64) + 1, 25_000)
    lengths = np.asarray([p for d in docs.tolist() for p in [capacity] * (d // capacity) + [d % capacity] if p])
    bins = pack(lengths, capacity, algorithm)
    assert bins.tolist() == textbook(lengths.tolist(), capacity, algorithm)
    assert_valid_packing(lengths, bins, capacity)
    assert bins.max() + 1 <= lower_bound(lengths, capacity) + 1


@pytest.mark.parametrize("capacity", [65_535, 65_536, 70_001, 2**20])
def test_large_capacities_use_the_two_pass_sort(capacity):
    rng = np.random.default_rng(capacity)
    lengths = np.concatenate([rng.integers(1, capacity + 1, size=150), rng.integers(1, 70, size=50),
                              rng.integers(capacity - 300, capacity + 1, size=50)])
    lengths = np.minimum(lengths, capacity)
    for algorithm in ("ffd", "bfd"):
        assert pack(lengths, capacity, algorithm).tolist() == textbook(lengths.tolist(), capacity, algorithm)


@st.composite
def packing_inputs(draw):
    capacity = draw(st.one_of(st.just(1), st.integers(1, 12), st.integers(1, 200)))
    kind = draw(st.sampled_from(["any", "few values", "all equal", "full", "single"]))
    size = st.integers(1, capacity)
    if kind == "any":
        lengths = draw(st.lists(size, min_size=1, max_size=60))
    elif kind == "few values":
        pool = draw(st.lists(size, min_size=1, max_size=3))
        lengths = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=60))
    elif kind == "all equal":
        lengths = [draw(size)] * draw(st.integers(1, 60))
    elif kind == "full":  # items equal to the capacity mixed with others
        lengths = draw(st.lists(st.one_of(st.just(capacity), size), min_size=1, max_size=60))
    else:
        lengths = [draw(size)]
    return lengths, capacity


@pytest.mark.parametrize("algorithm", ["ffd", "bfd"])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=packing_inputs())
def test_property_equals_textbook(algorithm, case):
    lengths, capacity = case
    bins = pack(np.asarray(lengths, dtype=np.int64), capacity, algorithm)
    assert bins.tolist() == textbook(lengths, capacity, algorithm)
    assert_valid_packing(lengths, bins, capacity)


def test_bad_inputs_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match=r"lengths\[2\] = 9 is outside \[1, 8\]; split long"):
        pack([1, 8, 9, 0], 8)
    with pytest.raises(ValueError, match=r"lengths\[0\] = 0"):
        pack([0], 8)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        pack([1], 8, "nfd")
    with pytest.raises(ValueError, match="must be integers"):
        pack([1.5], 8)
    with pytest.raises(ValueError, match="1-D"):
        pack([[1]], 8)
    with pytest.raises(ValueError, match="capacity must be"):
        pack([1], 0)


def ffd_segment_tree(lengths, capacity):
    """FFD one item at a time with a max-room segment tree over bin numbers: O(N log N)."""
    size = 1
    while size < len(lengths):
        size *= 2
    tree = [capacity] * (2 * size)  # bins not yet opened have the whole capacity
    bins = [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        v = 1
        while v < size:  # leftmost leaf with room >= the item
            v = 2 * v if tree[2 * v] >= lengths[i] else 2 * v + 1
        bins[i] = v - size
        tree[v] -= lengths[i]
        while v > 1:
            v //= 2
            tree[v] = max(tree[2 * v], tree[2 * v + 1])
    return bins


def bfd_sorted_rooms(lengths, capacity):
    """BFD one item at a time over a sorted list of (room, bin): O(N log N) searches."""
    import bisect

    rooms, bins, n_bins = [], [0] * len(lengths), 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        j = bisect.bisect_left(rooms, (lengths[i], -1))
        if j == len(rooms):
            room, b = capacity, n_bins
            n_bins += 1
        else:
            room, b = rooms.pop(j)
        bins[i] = b
        if room - lengths[i]:
            bisect.insort(rooms, (room - lengths[i], b))
    return bins


@pytest.mark.slow
@pytest.mark.parametrize("capacity", [2048, 4096])
def test_equals_per_item_references_at_scale(capacity):
    rng = np.random.default_rng(capacity)
    docs = np.clip(np.rint(rng.lognormal(np.log(300), 1.18, size=150_000)).astype(np.int64), 1, 100_000)
    lengths = np.asarray([p for d in docs.tolist() for p in [capacity] * (d // capacity) + [d % capacity] if p])
    assert len(lengths) > 150_000
    assert pack(lengths, capacity, "ffd").tolist() == ffd_segment_tree(lengths.tolist(), capacity)
    assert pack(lengths, capacity, "bfd").tolist() == bfd_sorted_rooms(lengths.tolist(), capacity)


def test_per_item_references_agree_with_the_textbook():
    rng = np.random.default_rng(11)
    for _ in range(100):
        capacity = int(rng.integers(1, 40))
        lengths = rng.integers(1, capacity + 1, size=int(rng.integers(1, 60))).tolist()
        assert ffd_segment_tree(lengths, capacity) == textbook(lengths, capacity, "ffd")
        assert bfd_sorted_rooms(lengths, capacity) == textbook(lengths, capacity, "bfd")
