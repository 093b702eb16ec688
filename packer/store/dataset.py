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

Memmap shard (`shard-00000.bin` + `.idx`): see packer/store/formats/memmap.py for the byte layout.
Writing is packer/build/writer.py; checking, packer/store/verify.py. A dataset at a remote URI
(packer/io/fs.py) is read into memory when opened: Arrow record batches by ranged reads,
memmap shards whole (nothing remote can be memory-mapped).
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

import numpy as np
import pyarrow.ipc as ipc

from packer.io import fs
from packer.store.formats import memmap
from packer.store.manifest import read_manifest

ROWS_PER_BATCH = 4096


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


def _arrow_blocks(file):
    """One (Rows, doc_ids) per record batch, zero-copy over a memory map (read, if remote)."""
    reader = ipc.open_file(fs.open_arrow(file))
    for b in range(reader.num_record_batches):
        batch = reader.get_batch(b)
        ids, offs = batch.column("input_ids"), batch.column("offsets")
        rows = Rows(
            ids.values.to_numpy(zero_copy_only=True),
            ids.offsets.to_numpy(),
            offs.values.to_numpy(zero_copy_only=True),
            offs.offsets.to_numpy(),
        )
        yield rows, batch.column("doc_ids").flatten().to_numpy(zero_copy_only=True)


def shard_blocks(directory, entry: dict, fmt: str):
    """Yield (Rows, doc_ids) for the blocks of one shard: its record batches, or the whole memmap."""
    file = directory / entry["file"]
    if fmt == "arrow":
        yield from _arrow_blocks(file)
    else:
        tokens, token_starts, offsets, offset_starts, doc_ids = memmap.open_shard(file, directory / entry["index_file"])
        yield Rows(tokens, token_starts, offsets, offset_starts), doc_ids


class ShardDataset:
    """Random access to the sequences of a built dataset (either format).

    ds[i] -> (tokens, offsets): read-only numpy views into memory-mapped files; O(1) and
    touching only that row's pages. ds.get_many(indices) -> Rows: many rows at once,
    copied into one CSR batch. Iteration yields ds[0], ds[1], ... in stored order."""

    def __init__(self, path):
        self.path = fs.location(path)  # a Path, or a RemotePath for a URI
        self.manifest = read_manifest(self.path)
        self.format = self.manifest["config"].get("format", "arrow")
        self._blocks: list[Rows] = []
        self._doc_ids: list[np.ndarray] = []
        starts = [0]
        for entry in self.manifest["shards"]:
            for rows, doc_ids in shard_blocks(self.path, entry, self.format):
                self._blocks.append(rows)
                self._doc_ids.append(doc_ids)
                starts.append(starts[-1] + len(rows))
        self._block_starts = np.asarray(starts, dtype=np.int64)
        self._starts_list = starts  # bisect on a list beats np.searchsorted for one scalar
        self._n = starts[-1]

    def __len__(self) -> int:
        return self._n

    def __reduce__(self):
        return type(self), (self.path,)  # pickles as its path: reopened, never copied

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

    def views(self, indices) -> tuple[list, list]:
        """Rows `indices` (any order, repeats allowed) as two lists of read-only views,
        (tokens of each row, offsets of each row): what `ds[i]` gives, for many rows in one
        vectorized lookup. Nothing is copied."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self._n
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"indices must be in [-{n}, {n}) for a dataset of {n} sequences")
        idx = idx % n if n else idx
        if len(self._blocks) == 1:  # a memmap shard, or one record batch: no block lookup
            rows = self._blocks[0]
            t, o, ts, ost = rows.tokens, rows.offsets, rows.token_starts, rows.offset_starts
            t0, t1, o0, o1 = ts[idx].tolist(), ts[idx + 1].tolist(), ost[idx].tolist(), ost[idx + 1].tolist()
            return [t[a:b] for a, b in zip(t0, t1)], [o[a:b] for a, b in zip(o0, o1)]
        block = self._block_starts.searchsorted(idx, side="right") - 1
        local = (idx - self._block_starts[block]).tolist()
        blocks = self._blocks
        tokens, offsets = [], []
        for b, r in zip(block.tolist(), local):  # plain ints: numpy scalars per row cost more
            rows = blocks[b]
            tokens.append(rows.tokens[rows.token_starts[r] : rows.token_starts[r + 1]])
            offsets.append(rows.offsets[rows.offset_starts[r] : rows.offset_starts[r + 1]])
        return tokens, offsets

    def get_many(self, indices) -> Rows:
        """Rows `indices` (any order, repeats allowed) as one CSR batch: `Rows.row(k)` equals
        `ds[indices[k]]`. Tokens keep the stored dtype, offsets are int32."""
        tokens, offsets = self.views(indices)
        token_starts = np.zeros(len(tokens) + 1, np.int64)
        offset_starts = np.zeros(len(offsets) + 1, np.int64)
        np.cumsum([len(t) for t in tokens], out=token_starts[1:])
        np.cumsum([len(o) for o in offsets], out=offset_starts[1:])
        dtype = self._blocks[0].tokens.dtype if self._blocks else np.uint16
        joined = np.concatenate(tokens).astype(dtype, copy=False) if tokens else np.zeros(0, dtype)
        return Rows(joined, token_starts, np.concatenate(offsets) if offsets else np.zeros(0, np.int32), offset_starts)

    def doc_ids(self) -> np.ndarray:
        """int64 global document index of every stored segment, rows in stored order (reads
        every shard's doc_ids; a document split over several rows appears once per piece)."""
        return np.concatenate(self._doc_ids).astype(np.int64) if self._doc_ids else np.zeros(0, np.int64)

    def __iter__(self):
        for rows in self._blocks:
            for r in range(len(rows)):
                t0, t1 = rows.token_starts[r], rows.token_starts[r + 1]
                yield rows.tokens[t0:t1], rows.offsets[rows.offset_starts[r] : rows.offset_starts[r + 1]]


def read_rows(ds, indices) -> tuple[list, list]:
    """Rows `indices` of an opened dataset as (token views, offset views): its `views` where it
    has one (one vectorized lookup), else `ds[i]` row by row (any reader with __getitem__)."""
    if hasattr(ds, "views"):
        return ds.views(indices)
    pairs = [ds[i] for i in np.asarray(indices).tolist()]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def open_dataset(path) -> ShardDataset:
    """Open a dataset directory written by `packer build` (Arrow or memmap shards), or its URI."""
    return ShardDataset(path)
