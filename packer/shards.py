"""Shard files (Arrow IPC or memmap), their manifest entries, and the reader for built datasets.

Both formats store the same rows. A row [a a a | b b | c] has offsets [0, 3, 5, 6] and
doc_ids [17, 4, 230]. Several rows travel as CSR arrays (`Rows`):

    tokens         [a a a b b c | d d d d]        stored dtype (uint16 or uint32)
    token_starts   [0, 6, 10]                     row s = tokens[token_starts[s] : token_starts[s+1]]
    offsets        [0 3 5 6 | 0 4]                int32, each row from 0 to its length
    offset_starts  [0, 4, 6]                      row s's offsets = offsets[offset_starts[s] : ...[s+1]]

Arrow shard (`shard-00000.arrow`), one row per packed sequence:

    input_ids: list<uint16|uint32>   the row's tokens, unpadded
    offsets:   list<int32>           document boundaries in the row: [0, ..., len(row)]
    doc_ids:   list<int64>           global document index of each segment (audits)

Memmap shard (`shard-00000.bin` + `.idx`): see packer/memmap.py for the byte layout.
"""

from __future__ import annotations

import bisect
import collections
import functools
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from packer import atomic, memmap
from packer.plan import Plan

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATS = "stats.json"
ROWS_PER_BATCH = 4096
SUFFIX = {"arrow": ".arrow", "memmap": ".bin"}


class Rows(NamedTuple):
    """Rows in CSR form (see the module docstring); `ds.get_many` returns one of these."""

    tokens: np.ndarray
    token_starts: np.ndarray
    offsets: np.ndarray
    offset_starts: np.ndarray

    def __len__(self) -> int:
        return len(self.token_starts) - 1

    def row(self, k: int):
        """(tokens, offsets) of row k."""
        t0, t1 = self.token_starts[k], self.token_starts[k + 1]
        return self.tokens[t0:t1], self.offsets[self.offset_starts[k] : self.offset_starts[k + 1]]


def shard_name(index: int, fmt: str = "arrow") -> str:
    return f"shard-{index:05d}{SUFFIX[fmt]}"


def shard_files(entry: dict) -> list[str]:
    """Every file of one manifest shard entry (a memmap shard has two)."""
    return [entry["file"]] + ([entry["index_file"]] if "index_file" in entry else [])


def sha256_file(path, chunk_bytes: int = 8 * 2**20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


# ---- write -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _load_plan(path: str, mtime_ns: int) -> Plan:
    return Plan.load(path)  # once per worker process, not once per shard


def _gather_tokens(plan: Plan, p0: int, p1: int, units_dir: Path, dtype, units: dict) -> np.ndarray:
    """Concatenate the tokens of pieces p0..p1 from the unit token files (memory-mapped).

    One bytes.join over memoryview slices: 1.4 us a piece against 4 us for a loop of
    ndarray slice assignments (7000 pieces of ~700 tokens, a busy 2-core box, 2026-11-29).
    Returns a read-only array over the joined bytes."""
    itemsize = np.dtype(dtype).itemsize
    piece_unit = plan.piece_unit[p0:p1]
    for u in np.unique(piece_unit).tolist():
        if u not in units:
            array = np.load(units_dir / f"unit-{u:06d}.tokens.npy", mmap_mode="r")
            units[u] = memoryview(array.view(np.ndarray)).cast("B")
    begin = plan.piece_start[p0:p1] * itemsize
    end = begin + plan.piece_len[p0:p1] * itemsize
    data = b"".join([units[u][a:b] for u, a, b in zip(piece_unit.tolist(), begin.tolist(), end.tolist())])
    return np.frombuffer(data, dtype=dtype)


class Layout(NamedTuple):
    """A shard without its tokens: row bounds, offsets and doc_ids (CSR, starting at 0).
    Row s's doc_ids are doc_ids[offset_starts[s] - s : offset_starts[s+1] - s - 1]."""

    token_starts: np.ndarray
    offsets: np.ndarray
    offset_starts: np.ndarray
    doc_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.token_starts) - 1


def shard_layout(plan: Plan, shard: int) -> tuple[Layout, int]:
    """The layout of one shard from the plan alone, and its first piece."""
    s0, s1 = int(plan.shard_starts[shard]), int(plan.shard_starts[shard + 1])
    p0, p1 = int(plan.seq_starts[s0]), int(plan.seq_starts[s1])
    piece_len = plan.piece_len[p0:p1]
    seq_starts = plan.seq_starts[s0 : s1 + 1] - p0  # pieces of each row, relative to p0
    piece_end = np.cumsum(piece_len)
    token_starts = np.concatenate([[0], piece_end])[seq_starts].astype(np.int64)
    # offsets of row r: [0, piece ends of its pieces...] relative to the row start.
    n_pieces = np.diff(seq_starts)
    row_of_piece = np.repeat(np.arange(len(n_pieces)), n_pieces)
    offsets = np.zeros(len(piece_len) + len(n_pieces), dtype=np.int32)
    offsets[np.arange(len(piece_len)) + row_of_piece + 1] = piece_end - token_starts[row_of_piece]
    offset_starts = (seq_starts + np.arange(len(seq_starts))).astype(np.int64)
    return Layout(token_starts, offsets, offset_starts, plan.piece_doc[p0:p1].astype(np.int64)), p0


def shard_rows(plan: Plan, shard: int, units_dir: Path, dtype) -> tuple[Rows, np.ndarray]:
    """The rows of one shard, tokens gathered, and the doc_id of each segment."""
    layout, p0 = shard_layout(plan, shard)
    tokens = _gather_tokens(plan, p0, p0 + len(layout.doc_ids), units_dir, dtype, {})
    return Rows(tokens, layout.token_starts, layout.offsets, layout.offset_starts), layout.doc_ids


_THREADS: list[ThreadPoolExecutor] = []  # [writer, hasher], one thread each, made once per process
THREADED_WRITES = True  # False: write and hash in the calling thread (benchmarks compare both)


class _HashedFile:
    """A temporary file beside `final` that two threads fill: one writes each buffer, one
    hashes it (both release the GIL), while the caller prepares the next. Small writes
    (pyarrow's IPC metadata) are coalesced so each hand-over moves megabytes. Buffers must
    not change after `write`. Also the file-like object pyarrow's IPC writer needs."""

    IN_FLIGHT = 4  # buffers queued per thread: bounds memory to a few chunks
    SMALL = 1 << 16

    def __init__(self, final: Path):
        if THREADED_WRITES and not _THREADS:
            _THREADS.extend(ThreadPoolExecutor(1, thread_name_prefix=f"packer-{n}") for n in ("write", "hash"))
        self.tmp = atomic.tmp_path(final)
        self._file = open(self.tmp, "wb")
        self._hash = hashlib.sha256()
        self._pos, self.closed = 0, False
        self._small = bytearray()
        self._pending: collections.deque = collections.deque()

    def _submit(self, buf):
        if not THREADED_WRITES:
            self._file.write(buf)
            self._hash.update(buf)
            return
        writer, hasher = _THREADS
        self._pending.append(writer.submit(self._file.write, buf))
        self._pending.append(hasher.submit(self._hash.update, buf))
        while len(self._pending) > 2 * self.IN_FLIGHT:
            self._pending.popleft().result()

    def write(self, buf) -> int:
        n = memoryview(buf).nbytes
        self._pos += n
        if n < self.SMALL:
            self._small += buf
        else:
            if self._small:
                self._submit(bytes(self._small))
                self._small.clear()
            self._submit(buf)
        return n

    def tell(self) -> int:
        return self._pos

    def flush(self):
        pass

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            if self._small:
                self._submit(bytes(self._small))
            while self._pending:
                self._pending.popleft().result()  # re-raises a failed write (disk full, ...)
        finally:
            self._file.close()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _row_chunks(n_rows: int):
    return [(r, min(r + ROWS_PER_BATCH, n_rows)) for r in range(0, max(n_rows, 1), ROWS_PER_BATCH)]


def _arrow_batch(layout: Layout, r0: int, r1: int, tokens: np.ndarray) -> pa.RecordBatch:
    value_type = pa.uint16() if tokens.dtype.itemsize == 2 else pa.uint32()
    o0, o1 = int(layout.offset_starts[r0]), int(layout.offset_starts[r1])

    def column(bounds, values, type=None):
        return pa.ListArray.from_arrays(pa.array((bounds - bounds[0]).astype(np.int32)), pa.array(values, type=type))

    return pa.record_batch(
        {
            "input_ids": column(layout.token_starts[r0 : r1 + 1], tokens, value_type),
            "offsets": column(layout.offset_starts[r0 : r1 + 1], layout.offsets[o0:o1]),
            "doc_ids": column(layout.offset_starts[r0 : r1 + 1] - np.arange(r0, r1 + 1), layout.doc_ids[o0 - r0 : o1 - r1]),
        }
    )


def write_rows(layout: Layout, tokens_of, out_dir: Path, shard: int, fmt: str) -> dict:
    """Write one shard's files atomically (temporary names, then renames); return its entry.

    `tokens_of(r0, r1)` gives the tokens of rows r0..r1 (a new array each call, in the
    stored dtype): rows go out in chunks of ROWS_PER_BATCH, gathered while the previous
    chunk is written and hashed, so the whole shard never sits in memory."""
    final = out_dir / shard_name(shard, fmt)
    chunks = _row_chunks(len(layout))
    files = [(final, _HashedFile(final))]
    try:
        if fmt == "arrow":
            sink = pa.PythonFile(files[0][1], mode="w")
            with ipc.new_file(sink, _arrow_batch(layout, 0, 0, tokens_of(0, 0)).schema) as writer:
                for r0, r1 in chunks:
                    writer.write_batch(_arrow_batch(layout, r0, r1, tokens_of(r0, r1)))
        else:
            for r0, r1 in chunks:
                tokens = tokens_of(r0, r1)
                files[0][1].write(memoryview(tokens.astype(tokens.dtype.newbyteorder("<"), copy=False)).cast("B"))
            itemsize = tokens.dtype.itemsize
            idx_final = out_dir / memmap.index_name(final.name)
            files.append((idx_final, _HashedFile(idx_final)))
            for buf in memmap.index_bytes(layout.token_starts, layout.offset_starts, layout.doc_ids, layout.offsets, itemsize):
                files[1][1].write(buf)
    finally:
        for _, f in files:
            f.close()
    entry = {"file": final.name, "sha256": files[0][1].hexdigest()}
    if fmt == "memmap":
        entry.update(index_file=files[1][0].name, index_sha256=files[1][1].hexdigest())
    atomic.kill_point("write-shard", shard)
    for path, f in files:
        os.replace(f.tmp, path)
    return entry


def write_shard(plan_path: str, shard: int, work_dir: str, out_dir: str, dtype: str, fmt: str = "arrow") -> dict:
    """Write one shard (skipped if a finished run of this call left its entry); return its entry."""
    work = Path(work_dir)
    done = work / "shards" / f"shard-{shard:05d}.json"
    if done.exists():
        entry = json.loads(done.read_text(encoding="utf-8"))
        if all((Path(out_dir) / f).exists() for f in shard_files(entry)):
            return entry
    plan = _load_plan(plan_path, os.stat(plan_path).st_mtime_ns)
    layout, p0 = shard_layout(plan, shard)
    pieces = p0 + np.concatenate([[0], np.cumsum(np.diff(layout.offset_starts) - 1)])  # first piece of each row
    units: dict[int, np.ndarray] = {}

    def tokens_of(r0: int, r1: int) -> np.ndarray:
        return _gather_tokens(plan, int(pieces[r0]), int(pieces[r1]), work / "units", np.dtype(dtype), units)

    entry = {
        **write_rows(layout, tokens_of, Path(out_dir), shard, fmt),
        "sequences": len(layout),
        "tokens": int(layout.token_starts[-1]),
        "documents": len(layout.doc_ids),
    }
    done.parent.mkdir(exist_ok=True)
    atomic.write_json(done, entry)
    return entry


# ---- read --------------------------------------------------------------------------------


def read_manifest(path) -> dict:
    path = Path(path)
    file = path / MANIFEST if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no {MANIFEST} in {path}: not a packer dataset, or its build did not finish "
            "(run the same `packer build` command again to resume it)"
        )
    return json.loads(file.read_text(encoding="utf-8"))


def _arrow_blocks(file: Path):
    """One Rows (plus the doc_ids list array) per record batch, zero-copy over a memory map."""
    reader = ipc.open_file(pa.memory_map(str(file), "r"))
    for b in range(reader.num_record_batches):
        batch = reader.get_batch(b)
        ids, offs = batch.column("input_ids"), batch.column("offsets")
        rows = Rows(
            ids.values.to_numpy(zero_copy_only=True),
            ids.offsets.to_numpy(),
            offs.values.to_numpy(zero_copy_only=True),
            offs.offsets.to_numpy(),
        )
        yield rows, batch.column("doc_ids")


def shard_blocks(directory: Path, entry: dict, fmt: str):
    """Yield (Rows, doc_id count) for the blocks of one shard: record batches, or the whole memmap."""
    file = directory / entry["file"]
    if fmt == "arrow":
        for rows, doc_ids in _arrow_blocks(file):
            yield rows, len(doc_ids.values) if len(doc_ids) else 0
    else:
        tokens, token_starts, offsets, offset_starts, doc_ids = memmap.open_shard(file, directory / entry["index_file"])
        yield Rows(tokens, token_starts, offsets, offset_starts), len(doc_ids)


class ShardDataset:
    """Random access to the sequences of a built dataset (either format).

    ds[i] -> (tokens, offsets): read-only numpy views into memory-mapped files; O(1) and
    touching only that row's pages. ds.get_many(indices) -> Rows: many rows at once,
    copied into one CSR batch. Iteration yields ds[0], ds[1], ... in stored order."""

    def __init__(self, path):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.format = self.manifest["config"].get("format", "arrow")
        self._blocks: list[Rows] = []
        starts = [0]
        for entry in self.manifest["shards"]:
            for rows, _ in shard_blocks(self.path, entry, self.format):
                self._blocks.append(rows)
                starts.append(starts[-1] + len(rows))
        self._block_starts = np.asarray(starts, dtype=np.int64)
        self._starts_list = starts  # bisect on a list beats np.searchsorted for one scalar
        self._n = starts[-1]

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        n = self._n
        if not -n <= i < n:
            raise IndexError(f"sequence {i} out of range for a dataset of {n}")
        i = int(i) % n
        b = bisect.bisect_right(self._starts_list, i) - 1
        rows = self._blocks[b]
        r = i - self._starts_list[b]
        t0, t1 = rows.token_starts[r], rows.token_starts[r + 1]
        return rows.tokens[t0:t1], rows.offsets[rows.offset_starts[r] : rows.offset_starts[r + 1]]

    def get_many(self, indices) -> Rows:
        """Rows `indices` (any order, repeats allowed) as one CSR batch: `Rows.row(k)` equals
        `ds[indices[k]]`. Tokens keep the stored dtype, offsets are int32."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self._n
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"indices must be in [-{n}, {n}) for a dataset of {n} sequences")
        idx = idx % n if n else idx
        block = self._block_starts.searchsorted(idx, side="right") - 1
        local = idx - self._block_starts[block]
        spans = np.empty((len(idx), 4), dtype=np.int64)  # t0, t1, o0, o1 of each row
        for b in np.unique(block).tolist():
            sel = block == b
            r, rows = local[sel], self._blocks[b]
            spans[sel] = np.stack(
                [rows.token_starts[r], rows.token_starts[r + 1], rows.offset_starts[r], rows.offset_starts[r + 1]], 1
            )
        token_starts = np.concatenate([[0], np.cumsum(spans[:, 1] - spans[:, 0])])
        offset_starts = np.concatenate([[0], np.cumsum(spans[:, 3] - spans[:, 2])])
        dtype = self._blocks[0].tokens.dtype if self._blocks else np.uint16
        tokens = np.empty(int(token_starts[-1]), dtype=dtype)
        offsets = np.empty(int(offset_starts[-1]), dtype=np.int32)
        for k, (b, (t0, t1, o0, o1)) in enumerate(zip(block.tolist(), spans.tolist())):
            rows = self._blocks[b]
            tokens[token_starts[k] : token_starts[k + 1]] = rows.tokens[t0:t1]
            offsets[offset_starts[k] : offset_starts[k + 1]] = rows.offsets[o0:o1]
        return Rows(tokens, token_starts, offsets, offset_starts)

    def __iter__(self):
        for rows in self._blocks:
            for r in range(len(rows)):
                t0, t1 = rows.token_starts[r], rows.token_starts[r + 1]
                yield rows.tokens[t0:t1], rows.offsets[rows.offset_starts[r] : rows.offset_starts[r + 1]]


ArrowDataset = ShardDataset  # the name before the memmap format existed


def open_dataset(path) -> ShardDataset:
    """Open a dataset directory written by `packer build` (Arrow or memmap shards)."""
    return ShardDataset(path)


def verify_dataset(path, *, checksums: bool = True) -> dict:
    """See packer.verify.verify_dataset (kept here, where it used to live)."""
    from packer.verify import verify_dataset as verify

    return verify(path, checksums=checksums)
