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
from typing import NamedTuple

import numpy as np

from packer.io import fs
from packer.store import checksums
from packer.store.formats import sidecars
from packer.store.rows import Layout, Rows, little_endian, row_chunks, split_chunk

FILES = (("file", "sha256", ".bin"), ("index_file", "index_sha256", ".idx"))
EXTRA_FILES = sidecars.FILES  # loss_mask, source_ids, role_ids: packer/store/formats/sidecars.py
DERIVED_FILES: tuple[str, ...] = ()  # nothing beside the shards
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


def write_sidecar_chunks(layout: Layout, tokens_of, bin_file, extra_sinks: dict):
    """The .bin (and the loss mask and role sidecars) chunk by chunk, all cut at the shard's read
    blocks (checksums.BLOCK_BYTES of .bin); then the source_ids sidecar. Returns (the token itemsize,
    the blocks' row bounds) (memmap and megatron share this)."""
    bounds = None
    for r0, r1 in row_chunks(len(layout)):
        tokens, mask, roles = split_chunk(tokens_of(r0, r1))
        if bounds is None:  # the token size is known now: cut the files that hold rows at the blocks
            bounds = block_bounds(layout.token_starts, tokens.dtype.itemsize, checksums.BLOCK_BYTES)
            starts = np.asarray(layout.token_starts, np.int64)[bounds[1:]]
            bin_file.first = 0
            bin_file.cut_at(starts * tokens.dtype.itemsize)
            for name in ("loss_mask", "role_ids"):
                if name in extra_sinks:
                    extra_sinks[name].first = 0
                    extra_sinks[name].cut_at(starts)
        bin_file.write(little_endian(tokens))
        for name, values in (("loss_mask", mask), ("role_ids", roles)):
            if name in extra_sinks:
                extra_sinks[name].write(memoryview(np.ascontiguousarray(values, dtype=np.uint8)).cast("B"))
    if "source_ids" in extra_sinks:
        sidecars.write_source_ids(extra_sinks["source_ids"], layout.source_ids)
    return tokens.dtype.itemsize, bounds


def derived_files(shards: list[dict]) -> dict[str, bytes]:
    return {}


def write(layout: Layout, tokens_of, sinks, extras=()):
    bin_file, idx_file, *rest = sinks
    itemsize, bounds = write_sidecar_chunks(layout, tokens_of, bin_file, dict(zip(extras, rest)))
    for buf in index_bytes(layout.token_starts, layout.offset_starts, layout.doc_ids, layout.offsets, itemsize):
        idx_file.write(buf)
    return bounds


def blocks(paths, extras=(), sums=None):
    """The whole shard as one block: (Rows, doc_ids) over the memory maps (and its sidecars')."""
    tokens, token_starts, offsets, offset_starts, doc_ids = open_shard(paths[0], paths[1])
    more = sidecars.read(dict(zip(extras, paths[2:])), len(tokens), len(doc_ids))
    yield Rows(tokens, token_starts, offsets, offset_starts, **more), doc_ids


# -- streaming reads (packer/store/stream.py): the index whole, then blocks of rows by ranged reads --


class StreamShard(NamedTuple):
    """A memmap or Megatron shard's index as a streaming reader holds it (no token): the CSR
    arrays, the source ids (or None), and which of the shard's files hold the loss mask and the
    role ids (or None)."""

    dtype: np.dtype
    token_starts: np.ndarray
    offsets: np.ndarray
    offset_starts: np.ndarray
    doc_ids: np.ndarray
    source_ids: np.ndarray | None
    mask_file: int | None
    role_file: int | None = None


def block_bounds(token_starts: np.ndarray, itemsize: int, block_bytes: int) -> np.ndarray:
    """Row bounds [0, r1, r2, ..., S] of blocks of consecutive rows: a new block starts at the first
    row whose tokens start in the next `block_bytes` window of the .bin, so a block holds at most
    block_bytes + one row of token bytes. Rows of 8 KiB in 1 MiB windows: 128 rows a block."""
    n_rows = len(token_starts) - 1
    window = np.asarray(token_starts[:-1], dtype=np.int64) * itemsize // block_bytes
    cuts = np.flatnonzero(np.diff(window)) + 1
    return np.concatenate([[0], cuts, [n_rows]]).astype(np.int64) if n_rows else np.zeros(1, np.int64)


def stream_ranges(shard: StreamShard, block_bytes: int, sums=None):
    """(row bounds, the byte ranges ((file, start, stop), ...) of each block, counts) of a shard:
    a block's tokens in the .bin (file 0), its mask bytes (one per token) in the mask file, then
    its role bytes (one per token) in the role file. With the shard's checksums, a block is a run of
    its checksummed blocks (one, or those starting in one `block_bytes` window of .bin), so every
    read is checked whole."""
    itemsize = shard.dtype.itemsize
    starts = np.asarray(shard.token_starts, dtype=np.int64)
    per_token = [f for f in (shard.mask_file, shard.role_file) if f is not None]
    if sums is None:
        bounds = block_bounds(starts, itemsize, block_bytes)
    else:
        bounds = _checked_bounds(sums, starts, itemsize, per_token)
        if len(bounds) > 1:
            window = starts[bounds[:-1]] * itemsize // block_bytes
            bounds = bounds[np.concatenate([[0], np.flatnonzero(np.diff(window)) + 1, [len(bounds) - 1]])]
    t = starts[bounds].tolist()
    ranges = [((0, a * itemsize, b * itemsize),) + tuple((f, a, b) for f in per_token) for a, b in zip(t[:-1], t[1:])]
    counts = {"sequences": len(shard.token_starts) - 1, "documents": len(shard.doc_ids),
              "tokens": int(shard.token_starts[-1] - shard.token_starts[0])}
    return bounds, ranges, counts


def _checked_bounds(sums, token_starts: np.ndarray, itemsize: int, per_token: list[int]) -> np.ndarray:
    """The checksummed blocks' row bounds, once their byte ranges are seen to lie on the index's rows."""
    rows = sums.rows
    if rows[-1] != len(token_starts) - 1:
        raise ValueError(f"the checksums file has {int(rows[-1])} rows, the index {len(token_starts) - 1} (corrupt; "
                         "rebuild the dataset)")
    for f, scale in ((0, itemsize), *((f, 1) for f in per_token)):
        file_sums = sums.files[f]
        cuts = file_sums.cuts[file_sums.first : file_sums.first + len(rows)] if file_sums.first >= 0 else None
        if cuts is None or len(cuts) != len(rows) or not np.array_equal(cuts, token_starts[rows] * scale):
            raise ValueError("the checksums file's blocks do not lie on the index's rows (corrupt; rebuild the dataset)")
    return np.asarray(rows, np.int64)


def stream_rows(shard: StreamShard, bounds, k: int, buffers) -> tuple[Rows, np.ndarray]:
    """Block k (rows bounds[k]..bounds[k+1]) from the bytes of its ranges: tokens (and mask) from
    `buffers`, offsets as views of the index, token_starts shifted to start at 0."""
    r0, r1 = int(bounds[k]), int(bounds[k + 1])
    o0, o1 = int(shard.offset_starts[r0]), int(shard.offset_starts[r1])
    tokens = np.frombuffer(buffers[0], shard.dtype) if len(buffers[0]) else np.zeros(0, shard.dtype)
    per_token, at = {}, 1  # the uint8 sidecars' buffers follow the tokens', in stream_ranges' order
    for name, f in (("loss_mask", shard.mask_file), ("role_ids", shard.role_file)):
        if f is not None:
            per_token[name] = np.frombuffer(buffers[at], np.uint8) if len(buffers[at]) else np.zeros(0, np.uint8)
            at += 1
    sources = shard.source_ids[o0 - r0 : o1 - r1] if shard.source_ids is not None else None
    rows = Rows(tokens, shard.token_starts[r0 : r1 + 1] - shard.token_starts[r0], shard.offsets,
                shard.offset_starts[r0 : r1 + 1], source_ids=sources, **per_token)
    return rows, shard.doc_ids[o0 - r0 : o1 - r1]


def stream_sidecars(read, size, paths, extras, n_tokens: int, n_segments: int):
    """(source ids, read whole; the index of the loss mask file in `paths`; that of the role ids
    file) of a shard's sidecars (FILES first, then the EXTRA_FILES of `extras` in order), their
    sizes checked."""
    named = dict(zip(extras, range(len(paths) - len(extras), len(paths))))
    for name, what in sidecars.PER_TOKEN_WHAT.items():
        if name in named and (n := size(paths[named[name]])) != n_tokens:
            raise ValueError(f"{fs.redact(paths[named[name]])}: {n} bytes, one {what} per token of the "
                             f"shard's {n_tokens} (truncated or corrupt)")
    sources = None
    if "source_ids" in named:
        path = paths[named["source_ids"]]
        sources = sidecars.read_source_ids(path, n_segments, raw=read(path, 0, size(path)))
    return sources, named.get("loss_mask"), named.get("role_ids")


def stream_index(read, size, paths, block_bytes: int, extras=(), sums=None):
    """What a streaming reader needs of one shard before any token: (row bounds of its blocks,
    each block's byte ranges, a StreamShard for `stream_block`, counts, the optional fields). `read(path, start, stop)`
    and `size(path)` reach the files (retried, cached). The .idx is read whole (O(rows + segments)
    bytes), and the source ids; the .bin and the mask only by blocks."""
    bin_path, idx_path = paths[0], paths[1]
    where = fs.redact(idx_path)
    idx_size = size(idx_path)
    raw = np.frombuffer(read(idx_path, 0, idx_size), np.uint8) if idx_size else np.zeros(0, np.uint8)
    itemsize, n_rows, n_segments = parse_header(raw[: HEADER.size].tobytes(), idx_size, where)
    cuts = np.cumsum([HEADER.size, 8 * (n_rows + 1), 8 * (n_rows + 1), 8 * n_segments, 4 * (n_segments + n_rows)])
    token_starts, offset_starts, doc_ids = (raw[a:b].view("<i8") for a, b in zip(cuts[:3], cuts[1:4]))
    offsets = raw[cuts[3] : cuts[4]].view("<i4")
    n_tokens = int(token_starts[-1])
    if (n := size(bin_path)) != n_tokens * itemsize:
        raise ValueError(f"{fs.redact(bin_path)}: {n} bytes, its index says {n_tokens} tokens of {itemsize} bytes "
                         "(truncated?)")
    sources, mask_file, role_file = stream_sidecars(read, size, paths, extras, n_tokens, n_segments)
    shard = StreamShard(TOKEN_DTYPES[itemsize], token_starts, offsets, offset_starts, doc_ids, sources, mask_file,
                        role_file)
    bounds, ranges, counts = stream_ranges(shard, block_bytes, sums)
    return bounds, ranges, shard, counts, tuple(extras)


def stream_block(shard: StreamShard, bounds, k: int, buffers) -> tuple[Rows, np.ndarray]:
    """Block k of a streamed shard from the bytes of its ranges (stream_index's order)."""
    return stream_rows(shard, bounds, k, buffers)
