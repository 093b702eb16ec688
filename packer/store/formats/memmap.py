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
from packer.store.formats import sidecars
from packer.store.rows import Layout, Rows, little_endian, row_chunks, split_chunk

FILES = (("file", "sha256", ".bin"), ("index_file", "index_sha256", ".idx"))
EXTRA_FILES = sidecars.FILES  # loss_mask, source_ids: packer/store/formats/sidecars.py
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
    size = fs.size(path)
    if len(head) < HEADER.size:
        raise ValueError(f"{fs.redact(path)}: {len(head)} bytes, shorter than the {HEADER.size}-byte index header (truncated?)")
    magic, version, itemsize, n_rows, n_segments = HEADER.unpack(head)
    if magic != MAGIC:
        raise ValueError(f"{fs.redact(path)}: not a packer index file (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ValueError(f"{fs.redact(path)}: index version {version}, this packer reads version {VERSION}; upgrade packer")
    if itemsize not in TOKEN_DTYPES:
        raise ValueError(f"{fs.redact(path)}: token itemsize {itemsize}, expected 2 or 4")
    want = HEADER.size + 8 * (2 * (n_rows + 1) + n_segments) + 4 * (n_segments + n_rows)
    if size != want:
        raise ValueError(f"{fs.redact(path)}: {size} bytes, its header implies {want} (truncated or corrupt)")
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


def write_sidecar_chunks(layout: Layout, tokens_of, bin_file, extra_sinks: dict):
    """The .bin (and the loss mask sidecar) chunk by chunk; then the source_ids sidecar. Returns
    the token itemsize (memmap and megatron share this)."""
    for r0, r1 in row_chunks(len(layout)):
        tokens, mask = split_chunk(tokens_of(r0, r1))
        bin_file.write(little_endian(tokens))
        if "loss_mask" in extra_sinks:
            extra_sinks["loss_mask"].write(memoryview(np.ascontiguousarray(mask, dtype=np.uint8)).cast("B"))
    if "source_ids" in extra_sinks:
        sidecars.write_source_ids(extra_sinks["source_ids"], layout.source_ids)
    return tokens.dtype.itemsize


def write(layout: Layout, tokens_of, sinks, extras=()):
    bin_file, idx_file, *rest = sinks
    itemsize = write_sidecar_chunks(layout, tokens_of, bin_file, dict(zip(extras, rest)))
    for buf in index_bytes(layout.token_starts, layout.offset_starts, layout.doc_ids, layout.offsets, itemsize):
        idx_file.write(buf)


def blocks(paths, extras=()):
    """The whole shard as one block: (Rows, doc_ids) over the memory maps (and its sidecars')."""
    tokens, token_starts, offsets, offset_starts, doc_ids = open_shard(paths[0], paths[1])
    more = sidecars.read(dict(zip(extras, paths[2:])), len(tokens), len(doc_ids))
    yield Rows(tokens, token_starts, offsets, offset_starts, **more), doc_ids
