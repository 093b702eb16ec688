"""Write stage: the plan and the unit files -> one shard's files (Arrow or memmap), hashed.

A shard is first a `Layout` (row bounds, offsets, doc_ids: plan arithmetic, no tokens);
its tokens are then gathered from the memory-mapped unit files one chunk of rows at a
time and streamed into a temporary file that two threads write and hash while the next
chunk is gathered. Renames come last, so a shard file under its final name is complete;
`_work/shards/shard-XXXXX.json` (its manifest entry) says the shard is done. On a remote
filesystem (packer/io/fs.py) pieces come by ranged reads and the shard is written in place:
there only that .json says the shard is complete.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from packer.build.plan import Plan
from packer.io import atomic, failpoints, fs, ranged
from packer.store.dataset import ROWS_PER_BATCH, Rows
from packer.store.formats import memmap
from packer.store.manifest import shard_files, shard_name


@functools.lru_cache(maxsize=1)
def _load_plan(path: str, stamp: tuple) -> Plan:
    return Plan.load(fs.for_numpy(path))  # once per worker process, not once per shard


def _gather_tokens(plan: Plan, p0: int, p1: int, units_dir, dtype, units: dict) -> np.ndarray:
    """Concatenate the tokens of pieces p0..p1 from the unit token files (memory-mapped).

    One bytes.join over memoryview slices: 1.4 us a piece against 4 us for a loop of
    ndarray slice assignments (7000 pieces of ~700 tokens, a busy 2-core box, 2026-11-29).
    Returns a read-only array over the joined bytes."""
    units_dir = fs.location(units_dir)
    itemsize = np.dtype(dtype).itemsize
    piece_unit = plan.piece_unit[p0:p1]
    begin = plan.piece_start[p0:p1] * itemsize
    end = begin + plan.piece_len[p0:p1] * itemsize
    if isinstance(units_dir, fs.RemotePath):
        return np.frombuffer(ranged.gather(units_dir, piece_unit, begin, end, units), dtype=dtype)
    for u in np.unique(piece_unit).tolist():
        if u not in units:
            array = np.load(units_dir / f"unit-{u:06d}.tokens.npy", mmap_mode="r")
            units[u] = memoryview(array.view(np.ndarray)).cast("B")
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

    def __init__(self, final):
        if THREADED_WRITES and not _THREADS:
            _THREADS.extend(ThreadPoolExecutor(1, thread_name_prefix=f"packer-{n}") for n in ("write", "hash"))
        final = fs.location(final)
        if isinstance(final, fs.RemotePath):  # no rename there: written in place, tmp None
            self._file, self.tmp = final.open_output(), None
        else:
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
    """Write one shard's files atomically (temporary names, then renames; in place on a remote
    filesystem, where the caller's marker says complete); return its entry.

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
    failpoints.hit("write-shard", shard)
    for path, f in files:
        atomic.publish(f.tmp, path)
    return entry


def write_shard(plan_path: str, shard: int, work_dir: str, out_dir: str, dtype: str, fmt: str = "arrow") -> dict:
    """Write one shard (skipped if a finished run of this call left its entry); return its entry."""
    failpoints.hit("shard", shard)
    work, out = fs.location(work_dir), fs.location(out_dir)
    done = work / "shards" / f"shard-{shard:05d}.json"
    if done.exists():
        entry = json.loads(done.read_text(encoding="utf-8"))
        if all((out / f).exists() for f in shard_files(entry)):
            return entry
    plan = _load_plan(plan_path, fs.stamp(plan_path))
    layout, p0 = shard_layout(plan, shard)
    pieces = p0 + np.concatenate([[0], np.cumsum(np.diff(layout.offset_starts) - 1)])  # first piece of each row
    units: dict[int, np.ndarray] = {}

    def tokens_of(r0: int, r1: int) -> np.ndarray:
        return _gather_tokens(plan, int(pieces[r0]), int(pieces[r1]), work / "units", np.dtype(dtype), units)

    entry = {
        **write_rows(layout, tokens_of, out, shard, fmt),
        "sequences": len(layout),
        "tokens": int(layout.token_starts[-1]),
        "documents": len(layout.doc_ids),
    }
    done.parent.mkdir(exist_ok=True)
    atomic.write_json(done, entry)
    return entry
