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

import functools
import hashlib
import json
import os
import threading
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


def _gather_tokens(plan: Plan, p0: int, p1: int, units_dir: Path, dtype) -> np.ndarray:
    """Concatenate the tokens of pieces p0..p1 from the unit token files (memory-mapped).

    A Python loop over pieces: 0.4 us a piece against ~0.1 us for the copy of a 500-token
    piece, and the file write costs more than both (benchmarks/bench_write.py)."""
    out = np.empty(int(plan.piece_len[p0:p1].sum()), dtype=dtype)
    units: dict[int, np.ndarray] = {}
    pos = 0
    for u, start, n in zip(
        plan.piece_unit[p0:p1].tolist(), plan.piece_start[p0:p1].tolist(), plan.piece_len[p0:p1].tolist()
    ):
        src = units.get(u)
        if src is None:
            src = units[u] = np.load(units_dir / f"unit-{u:06d}.tokens.npy", mmap_mode="r")
        out[pos : pos + n] = src[start : start + n]
        pos += n
    return out


def shard_rows(plan: Plan, shard: int, units_dir: Path, dtype) -> tuple[Rows, np.ndarray]:
    """The rows of one shard, and the doc_id of each segment, from the plan and the unit files."""
    s0, s1 = int(plan.shard_starts[shard]), int(plan.shard_starts[shard + 1])
    p0, p1 = int(plan.seq_starts[s0]), int(plan.seq_starts[s1])
    tokens = _gather_tokens(plan, p0, p1, units_dir, dtype)
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
    return Rows(tokens, token_starts, offsets, offset_starts), plan.piece_doc[p0:p1]


def arrow_table(rows: Rows, doc_ids: np.ndarray) -> pa.Table:
    value_type = pa.uint16() if rows.tokens.dtype.itemsize == 2 else pa.uint32()
    seq_starts = rows.offset_starts - np.arange(len(rows.offset_starts))
    return pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(
                pa.array(rows.token_starts.astype(np.int32)), pa.array(rows.tokens, type=value_type)
            ),
            "offsets": pa.ListArray.from_arrays(pa.array(rows.offset_starts.astype(np.int32)), pa.array(rows.offsets)),
            "doc_ids": pa.ListArray.from_arrays(pa.array(seq_starts.astype(np.int32)), pa.array(doc_ids)),
        }
    )


def _write_tmp(final: Path, buffers) -> tuple[Path, str]:
    """Write buffers to a temporary file beside `final`, hashing them in a second thread
    (hashlib and file writes both release the GIL); return (tmp path, sha256)."""
    h = hashlib.sha256()
    hasher = threading.Thread(target=lambda: [h.update(b) for b in buffers])
    hasher.start()
    tmp = atomic.tmp_path(final)
    with open(tmp, "wb") as f:
        for b in buffers:
            f.write(b)
    hasher.join()
    return tmp, h.hexdigest()


def write_rows(rows: Rows, doc_ids: np.ndarray, out_dir: Path, shard: int, fmt: str) -> dict:
    """Write one shard's files atomically (temporary names, then renames); return its entry."""
    final = out_dir / shard_name(shard, fmt)
    entry = {"file": final.name}
    if fmt == "arrow":
        sink = pa.BufferOutputStream()
        table = arrow_table(rows, doc_ids)
        with ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=ROWS_PER_BATCH)
        written = [(final, _write_tmp(final, [sink.getvalue()]))]
        entry["sha256"] = written[0][1][1]
    else:
        tokens = rows.tokens.astype(rows.tokens.dtype.newbyteorder("<"), copy=False)
        index = memmap.index_bytes(rows.token_starts, rows.offset_starts, doc_ids, rows.offsets, tokens.itemsize)
        idx_final = out_dir / memmap.index_name(final.name)
        written = [(final, _write_tmp(final, [memoryview(tokens).cast("B")])), (idx_final, _write_tmp(idx_final, index))]
        entry.update(sha256=written[0][1][1], index_file=idx_final.name, index_sha256=written[1][1][1])
    atomic.kill_point("write-shard", shard)
    for path, (tmp, _) in written:
        os.replace(tmp, path)
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
    rows, doc_ids = shard_rows(plan, shard, work / "units", np.dtype(dtype))
    entry = write_rows(rows, doc_ids, Path(out_dir), shard, fmt)
    entry = {
        **entry,
        "sequences": len(rows),
        "tokens": len(rows.tokens),
        "documents": len(doc_ids),
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
        self._n = starts[-1]

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        n = self._n
        if not -n <= i < n:
            raise IndexError(f"sequence {i} out of range for a dataset of {n}")
        i = int(i) % n
        b = int(self._block_starts.searchsorted(i, side="right")) - 1
        rows = self._blocks[b]
        r = i - int(self._block_starts[b])
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
