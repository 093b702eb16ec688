"""Streaming reads from S3 (conftest's local moto server, pyarrow's real S3 client): every row equals
the local memory maps' in every format, held memory stays under the stated bound on a dataset many
times larger, transient read errors are retried and a persistent one is named, and one cache
directory serves two processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import ROOT, build_stream_sample
from pyarrow import fs as pafs

from packer.io import fs, retry
from packer.store.dataset import ShardDataset, open_dataset
from packer.store.stream import StreamDataset

FORMATS = ("arrow", "memmap", "megatron")
SMALL = {"block_bytes": 64 << 10, "memory_bytes": 256 << 10, "read_ahead": 4}  # many blocks, a little memory


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The sample corpus built once in Arrow and memmap (context 1024, 4 shards; Arrow batches of
    20 rows, so a shard has several record batches). Megatron: `with_extras` below."""
    out = {}
    for fmt in ("arrow", "memmap"):
        path = tmp_path_factory.mktemp(fmt) / "ds"
        build_stream_sample(path, fmt)
        out[fmt] = path
    return out


@pytest.fixture(scope="module")
def remote(local, s3_uri):
    """The same datasets uploaded to S3: {format: URI}."""
    out = {}
    for fmt, path in local.items():
        uri = s3_uri(f"stream/{fmt}")
        for file in sorted(path.iterdir()):
            fs.upload(file, fs.location(uri) / file.name)
        out[fmt] = uri
    return out


def _same(x, y) -> bool:
    return (x is None and y is None) or (x is not None and y is not None and x.dtype == y.dtype and np.array_equal(x, y))


def _assert_same_rows(got, want, indices):
    t1, o1 = got
    t2, o2 = want
    assert len(t1) == len(indices) and len(t1) == len(t2)
    for a, b, c, d in zip(t1, t2, o1, o2):
        assert a.dtype == b.dtype and np.array_equal(a, b) and np.array_equal(c, d)


@pytest.mark.parametrize("fmt", ["arrow", "memmap"])
def test_streamed_rows_equal_local_rows(fmt, local, remote):
    ds, ref = open_dataset(remote[fmt], **SMALL), open_dataset(local[fmt])
    assert isinstance(ds, StreamDataset) and isinstance(ref, ShardDataset)
    assert len(ds) == len(ref) == ref.manifest["totals"]["sequences"] and len(ds._blocks) > 2 * len(ds._shards)
    order = np.random.default_rng(0).permutation(len(ref))
    ds.prefetch(order[: len(order) // 2])
    for c in range(0, len(order), 37):  # every row, in a shuffled order, across block and shard edges
        _assert_same_rows(ds.views(order[c : c + 37]), ref.views(order[c : c + 37]), order[c : c + 37])
    repeats = np.array([5, 5, -1, 0, len(ref) - 1, 5])
    _assert_same_rows(ds.views(repeats), ref.views(repeats), repeats)
    a, b = ds.get_many(order[:100]), ref.get_many(order[:100])
    assert all(_same(x, y) for x, y in zip(a, b)) and a.loss_mask is None
    assert np.array_equal(ds.doc_ids(), ref.doc_ids())
    assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(ds, ref))
    assert np.array_equal(ds[-1][0], ref[-1][0])
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]
    assert ds.max_held_bytes <= SMALL["memory_bytes"] + max(ds._nbytes)


@pytest.mark.parametrize("fmt", ["memmap", "arrow"])
def test_held_memory_stays_under_the_bound_on_a_dataset_ten_times_larger(fmt, remote, local):
    """Bound (packer/store/stream.py): blocks held <= memory_bytes + largest block, whatever the
    dataset size; measured twice: the reader's own count, and the bytes pyarrow has allocated
    (every ranged read lands in a pyarrow buffer), sampled after every read."""
    memory_bytes = 96 << 10
    ds = open_dataset(remote[fmt], memory_bytes=memory_bytes, block_bytes=16 << 10, read_ahead=4)
    data_bytes = sum(ds._nbytes)
    bound = memory_bytes + max(ds._nbytes)
    assert data_bytes > 10 * bound, (data_bytes, bound)  # the dataset is many times the bound
    base = pa.total_allocated_bytes()  # the indexes (held for good) and pyarrow's own
    peak = 0
    order = np.random.default_rng(1).permutation(len(ds))
    ds.prefetch(order)
    for c in range(0, len(order), 16):
        ds.views(order[c : c + 16])
        peak = max(peak, pa.total_allocated_bytes() - base)
    assert ds.stats["blocks fetched"] > 2 * len(ds._blocks)  # evicted and fetched again: the bound was binding
    assert ds.max_held_bytes <= bound and peak <= bound, (ds.max_held_bytes, peak, bound)


RSS_SCRIPT = """
import json, sys
import numpy as np
from packer.store.dataset import open_dataset
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
ds = open_dataset(sys.argv[1], memory_bytes=int(sys.argv[2]), block_bytes=int(sys.argv[3]))
order = np.random.default_rng(2).permutation(len(ds))
ds.views(order[:64]); ds.views(order[64:128])  # allocators and threads warmed up
base, peak = rss(), 0
ds.prefetch(order)
for c in range(0, len(order), 32):
    ds.views(order[c : c + 32])
    peak = max(peak, rss() - base)
print(json.dumps({"peak": peak, "data": sum(ds._nbytes), "held": ds.max_held_bytes}))
"""


COPIES, SLACK = 24, 8 << 20


@pytest.mark.slow
def test_process_memory_stays_under_the_bound_on_a_dataset_many_times_larger(s3_uri, local):
    """The reader's resident memory, in its own process, over a dataset of 24 shard copies (36 MB)
    read in a shuffled order with 4 MiB of blocks held: its RSS grows by less than the bound plus
    8 MiB of interpreter slack, a fraction of the data read."""
    src, uri = local["memmap"], s3_uri("stream/big")
    manifest = json.loads((src / "manifest.json").read_text())
    shards, n = [], 0
    for copy in range(COPIES):
        for entry in manifest["shards"]:
            new = dict(entry)
            for key in ("file", "index_file", "checksums_file"):
                new[key] = f"c{copy}-{entry[key]}"
                fs.upload(src / entry[key], fs.location(uri) / new[key])
            shards.append(new)
            n += 1
    manifest["shards"] = shards
    for key in ("sequences", "tokens_out", "pieces", "docs_accepted", "docs_dropped_long", "trained_tokens"):
        if key in manifest["totals"]:  # every count the manifest's own check sums over the shards (store/checks.py)
            manifest["totals"][key] *= COPIES
    (fs.location(uri) / "manifest.json").write_text(json.dumps(manifest))
    memory_bytes, block_bytes = 1 << 20, 64 << 10
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, uri, str(memory_bytes), str(block_bytes)], text=True,
                         capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    bound = memory_bytes + 2 * block_bytes
    print(got)
    assert got["data"] > 3 * (bound + SLACK) and got["held"] <= bound
    assert got["peak"] <= bound + SLACK, got


# -- failures: a real filesystem wrapped, its reads made to fail ---------------------------


class _FlakyFile:
    """A file of the real S3 filesystem whose reads fail as `plan(path, offset)` says."""

    def __init__(self, f, path, plan):
        self._f, self._path, self._plan = f, path, plan

    def read(self, n=-1):
        self._plan(self._path, self._f.tell())
        return self._f.read(n)

    def seek(self, pos, whence=0):
        return self._f.seek(pos, whence)

    def tell(self):
        return self._f.tell()

    def size(self):
        return self._f.size()

    def close(self):
        self._f.close()

    @property
    def closed(self):
        return self._f.closed

    def readable(self):
        return True

    def seekable(self):
        return True


class FlakyHandler(pafs.FileSystemHandler):
    """pyarrow's S3FileSystem as it is, but for reads: `plan(path, offset)` may raise before each."""

    def __init__(self, real, plan):
        self.real, self.plan = real, plan

    def get_type_name(self):
        return "flaky-s3"

    def normalize_path(self, path):
        return self.real.normalize_path(path)

    def get_file_info(self, paths):
        return self.real.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.real.get_file_info(selector)

    def open_input_file(self, path):
        return pa.PythonFile(_FlakyFile(self.real.open_input_file(path), path, self.plan), mode="r")

    def open_input_stream(self, path):
        return self.open_input_file(path)

    def create_dir(self, path, recursive): ...
    def delete_dir(self, path): ...
    def delete_dir_contents(self, path, missing_dir_ok=False): ...
    def delete_root_dir_contents(self): ...
    def delete_file(self, path): ...
    def move(self, src, dest): ...
    def copy_file(self, src, dest): ...
    def open_output_stream(self, path, metadata): ...
    def open_append_stream(self, path, metadata): ...


def _flaky(uri, plan):
    real = fs.location(uri)
    return fs.RemotePath(real.uri, pafs.PyFileSystem(FlakyHandler(real.fs, plan)), real.path)


QUICK_ATTEMPTS = 6


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(retry, "BASE_SECONDS", 0.001)
    monkeypatch.setenv("PACKER_REMOTE_ATTEMPTS", str(QUICK_ATTEMPTS))  # a count, so a persistent error ends at once


@pytest.mark.parametrize("fmt", ["arrow", "memmap"])
def test_transient_read_errors_are_retried(fmt, remote, local, quick_retries):
    """Every third read of a shard file fails once (a dropped connection): open and every row
    still succeed, equal to local, and the failures did happen."""
    failed, seen = [], set()

    def plan(path, offset):
        key = (path, offset)
        if "shard-" in path and key not in seen and len(seen) % 3 == 0:
            seen.add(key)
            failed.append(key)
            raise ConnectionResetError(f"injected: connection reset reading {path} at {offset}")
        seen.add(key)

    ds, ref = open_dataset(_flaky(remote[fmt], plan), **SMALL), open_dataset(local[fmt])
    order = np.arange(len(ref))[::-1]
    _assert_same_rows(ds.views(order), ref.views(order), order)
    assert len(failed) > 5


def test_a_persistent_read_error_names_the_file_and_range(remote, quick_retries):
    calls = []

    def plan(path, offset):
        if path.endswith("shard-00002.bin") and offset > 0:
            calls.append(offset)
            raise OSError("injected: AWS Error NETWORK_CONNECTION during GetObject")

    ds = open_dataset(_flaky(remote["memmap"], plan), **SMALL)  # opening reads only the .idx files
    b = next(b for b, (k, j, _) in enumerate(ds._blocks) if k == 2 and j == 1)  # shard 2's second block
    (_, start, stop), = ds._blocks[b][2]
    with pytest.raises(OSError) as e:
        ds.views([int(ds._block_starts[b])])
    message = str(e.value)
    assert "\n" not in message and "s3://***@packer-test/stream/memmap/shard-00002.bin?" in message
    assert f" bytes {start}-{stop}: " in message
    assert f"read failed {QUICK_ATTEMPTS} times" in message and "NETWORK_CONNECTION" in message
    assert "testing:testing" not in message and len(calls) == QUICK_ATTEMPTS


def test_a_missing_object_is_not_retried(remote, local, s3_uri, quick_retries):
    uri = s3_uri("stream/vanishing")
    for file in sorted(local["memmap"].iterdir()):
        fs.upload(file, fs.location(uri) / file.name)
    ds = open_dataset(uri, **SMALL)
    (fs.location(uri) / "shard-00001.bin").unlink()
    row = int(ds._block_starts[next(b for b, (k, _, _) in enumerate(ds._blocks) if k == 1)])
    with pytest.raises(FileNotFoundError, match=r"shard-00001.bin\?.* bytes 0-\d+: FileNotFoundError.*check the dataset's URI"):
        ds.views([row])


# -- the cache directory, shared by processes -----------------------------------------------

READER = """
import hashlib, json, sys
import numpy as np
from packer.store.dataset import open_dataset
ds = open_dataset(sys.argv[1], cache_dir=sys.argv[2], cache_bytes=int(sys.argv[3]), block_bytes=32 << 10,
                  memory_bytes=128 << 10)
h = hashlib.sha256()
order = np.random.default_rng(int(sys.argv[4])).permutation(len(ds))
for c in range(0, len(order), 50):
    for t in ds.views(order[c : c + 50])[0]:
        h.update(t.tobytes())
print(json.dumps({"digest": h.hexdigest(), **ds.stats}))
"""


def _readers(uri, cache, cache_bytes, seeds):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", READER, uri, str(cache), str(cache_bytes), str(s)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for s in seeds]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    return [json.loads(out) for out, _ in outs]


def _digest(ds, seed):
    h = hashlib.sha256()
    for t in ds.views(np.random.default_rng(seed).permutation(len(ds)))[0]:
        h.update(t.tobytes())
    return h.hexdigest()


def test_one_cache_directory_serves_two_processes(remote, local, tmp_path):
    """Process A reads every row through the cache; process B then reads them all without one
    request to the store. Then two processes at once over a cache a third of the dataset's size:
    both read the right rows, and the directory stays within its bound."""
    ref = open_dataset(local["memmap"])
    cache = tmp_path / "cache"
    (a,) = _readers(remote["memmap"], cache, 1 << 30, [3])
    (b,) = _readers(remote["memmap"], cache, 1 << 30, [4])
    assert a["digest"] == _digest(ref, 3) and b["digest"] == _digest(ref, 4)
    data_bytes = sum(p.stat().st_size for p in local["memmap"].glob("shard-*"))
    assert a["store bytes"] == data_bytes and a["cache hits"] > 20  # each byte from the store once, then the cache
    assert b.get("store bytes", 0) == 0 and b["cache hits"] > 20  # every block and index from the cache

    small = tmp_path / "small"
    cache_bytes = data_bytes // 3
    c, d = _readers(remote["memmap"], small, cache_bytes, [5, 6])
    assert c["digest"] == _digest(ref, 5) and d["digest"] == _digest(ref, 6)
    held = sum(f.stat().st_size for f in small.rglob("*.blk"))
    assert 0 < held <= cache_bytes * (1 + 2 / 16), (held, cache_bytes)


def test_a_cache_entry_that_is_not_the_blocks_file_is_fetched_again(remote, local, tmp_path):
    """A warm cache whose every entry is replaced, in turn, by a FIFO, a 1 GiB sparse file, a
    directory, a symlink to the right bytes elsewhere, or a short file: a reader neither hangs,
    reads a GiB, raises nor follows a link; it fetches each block again and yields the local rows."""
    cache = tmp_path / "cache"
    warm = open_dataset(remote["memmap"], cache_dir=cache, **SMALL)
    chunks = np.array_split(np.arange(len(warm)), 12)  # reads of a few blocks each
    for chunk in chunks:
        warm.views(chunk)
    entries = sorted(cache.rglob("*.blk"))
    assert len(entries) > 10
    for n, path in enumerate(entries):
        data = path.read_bytes()
        path.unlink()
        kind = n % 5
        if kind == 0:
            os.mkfifo(path)
        elif kind == 1:
            with open(path, "wb") as f:
                f.truncate(1 << 30)
        elif kind == 2:
            path.mkdir()
        elif kind == 3:
            (tmp_path / path.name).write_bytes(data)
            path.symlink_to(tmp_path / path.name)
        else:
            path.write_bytes(data[: len(data) // 2])
    ds, ref = open_dataset(remote["memmap"], cache_dir=cache, **SMALL), open_dataset(local["memmap"])
    for chunk in chunks:
        _assert_same_rows(ds.views(chunk), ref.views(chunk), chunk)
    assert ds.stats["store bytes"] == warm.stats["store bytes"] and ds.stats.get("cache hits", 0) == 0
    assert all(p.is_file() and not p.is_symlink() for p in cache.rglob("*.blk"))  # kept again, as files


def test_packed_dataset_from_s3_yields_the_local_batches_and_resumes(remote, local):
    torch = pytest.importorskip("torch")
    from packer.train.data import PackedDataset

    torch.set_num_threads(1)
    for fmt in ("arrow", "memmap"):
        streamed = list(PackedDataset(remote[fmt], seed=3, batch_size=4))
        stored = list(PackedDataset(local[fmt], seed=3, batch_size=4))
        assert len(streamed) == len(stored) > 10
        for x, y in zip(streamed, stored):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x if isinstance(x[k], torch.Tensor))
        interrupted = PackedDataset(remote[fmt], seed=3, batch_size=4)
        it = iter(interrupted)
        for _ in range(5):
            next(it)
        state = interrupted.state_dict()  # a worker killed here resumes from its saved state
        resumed = PackedDataset(remote[fmt], seed=3, batch_size=4)
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert len(rest) == len(stored) - 5 and all(torch.equal(x["input_ids"], y["input_ids"])
                                                    for x, y in zip(rest, stored[5:]))


def test_options_from_the_environment_and_bad_values(remote, monkeypatch, tmp_path):
    monkeypatch.setenv("PACKER_STREAM_MEMORY_BYTES", str(1 << 20))
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "c"))
    ds = open_dataset(remote["memmap"])
    assert ds.options["memory_bytes"] == 1 << 20 and ds._cache is not None
    assert open_dataset(remote["memmap"], memory_bytes=1 << 21).options["memory_bytes"] == 1 << 21
    monkeypatch.setenv("PACKER_READ_AHEAD", "lots")
    with pytest.raises(ValueError, match="PACKER_READ_AHEAD='lots': expected a whole number"):
        open_dataset(remote["memmap"])
    with pytest.raises(ValueError, match="memory_bytes=0: must be at least 1 byte"):
        open_dataset(remote["memmap"], memory_bytes=0, read_ahead=1)
    assert Path(str(tmp_path / "c")).is_dir()


def test_dataloader_workers_stream_from_s3(remote, local):
    """Two DataLoader worker processes (fork: the parent has used S3 and its threads already) each
    open the stream; together they yield the batches of the local dataset."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from packer.train.data import PackedDataset

    torch.set_num_threads(1)
    streamed = PackedDataset(remote["memmap"], seed=4, batch_size=4)
    next(iter(streamed))  # the parent streams first: its pool and S3 client exist before the fork
    got = list(DataLoader(streamed, batch_size=None, num_workers=2, timeout=120))
    want = list(DataLoader(PackedDataset(local["memmap"], seed=4, batch_size=4), batch_size=None, num_workers=2))
    assert len(got) == len(want) > 10
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(got, want))


@pytest.fixture(scope="module")
def with_extras(tmp_path_factory, s3_uri):
    """extras(fmt) -> (path, URI): a build of that format whose shards carry loss masks and source
    ids (test_extras.py's rewrite), local and uploaded; built on first use."""
    from test_extras import _build, _rewrite_with_extras

    built = {}

    def extras(fmt):
        if fmt not in built:
            path = _build(tmp_path_factory.mktemp(f"extras-{fmt}"), fmt)
            _rewrite_with_extras(path, fmt, np.random.default_rng(7))
            uri = s3_uri(f"stream/extras-{fmt}")
            for file in sorted(p for p in path.iterdir() if p.is_file()):
                fs.upload(file, fs.location(uri) / file.name)
            built[fmt] = path, uri
        return built[fmt]

    return extras


@pytest.mark.parametrize("fmt", ["arrow", "megatron", pytest.param("memmap", marks=pytest.mark.slow)])  # memmap's
def test_streamed_masks_and_sources_equal_local(fmt, with_extras):  # sidecar reads are Megatron's: slow, one build less
    path, uri = with_extras(fmt)
    ds, ref = open_dataset(uri, **SMALL), open_dataset(path)
    assert (ds.has_loss_mask, ds.has_source_ids, ds.source_names) == (True, True, ["prose", "code"])
    order = np.random.default_rng(8).permutation(len(ref))
    for c in range(0, len(order), 50):
        part = order[c : c + 50]
        _assert_same_rows(ds.views(part), ref.views(part), part)
        for got, want in ((ds.mask_views(part), ref.mask_views(part)), (ds.source_views(part), ref.source_views(part))):
            assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, want))
    a, b = ds.get_many(order[:200]), ref.get_many(order[:200])
    assert all(_same(x, y) for x, y in zip(a, b))
    assert a.loss_mask is not None and a.source_ids is not None and 0 < a.loss_mask.mean() < 1


# -- the Arrow header walk, against pyarrow's own reader --------------------------------


def _ipc_bytes(batches, file_form: bool) -> bytes:
    sink = pa.BufferOutputStream()
    new = pa.ipc.new_file if file_form else pa.ipc.new_stream
    with new(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("file_form", [False, True])
def test_arrow_batches_found_by_their_headers_are_pyarrows(file_form):
    from packer.store.formats import arrow

    rng = np.random.default_rng(9)
    batches = []
    for n in (1, 7, 300, 2):  # rows per batch
        lengths = rng.integers(1, 50, n)
        bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        ids = pa.ListArray.from_arrays(pa.array(bounds), pa.array(rng.integers(0, 9, bounds[-1]).astype(np.uint16)))
        offs = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * 2),
                                        pa.array(np.column_stack([np.zeros(n), lengths]).ravel().astype(np.int32)))
        docs = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), pa.array(np.arange(n, dtype=np.int64)))
        batches.append(pa.record_batch({"input_ids": ids, "offsets": offs, "doc_ids": docs}))
    data = _ipc_bytes(batches, file_form)
    requests = []

    def read(path, start, stop):
        requests.append((start, stop))
        return data[start:stop]

    bounds, ranges, state, counts, fields = arrow.stream_index(read, lambda p: len(data), [fs.location("x.arrow")], 0)
    assert bounds.tolist() == [0, 1, 8, 308, 310] and counts == {"sequences": 310} and fields == ()
    assert len(requests) <= len(batches) + 3  # one small read per message, not the bodies
    for k, batch in enumerate(batches):
        (_, start, stop), = ranges[k]
        rows, doc_ids = arrow.stream_block(state, bounds, k, [data[start:stop]])
        assert np.array_equal(rows.tokens, batch.column("input_ids").values.to_numpy())
        assert np.array_equal(rows.offsets, batch.column("offsets").values.to_numpy())
        assert np.array_equal(doc_ids, batch.column("doc_ids").values.to_numpy())
    if not file_form:
        with pytest.raises(ValueError, match="truncated"):
            cut = data[: ranges[2][0][2] - 10]
            arrow.stream_index(lambda p, a, b: cut[a:b], lambda p: len(cut), [fs.location("x.arrow")], 0)
        with pytest.raises(ValueError, match="bytes after its end-of-stream marker"):
            more = data + b"\0" * 8
            arrow.stream_index(lambda p, a, b: more[a:b], lambda p: len(more), [fs.location("x.arrow")], 0)
