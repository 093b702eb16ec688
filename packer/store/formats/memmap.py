"""Memmap shards: a flat token file plus an index, both plain little-endian arrays.

    shard-00000.bin   the tokens of all rows back to back, no header:
                      uint16 (token itemsize 2) or uint32 (itemsize 4), little-endian

    shard-00000.idx   byte 0   8 bytes   magic b"PACKIDX1"
                      byte 8   uint32    index format version (1)
                      byte 12  uint32    token itemsize in bytes (2 or 4)
                      byte 16  uint64    S, number of rows (packed sequences)
                      byte 24  uint64    D, number of segments (documents, summed over rows)
                      byte 32  int64[S+1]  token_starts:  row s = bin[token_starts[s] : token_starts[s+1]]
                      then     int64[S+1]  offset_starts: row s's offsets = offsets[offset_starts[s] : offset_starts[s+1]]
                      then     int64[D]    doc_ids, one per segment, rows in order
                      then     int32[D+S]  offsets, each row's boundaries from 0 to its length

All integers little-endian; every section starts 8-byte aligned. Two rows [a a a | b b]
and [c c c c] give token_starts [0, 5, 9], offset_starts [0, 3, 5], offsets [0, 3, 5, 0, 4].
The index sections are the CSR arrays of packer/store/rows.py as they are, so reading a shard
maps both files and slices them: one block per shard, nothing copied.
"""

from __future__ import annotations

import struct

import numpy as np

from packer.io import fs
from packer.store.rows import Layout, Rows, little_endian, row_chunks

FILES = (("file", "sha256", ".bin"), ("index_file", "index_sha256", ".idx"))
MAGIC = b"PACKIDX1"
VERSION = 1
HEADER = struct.Struct("<8sIIQQ")  # 32 bytes
TOKEN_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def index_bytes(token_starts, offset_starts, doc_ids, offsets, itemsize: int) -> list[bytes | memoryview]:
    """The .idx file as a list of buffers (header first), ready to write or hash."""
    n_rows, n_segments = len(token_starts) - 1, len(doc_ids)
    assert len(offsets) == n_segments + n_rows and len(offset_starts) == n_rows + 1
    header = HEADER.pack(MAGIC, VERSION, itemsize, n_rows, n_segments)
    parts = [
        np.ascontiguousarray(token_starts, dtype="<i8"),
        np.ascontiguousarray(offset_starts, dtype="<i8"),
        np.ascontiguousarray(doc_ids, dtype="<i8"),
        np.ascontiguousarray(offsets, dtype="<i4"),
    ]
    return [header] + [memoryview(p).cast("B") for p in parts]


def read_header(path) -> tuple[int, int, int]:
    """(token itemsize, S rows, D segments) of an .idx file; ValueError if it is not one."""
    path = fs.location(path)
    with path.open("rb") as f:
        head = f.read(HEADER.size)
    return parse_header(head, fs.size(path), fs.redact(path))


def parse_header(head: bytes, size: int, where: str) -> tuple[int, int, int]:
    """read_header of an index file whose first bytes are `head` and whose size is `size`."""
    if len(head) < HEADER.size:
        raise ValueError(f"{where}: {len(head)} bytes, shorter than the {HEADER.size}-byte index header (truncated?)")
    magic, version, itemsize, n_rows, n_segments = HEADER.unpack(head[: HEADER.size])
    if magic != MAGIC:
        raise ValueError(f"{where}: not a packer index file (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ValueError(f"{where}: index version {version}, this packer reads version {VERSION}; upgrade packer")
    if itemsize not in TOKEN_DTYPES:
        raise ValueError(f"{where}: token itemsize {itemsize}, expected 2 or 4")
    want = HEADER.size + 8 * (2 * (n_rows + 1) + n_segments) + 4 * (n_segments + n_rows)
    if size != want:
        raise ValueError(f"{where}: {size} bytes, its header implies {want} (truncated or corrupt)")
    return itemsize, n_rows, n_segments


def open_shard(bin_path, idx_path):
    """Memory-map one shard: (tokens, token_starts, offsets, offset_starts, doc_ids), no data read.
    A remote shard (packer/io/fs.py) cannot be mapped: both files are read into memory."""
    bin_path, idx_path = fs.location(bin_path), fs.location(idx_path)
    itemsize, n_rows, n_segments = read_header(idx_path)
    dtype = TOKEN_DTYPES[itemsize]
    raw, data = fs.map_bytes(idx_path), fs.map_bytes(bin_path)
    pos = HEADER.size

    def section(dtype, count):
        nonlocal pos
        nbytes = count * np.dtype(dtype).itemsize
        arr = raw[pos : pos + nbytes].view(dtype)
        pos += nbytes
        return arr

    token_starts = section("<i8", n_rows + 1)
    offset_starts = section("<i8", n_rows + 1)
    doc_ids = section("<i8", n_segments)
    offsets = section("<i4", n_segments + n_rows)
    n_tokens = int(token_starts[-1])
    if len(data) != n_tokens * itemsize:
        raise ValueError(f"{fs.redact(bin_path)}: {len(data)} bytes, its index says {n_tokens} tokens of {itemsize} bytes "
                         "(truncated?)")
    return data.view(dtype), token_starts, offsets, offset_starts, doc_ids


def write(layout: Layout, tokens_of, sinks):
    bin_file, idx_file = sinks
    for r0, r1 in row_chunks(len(layout)):
        tokens = tokens_of(r0, r1)
        bin_file.write(little_endian(tokens))
    for buf in index_bytes(layout.token_starts, layout.offset_starts, layout.doc_ids, layout.offsets, tokens.dtype.itemsize):
        idx_file.write(buf)


def blocks(paths):
    """The whole shard as one block: (Rows, doc_ids) over the two memory maps."""
    tokens, token_starts, offsets, offset_starts, doc_ids = open_shard(*paths)
    yield Rows(tokens, token_starts, offsets, offset_starts), doc_ids


# -- streaming reads (packer/store/stream.py): the index whole, then blocks of rows by ranged reads --


def block_bounds(token_starts: np.ndarray, itemsize: int, block_bytes: int) -> np.ndarray:
    """Row bounds [0, r1, r2, ..., S] of blocks of consecutive rows: a new block starts at the first
    row whose tokens start in the next `block_bytes` window of the .bin, so a block holds at most
    block_bytes + one row of token bytes. Rows of 8 KiB in 1 MiB windows: 128 rows a block."""
    n_rows = len(token_starts) - 1
    window = np.asarray(token_starts[:-1], dtype=np.int64) * itemsize // block_bytes
    cuts = np.flatnonzero(np.diff(window)) + 1
    return np.concatenate([[0], cuts, [n_rows]]).astype(np.int64) if n_rows else np.zeros(1, np.int64)


def csr_block(csr, bounds, k: int, tokens) -> tuple[Rows, np.ndarray]:
    """Block k (rows bounds[k]..bounds[k+1]) of a shard whose index is `csr` = (dtype,
    token_starts, offsets, offset_starts, doc_ids), given that block's token bytes: offsets stay
    views of the index, token_starts are shifted to start at 0."""
    dtype, token_starts, offsets, offset_starts, doc_ids = csr
    r0, r1 = int(bounds[k]), int(bounds[k + 1])
    o0, o1 = int(offset_starts[r0]), int(offset_starts[r1])
    rows = Rows(np.frombuffer(tokens, dtype) if len(tokens) else np.zeros(0, dtype),
                token_starts[r0 : r1 + 1] - token_starts[r0], offsets, offset_starts[r0 : r1 + 1])
    return rows, doc_ids[o0 - r0 : o1 - r1]


def csr_plan(csr, block_bytes: int):
    """(row bounds, byte ranges of each block in file 0 (the .bin), counts) of a CSR index."""
    dtype, token_starts = csr[0], csr[1]
    bounds = block_bounds(token_starts, dtype.itemsize, block_bytes)
    starts = (np.asarray(token_starts, dtype=np.int64)[bounds] * dtype.itemsize).tolist()
    ranges = [((0, a, b),) for a, b in zip(starts[:-1], starts[1:])]
    counts = {"sequences": len(token_starts) - 1, "tokens": int(token_starts[-1] - token_starts[0]),
              "documents": len(csr[4])}
    return bounds, ranges, counts


def stream_index(read, size, paths, block_bytes: int):
    """What a streaming reader needs of one shard before any token: (row bounds of its blocks,
    each block's byte ranges ((file index, start, stop), ...), state for `stream_block`, counts).
    `read(path, start, stop)` and `size(path)` reach the files (retried, cached). The .idx is read
    whole (O(rows + segments) bytes); the .bin only by blocks."""
    bin_path, idx_path = paths
    where = fs.redact(idx_path)
    idx_size = size(idx_path)
    raw = np.frombuffer(read(idx_path, 0, idx_size), np.uint8) if idx_size else np.zeros(0, np.uint8)
    itemsize, n_rows, n_segments = parse_header(raw[: HEADER.size].tobytes(), idx_size, where)
    cuts = np.cumsum([HEADER.size, 8 * (n_rows + 1), 8 * (n_rows + 1), 8 * n_segments, 4 * (n_segments + n_rows)])
    token_starts, offset_starts, doc_ids = (raw[a:b].view("<i8") for a, b in zip(cuts[:3], cuts[1:4]))
    offsets = raw[cuts[3] : cuts[4]].view("<i4")
    bin_size = size(bin_path)
    if bin_size != int(token_starts[-1]) * itemsize:
        raise ValueError(f"{fs.redact(bin_path)}: {bin_size} bytes, its index says {int(token_starts[-1])} tokens of "
                         f"{itemsize} bytes (truncated?)")
    csr = (TOKEN_DTYPES[itemsize], token_starts, offsets, offset_starts, doc_ids)
    bounds, ranges, counts = csr_plan(csr, block_bytes)
    return bounds, ranges, csr, counts


def stream_block(state, bounds, k: int, buffers) -> tuple[Rows, np.ndarray]:
    """Block k of a streamed shard from the bytes of its ranges (stream_index's order)."""
    return csr_block(state, bounds, k, buffers[0])
