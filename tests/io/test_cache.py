"""The local block cache: what is put comes back, the least recently read goes first, and the
directory stays within its stated bound however much passes through it."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from packer.io import cache as cache_module
from packer.io.cache import BlockCache


def test_put_then_get_returns_the_bytes_and_a_miss_is_none(tmp_path):
    c = BlockCache(tmp_path / "c", 1 << 20)
    data = np.arange(1000, dtype=np.uint16)
    c.put("sha:0:2000", data)
    assert np.array_equal(c.get("sha:0:2000").view(np.uint16), data)
    assert c.get("sha:2000:4000") is None
    assert [p.name for p in (tmp_path / "c").rglob("*") if p.is_file() and p.name != ".lock"] == \
        [cache_module.key_name("sha:0:2000") + ".blk"]  # no temporary file left


def test_the_least_recently_read_is_evicted_first(tmp_path):
    c = BlockCache(tmp_path / "c", 16 * 1000)  # scans after each 1000 bytes added
    for k in range(12):
        c.put(f"k{k}", np.zeros(1000, np.uint8))
        os.utime(c._file(f"k{k}"), ns=(k * 10**9, k * 10**9))  # put in order, one second apart
    c.get("k0")  # read now: the newest
    for k in range(12, 20):
        c.put(f"k{k}", np.zeros(1000, np.uint8))
        time.sleep(0.001)
    kept = {k for k in range(20) if c.get(f"k{k}") is not None}
    assert 0 in kept and 1 not in kept and {12, 19} <= kept
    assert c.size() <= 16 * 1000


def test_the_directory_stays_within_its_bound(tmp_path):
    max_bytes = 100_000
    c = BlockCache(tmp_path / "c", max_bytes)
    rng = np.random.default_rng(0)
    peak = 0
    for k in range(300):
        c.put(f"b{k}", np.zeros(int(rng.integers(100, 5000)), np.uint8))
        peak = max(peak, c.size())
    assert 0.5 * max_bytes < peak <= max_bytes * (1 + 1 / cache_module.SCAN_FRACTION) + 5000


def test_a_size_of_zero_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cache max_bytes=0: give a positive size"):
        BlockCache(tmp_path, 0)
