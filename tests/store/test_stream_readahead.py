"""Read-ahead never reads more than reading on demand: the read plan's runs and cursor by hand, then
PackedDataset and plain views streamed from an fsspec memory:// store in stored order, a block
shuffle and a full shuffle, with memory a fraction of the data: the bytes read with read-ahead are
at most those without it, and every row equals the local memory maps'."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_stream_sample

from packer.io import fs
from packer.store.dataset import open_dataset
from packer.store.read_plan import NEVER, ReadPlan, call_runs, runs_of
from packer.store.stream import StreamDataset

# -- the plan by hand ----------------------------------------------------------------


def test_runs_and_the_cursor_of_the_docstring_example():
    blocks = np.array([3, 3, 1, 3, 0, 0])
    assert [a.tolist() for a in runs_of(blocks)] == [[3, 1, 3, 0], [2, 1, 1, 2]]
    plan = ReadPlan()
    plan.extend(blocks)
    assert plan.next_uses([3, 1, 0, 7]).tolist() == [0, 2, 4, NEVER]
    assert plan.follow(np.array([3, 3, 1])) and (plan.read, plan.next) == (0, 3)
    assert plan.next_uses([3, 1, 0, 7]).tolist() == [0, 2, 4, NEVER]  # the call in progress still uses them
    assert plan.follow(np.array([3, 1, 3])) and (plan.read, plan.next) == (0, 3)  # read again (loss masks): stays
    assert plan.follow(np.array([0, 3, 0])) and (plan.read, plan.next) == (3, 6)  # any order within a call
    assert plan.next_uses([3, 1, 0]).tolist() == [3, NEVER, 4]
    assert plan.next_uses([3, 1, 0], since=4).tolist() == [NEVER, NEVER, 4]
    assert not plan.follow(np.array([5])) and (plan.read, plan.next) == (3, 6)  # not planned: the cursor stays


def test_extend_drops_what_was_read_and_rewind_goes_back():
    plan = ReadPlan()
    plan.extend(np.array([4, 4, 5, 6]))
    assert plan.follow(np.array([4, 4])) and plan.follow(np.array([5]))
    plan.extend(np.array([7, 4]))  # rows before the call in progress are forgotten, rows renumbered
    assert plan.blocks.tolist() == [5, 6, 7, 4] and plan.ends.tolist() == [1, 2, 3, 4] and (plan.read, plan.next) == (0, 1)
    assert plan.next_uses([4, 5, 6]).tolist() == [3, 0, 1]
    assert plan.ahead(plan.next) == (1, 6, 1)
    plan.at = 4
    plan.rewind(2)  # a block wanted at row 2 was let go: the walk ahead fetches it again
    assert plan.ahead(plan.next) == (2, 7, 2)
    plan.extend(np.array([9]), reset=True)
    assert plan.blocks.tolist() == [9] and (plan.read, plan.next, plan.at) == (0, 0, 0)


def test_next_uses_equal_a_scan_of_the_rows():
    """next_uses (one binary search) against the obvious scan, over random plans told in random calls."""
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(200):
        plan = ReadPlan()
        n = int(rng.integers(1, 60))
        rows = rng.integers(0, 8, size=n)
        cuts = np.sort(rng.choice(np.arange(1, n), size=min(n - 1, int(rng.integers(0, 6))), replace=False))
        calls = np.diff(np.concatenate([[0], cuts, [n]])) if rng.random() < 0.5 else None
        plan.extend(rows, calls=calls)
        if rng.random() < 0.5:
            plan.follow(plan.rows_blocks(0, min(n, 3)))
        since = int(rng.integers(0, n + 1))
        want = []
        for b in range(9):
            hits = [r for r in range(max(since, plan.read), len(plan)) if plan.rows_blocks(r, r + 1)[0] == b]
            want.append(hits[0] if hits else NEVER)
        assert plan.next_uses(np.arange(9), since).tolist() == want
        checked += sum(w != NEVER for w in want)
    assert checked > 200


def test_a_call_reads_the_block_used_last_first():
    # calls [3 1 3] [1 2] [0]: block 3 is not used after the first call, 1 is (in the second)
    blocks, rows = call_runs(np.array([3, 1, 3, 1, 2, 0]), [3, 2, 1])
    assert blocks.tolist() == [3, 1, 1, 2, 0] and rows.tolist() == [2, 1, 1, 1, 1]
    # the first call: block 1 is not used again, 0 is in the third call, 2 in the second: read 1, 0, 2
    blocks, _ = call_runs(np.array([0, 1, 2, 2, 0]), [3, 1, 1])
    assert blocks.tolist() == [1, 0, 2, 2, 0]


# -- streamed: read-ahead against reading on demand -----------------------------------


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """{format: (local path, memory:// URI)}: the sample corpus at context 1024, shards of 200k
    tokens; Arrow record batches of 20 rows, so Arrow blocks are small too."""
    out = {}
    for fmt in ("arrow", "memmap"):
        path = tmp_path_factory.mktemp(fmt) / "ds"
        build_stream_sample(path, fmt)
        uri = f"memory://packer-readahead/{fmt}"
        for file in sorted(path.iterdir()):
            fs.upload(file, fs.location(uri) / file.name)
        out[fmt] = (path, uri)
    return out


BLOCK_BYTES = 16 << 10


def _memory_for(uri, share: float) -> int:
    ds = open_dataset(uri, block_bytes=BLOCK_BYTES)
    return max(int(sum(ds._nbytes) * share), 2 * max(ds._nbytes))


@pytest.mark.parametrize("fmt", ["arrow", "memmap"])
@pytest.mark.parametrize("shuffle", [False, "block", True])
def test_packed_dataset_reads_no_more_with_read_ahead(fmt, shuffle, datasets, monkeypatch):
    """PackedDataset tells the stream each chunk's rows and read calls (data.py _will_read); with a
    quarter of the data in memory, read-ahead reads at most the bytes reading on demand reads, and
    every batch equals the local dataset's."""
    torch = pytest.importorskip("torch")
    from packer.train.data import PackedDataset
    from packer.train.order import BlockShuffle

    torch.set_num_threads(1)
    path, uri = datasets[fmt]
    monkeypatch.setenv("PACKER_BLOCK_BYTES", str(BLOCK_BYTES))
    monkeypatch.setenv("PACKER_STREAM_MEMORY_BYTES", str(_memory_for(uri, 0.25)))
    order = {"shuffle": BlockShuffle(block=16, window=2) if shuffle == "block" else shuffle}
    want = list(PackedDataset(path, seed=5, batch_size=4, **order))
    stats = {}
    for read_ahead in (0, 4):
        monkeypatch.setenv("PACKER_READ_AHEAD", str(read_ahead))
        loader = PackedDataset(uri, seed=5, batch_size=4, **order)
        got = list(loader)
        assert len(got) == len(want) > 10
        assert all(torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["cu_seqlens"], y["cu_seqlens"])
                   for x, y in zip(got, want))
        stream = loader._open()[0]
        assert isinstance(stream, StreamDataset)
        stats[read_ahead] = dict(stream.stats, data=sum(stream._nbytes), pool=stream._pool is not None)
    assert stats[4]["pool"] and not stats[0]["pool"]  # the read-ahead case did fetch in the background
    if shuffle:  # memory was binding: blocks were read again
        assert stats[0]["store bytes"] > stats[0]["data"] * 1.05, stats
    assert stats[4]["store bytes"] <= stats[0]["store bytes"], stats


@pytest.mark.parametrize("fmt", ["arrow", "memmap"])
def test_views_read_no_more_with_read_ahead_in_calls_of_any_size(fmt, datasets):
    """Plain views after prefetch(rows, calls): rows in a block-shuffled order read in calls of
    random sizes, then rows the plan never named (ds[i], a repeat), against local views."""
    path, uri = datasets[fmt]
    ref = open_dataset(path)
    rng = np.random.default_rng(7)
    n = len(ref)
    starts = rng.permutation(np.arange(0, n, 24))  # runs of 24 stored rows in a random order, each shuffled
    order = np.concatenate([rng.permutation(np.arange(s, min(s + 24, n))) for s in starts])
    cuts = np.cumsum(rng.integers(5, 60, size=n))
    calls = np.diff(np.concatenate([[0], cuts[cuts < n], [n]]))
    stats = {}
    for read_ahead in (0, 4):
        ds = open_dataset(uri, block_bytes=BLOCK_BYTES, memory_bytes=_memory_for(uri, 0.2), read_ahead=read_ahead)
        ds.prefetch(order, calls=calls)
        if read_ahead:
            assert len(ds._ahead) >= read_ahead  # fetched ahead before the first read
        at = 0
        for size in calls.tolist():
            rows = order[at : at + size]
            got, want = ds.views(rows), ref.views(rows)
            assert all(np.array_equal(t, u) and np.array_equal(o, p) for t, o, u, p in zip(*got, *want))
            at += size
        assert np.array_equal(ds[n - 1][0], ref[n - 1][0]) and np.array_equal(ds.views([3, 3])[0][1], ref[3][0])
        assert ds.max_held_bytes <= ds.options["memory_bytes"] + max(ds._nbytes)
        stats[read_ahead] = dict(ds.stats)
    assert stats[0]["store bytes"] > sum(ds._nbytes)  # memory was binding
    assert stats[4]["store bytes"] <= stats[0]["store bytes"], stats


def test_prefetch_calls_must_add_up(datasets):
    ds = open_dataset(datasets["memmap"][1], read_ahead=0)
    with pytest.raises(ValueError, match="calls add up to 5 rows, not the 4 indices given"):
        ds.prefetch([0, 1, 2, 3], calls=[2, 3])


def test_a_read_bigger_than_memory_warns_once_and_still_reads_its_rows(datasets):
    """A call whose blocks exceed memory_bytes reads them one at a time: one warning says what to raise."""
    import warnings

    path, uri = datasets["memmap"]
    ref = open_dataset(path)
    ds = open_dataset(uri, block_bytes=BLOCK_BYTES, memory_bytes=2 * BLOCK_BYTES, read_ahead=2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ds.views([0])  # one block: fits
        assert not seen
        rows = np.arange(0, len(ref), max(1, len(ref) // 12))  # a dozen blocks apart
        for _ in range(2):
            got, want = ds.views(rows), ref.views(rows)
            assert all(np.array_equal(t, u) for t, u in zip(got[0], want[0]))
    assert len(seen) == 1 and "raise memory_bytes (PACKER_STREAM_MEMORY_BYTES)" in str(seen[0].message)
