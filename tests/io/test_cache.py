"""The local block cache: what is put comes back, the least recently read goes first, the
directory stays within its stated bound however much passes through it, and anything at a block's
name that is not a regular file of the block's size (a FIFO, a big sparse file, a directory, a
symlink) is dropped unread and fetched again, never waited on, read whole, raised or followed."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from packer.io import cache as cache_module
from packer.io.cache import BlockCache


def test_put_then_get_returns_the_bytes_and_a_miss_is_none(tmp_path):
    c = BlockCache(tmp_path / "c", 1 << 20)
    data = np.arange(1000, dtype=np.uint16)
    c.put("sha:0:2000", data)
    assert np.array_equal(c.get("sha:0:2000", 2000).view(np.uint16), data)
    assert c.get("sha:2000:4000", 2000) is None
    assert [p.name for p in (tmp_path / "c").rglob("*") if p.is_file() and p.name != ".lock"] == \
        [cache_module.key_name("sha:0:2000") + ".blk"]  # no temporary file left


def test_the_least_recently_read_is_evicted_first(tmp_path):
    c = BlockCache(tmp_path / "c", 16 * 1000)  # scans after each 1000 bytes added
    for k in range(12):
        c.put(f"k{k}", np.zeros(1000, np.uint8))
        os.utime(c._file(f"k{k}"), ns=(k * 10**9, k * 10**9))  # put in order, one second apart
    c.get("k0", 1000)  # read now: the newest
    for k in range(12, 20):
        c.put(f"k{k}", np.zeros(1000, np.uint8))
        time.sleep(0.001)
    kept = {k for k in range(20) if c.get(f"k{k}", 1000) is not None}
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


BLOCK = np.arange(4096, dtype=np.uint8) * 7  # 4 KiB, not all one value


def _plant(path, kind: str, outside):
    """Something other than the block's file at its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(1 << 30)  # 1 GiB, no block allocated
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_bytes(b"x")
    elif kind == "symlink":
        outside.write_bytes(BLOCK.tobytes())  # even the right bytes, elsewhere: not followed
        path.symlink_to(outside)
    elif kind == "short":
        path.write_bytes(BLOCK.tobytes()[:100])


def _get_in_time(c, key, n_bytes, seconds=5.0):
    box = []
    thread = threading.Thread(target=lambda: box.append(c.get(key, n_bytes)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the cache read hung"
    return box[0]


@pytest.mark.parametrize("kind", ["fifo", "sparse", "directory", "symlink", "short"])
def test_anything_but_the_blocks_regular_file_is_dropped_and_fetched_again(tmp_path, kind):
    c = BlockCache(tmp_path / "c", 1 << 30)
    key, outside = "sha:0:4096", tmp_path / "elsewhere.bin"
    path = c._file(key)
    _plant(path, kind, outside)
    began = time.monotonic()
    assert _get_in_time(c, key, BLOCK.nbytes) is None  # a miss: the reader fetches from the store
    assert time.monotonic() - began < 1.0  # nothing read whole, nothing waited on
    assert not os.path.lexists(path)  # dropped
    if kind == "symlink":
        assert outside.read_bytes() == BLOCK.tobytes()  # the link's target untouched
    c.put(key, BLOCK)  # the fetched block is kept again, as a regular file
    assert np.array_equal(_get_in_time(c, key, BLOCK.nbytes), BLOCK)
    assert os.path.isfile(path) and not os.path.islink(path)


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_put_replaces_what_sits_at_the_name(tmp_path, kind):
    c = BlockCache(tmp_path / "c", 1 << 30)
    key, outside = "sha:0:4096", tmp_path / "elsewhere.bin"
    _plant(c._file(key), kind, outside)
    c.put(key, BLOCK)
    assert np.array_equal(_get_in_time(c, key, BLOCK.nbytes), BLOCK)
    if kind == "symlink":
        assert outside.read_bytes() == BLOCK.tobytes()


def test_a_temporary_name_taken_by_a_link_is_never_written_through(tmp_path, monkeypatch):
    """Temporary files are created O_EXCL | O_NOFOLLOW: a link planted at the name put would use
    is neither followed nor replaced; that put keeps nothing and the next one works."""
    c = BlockCache(tmp_path / "c", 1 << 30)
    key, victim = "sha:0:4096", tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    monkeypatch.setattr(cache_module.secrets, "token_hex", lambda n: "feedbeef")
    path = c._file(key)
    path.parent.mkdir(parents=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}.feedbeef")
    tmp.symlink_to(victim)
    c.put(key, BLOCK)
    assert victim.read_bytes() == b"precious" and os.path.islink(tmp)
    assert c.get(key, BLOCK.nbytes) is None
    monkeypatch.undo()
    c.put(key, BLOCK)
    assert np.array_equal(c.get(key, BLOCK.nbytes), BLOCK)


def test_a_linked_subdirectory_is_not_written_into(tmp_path):
    c = BlockCache(tmp_path / "c", 1 << 30)
    key, elsewhere = "sha:0:4096", tmp_path / "elsewhere"
    elsewhere.mkdir()
    c._file(key).parent.symlink_to(elsewhere)
    c.put(key, BLOCK)
    assert list(elsewhere.iterdir()) == []
