"""Ranged reads of remote unit files: merged neighbours, and the same bytes as slicing the arrays."""

from __future__ import annotations

import io
import uuid

import numpy as np
import pytest

pytest.importorskip("fsspec")

from packer.io import fs, ranged  # noqa: E402


@pytest.fixture
def memory_dir():
    d = fs.location(f"memory://packer-test-{uuid.uuid4().hex}")
    yield d
    if d.exists():
        fs.rmtree(d)


def test_ranged_spans_merge_neighbours_of_one_unit():
    unit = np.array([3, 0, 3, 3])
    begin = np.array([800, 0, 1700, 10**7])
    end = np.array([1600, 400, 2000, 10**7 + 8])
    reads, where = ranged.spans(unit, begin, end)
    assert reads == [[0, 0, 400], [3, 800, 2000], [3, 10**7, 10**7 + 8]]  # the far piece is its own read
    assert where == [1, 0, 1, 2]


def test_ranged_gather_equals_slicing_the_arrays(memory_dir):
    rng = np.random.default_rng(7)
    d = memory_dir
    arrays = [rng.integers(0, 60000, rng.integers(1, 5000), dtype=np.uint16) for _ in range(5)]
    for u, a in enumerate(arrays):
        buf = io.BytesIO()
        np.save(buf, a)  # np.save's header, not the 128-byte one: parsed
        (d / f"unit-{u:06d}.tokens.npy").write_bytes(buf.getvalue())
    merged = 0
    for _ in range(20):
        n = int(rng.integers(1, 60))
        unit = rng.integers(0, len(arrays), n)
        start = np.array([rng.integers(0, len(arrays[u])) for u in unit])
        length = np.array([rng.integers(0, len(arrays[u]) - s + 1) for u, s in zip(unit, start)])
        want = np.concatenate([arrays[u][s : s + k] for u, s, k in zip(unit, start, length)])
        got = np.frombuffer(ranged.gather(d, unit, start * 2, (start + length) * 2, {}), np.uint16)
        assert np.array_equal(got, want)
        merged += len(ranged.spans(unit, start * 2, (start + length) * 2)[0]) < n
    assert merged > 10  # reads were merged, not one per piece
