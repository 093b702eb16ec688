"""Shard files (Arrow IPC), the manifest, checksums, and a reader for built datasets.

Arrow shard: one row per packed sequence.

    input_ids: list<uint16|uint32>   the row's tokens, unpadded
    offsets:   list<int32>           document boundaries in the row: [0, ..., len(row)]
    doc_ids:   list<int64>           global document index of each segment (audits)

A row [a a a | b b | c] has offsets [0, 3, 5, 6] and doc_ids [17, 4, 230].
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from packer import atomic
from packer.plan import Plan

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATS = "stats.json"
ROWS_PER_BATCH = 4096


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.arrow"


def sha256_file(path, chunk_bytes: int = 8 * 2**20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def _gather_tokens(plan: Plan, p0: int, p1: int, work_dir: Path, dtype) -> np.ndarray:
    """Concatenate the tokens of pieces p0..p1 from the unit token files (memory-mapped)."""
    out = np.empty(int(plan.piece_len[p0:p1].sum()), dtype=dtype)
    units: dict[int, np.ndarray] = {}
    pos = 0
    for u, start, n in zip(
        plan.piece_unit[p0:p1].tolist(), plan.piece_start[p0:p1].tolist(), plan.piece_len[p0:p1].tolist()
    ):
        if u not in units:
            units[u] = np.load(work_dir / f"unit-{u:06d}.tokens.npy", mmap_mode="r")
        out[pos : pos + n] = units[u][start : start + n]
        pos += n
    return out


def shard_table(plan: Plan, shard: int, work_dir: Path, dtype) -> pa.Table:
    """The Arrow table of one shard, built from the plan and the unit files."""
    s0, s1 = int(plan.shard_starts[shard]), int(plan.shard_starts[shard + 1])
    p0, p1 = int(plan.seq_starts[s0]), int(plan.seq_starts[s1])
    tokens = _gather_tokens(plan, p0, p1, work_dir, dtype)
    piece_len = plan.piece_len[p0:p1]
    seq_starts = plan.seq_starts[s0 : s1 + 1] - p0  # pieces of each row, relative to p0
    piece_end = np.cumsum(piece_len)
    row_token_start = np.concatenate([[0], piece_end])[seq_starts]  # token offset of each row
    # offsets of row r: [0, piece ends of its pieces...] relative to the row start.
    n_pieces = np.diff(seq_starts)
    row_of_piece = np.repeat(np.arange(len(n_pieces)), n_pieces)
    ends = piece_end - row_token_start[row_of_piece]
    offset_values = np.zeros(len(piece_len) + len(n_pieces), dtype=np.int32)
    end_slots = np.arange(len(piece_len)) + row_of_piece + 1
    offset_values[end_slots] = ends
    offsets_list_offsets = (seq_starts + np.arange(len(seq_starts))).astype(np.int32)
    value_type = pa.uint16() if np.dtype(dtype) == np.uint16 else pa.uint32()
    return pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(
                pa.array(row_token_start.astype(np.int32)), pa.array(tokens, type=value_type)
            ),
            "offsets": pa.ListArray.from_arrays(pa.array(offsets_list_offsets), pa.array(offset_values)),
            "doc_ids": pa.ListArray.from_arrays(
                pa.array(seq_starts.astype(np.int32)), pa.array(plan.piece_doc[p0:p1])
            ),
        }
    )


def write_shard(plan_path: str, shard: int, work_dir: str, out_dir: str, dtype: str) -> dict:
    """Write one shard atomically; return its manifest entry."""
    plan = Plan.load(plan_path)
    table = shard_table(plan, shard, Path(work_dir), np.dtype(dtype))
    final = Path(out_dir) / shard_name(shard)
    tmp = atomic.tmp_path(final)
    with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=ROWS_PER_BATCH)
    os.replace(tmp, final)
    lengths = plan.piece_len
    s0, s1 = int(plan.shard_starts[shard]), int(plan.shard_starts[shard + 1])
    p0, p1 = int(plan.seq_starts[s0]), int(plan.seq_starts[s1])
    return {
        "file": final.name,
        "sequences": s1 - s0,
        "tokens": int(lengths[p0:p1].sum()),
        "documents": p1 - p0,
        "sha256": sha256_file(final),
    }


def read_manifest(path) -> dict:
    path = Path(path)
    file = path / MANIFEST if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no {MANIFEST} in {path}: not a packer dataset, or its build did not finish "
            "(run the same `packer build` command again to resume it)"
        )
    return json.loads(file.read_text(encoding="utf-8"))


class ArrowDataset:
    """Random access to the sequences of a built dataset: ds[i] -> (tokens, offsets)."""

    def __init__(self, path):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self._tokens, self._token_offsets, self._offsets, self._offset_offsets = [], [], [], []
        starts = [0]
        for entry in self.manifest["shards"]:
            reader = ipc.open_file(pa.memory_map(str(self.path / entry["file"]), "r"))
            for b in range(reader.num_record_batches):
                batch = reader.get_batch(b)
                ids, offs = batch.column("input_ids"), batch.column("offsets")
                self._tokens.append(ids.values.to_numpy(zero_copy_only=True))
                self._token_offsets.append(ids.offsets.to_numpy())
                self._offsets.append(offs.values.to_numpy(zero_copy_only=True))
                self._offset_offsets.append(offs.offsets.to_numpy())
                starts.append(starts[-1] + batch.num_rows)
        self._batch_starts = np.asarray(starts, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._batch_starts[-1])

    def __getitem__(self, i: int):
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sequence {i} out of range for a dataset of {n}")
        i %= n
        b = int(np.searchsorted(self._batch_starts, i, side="right")) - 1
        r = i - int(self._batch_starts[b])
        t0, t1 = self._token_offsets[b][r], self._token_offsets[b][r + 1]
        o0, o1 = self._offset_offsets[b][r], self._offset_offsets[b][r + 1]
        return self._tokens[b][t0:t1], self._offsets[b][o0:o1]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def open_dataset(path) -> ArrowDataset:
    """Open a dataset directory written by `packer build`."""
    return ArrowDataset(path)


def _check_offsets(offsets: np.ndarray, n_tokens: int, where: str, context_length: int):
    if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != n_tokens:
        raise ValueError(f"{where}: offsets must start at 0 and end at the row length {n_tokens}")
    if np.any(np.diff(offsets) <= 0):
        raise ValueError(f"{where}: offsets must increase strictly")
    if n_tokens > context_length:
        raise ValueError(f"{where}: row of {n_tokens} tokens exceeds the context length {context_length}")


def verify_dataset(path, *, checksums: bool = True) -> dict:
    """Check a dataset against its manifest; raise ValueError naming the first problem."""
    path = Path(path)
    manifest = read_manifest(path)
    context_length = manifest["config"]["context_length"]
    totals = {"sequences": 0, "tokens": 0, "documents": 0}
    for entry in manifest["shards"]:
        file = path / entry["file"]
        if not file.is_file():
            raise ValueError(f"shard missing: {file}")
        if checksums and sha256_file(file) != entry["sha256"]:
            raise ValueError(f"{file}: sha256 does not match the manifest (the file changed or is corrupt)")
        counts = {"sequences": 0, "tokens": 0, "documents": 0}
        reader = ipc.open_file(pa.memory_map(str(file), "r"))
        for b in range(reader.num_record_batches):
            batch = reader.get_batch(b)
            ids, offs = batch.column("input_ids"), batch.column("offsets")
            id_offsets = ids.offsets.to_numpy()
            off_values, off_offsets = offs.values.to_numpy(), offs.offsets.to_numpy()
            for r in range(batch.num_rows):
                row = off_values[off_offsets[r] : off_offsets[r + 1]]
                n = int(id_offsets[r + 1] - id_offsets[r])
                _check_offsets(row, n, f"{file} row {counts['sequences'] + r}", context_length)
                counts["documents"] += len(row) - 1
            counts["sequences"] += batch.num_rows
            counts["tokens"] += int(id_offsets[-1] - id_offsets[0])
        for key, value in counts.items():
            if value != entry[key]:
                raise ValueError(f"{file}: {value} {key}, manifest says {entry[key]}")
            totals[key] += value
    if totals["sequences"] != manifest["totals"]["sequences"]:
        raise ValueError(f"{totals['sequences']} sequences in shards, manifest totals say {manifest['totals']['sequences']}")
    if totals["tokens"] != manifest["totals"]["tokens_out"]:
        raise ValueError(f"{totals['tokens']} tokens in shards, manifest totals say {manifest['totals']['tokens_out']}")
    return totals
