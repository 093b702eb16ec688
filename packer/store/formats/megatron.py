"""Megatron shards: Megatron-Core's indexed dataset (`.bin` + `MMIDIDX` `.idx`), plus packer's doc_ids.

Megatron's stock GPTDataset re-packs these files: it shuffles the stored pieces and re-chunks them
into sequence_length windows, so attention, positions and loss cross documents (a split document's
piece, which ends in no EOS, is glued to another) and loss masks are not read. Train on a packer
build with packer.megatron.PackedGPTDataset (packer/train/megatron.py), which yields each row as
it is stored; IndexedDataset reads these files exactly (below).

One Megatron *document* per packed sequence (row), one Megatron *sequence* per document piece
(segment) of that row, so Megatron-LM, NeMo and datatrove readers open a shard as is
(`IndexedDataset("out/shard-00000")`), and a row's sequence lengths are its segment lengths.

    shard-00000.bin         the tokens of all rows back to back, no header (the memmap .bin, byte
                            for byte): uint16, or int32 for a vocabulary past uint16 (Megatron has
                            no uint32; token ids are below 2**31, so the bytes equal packer's uint32)

    shard-00000.idx         byte 0   9 bytes   magic b"MMIDIDX\\x00\\x00"
                            byte 9   uint64    version (1)
                            byte 17  uint8     Megatron dtype code: 8 uint16, 4 int32
                            byte 18  uint64    N, sequence count: segments, summed over rows
                            byte 26  uint64    S + 1, document count: rows + 1
                            byte 34  int32[N]    sequence_lengths: tokens of each segment
                            then     int64[N]    sequence_pointers: byte offset of each segment in .bin
                            then     int64[S+1]  document_indices: row s = segments
                                                 document_indices[s] : document_indices[s+1]

    shard-00000.docids.npy  int64[N], a NumPy .npy file (format 1.0, '<i8', shape (N,)): the global
                            document index of each segment. Packer's own sidecar (Megatron has no
                            place for it and ignores the file); open_dataset, verify and stats read it.

All integers little-endian; no alignment (Megatron's sections start at byte 34). Two rows
[a a a | b b] and [c c c c] in uint16 give sequence_lengths [3, 2, 4], sequence_pointers
[0, 6, 10], document_indices [0, 2, 3]; packer reads back token_starts [0, 5, 9] and offsets
[0, 3, 5, 0, 4]. The manifest entry adds `doc_ids_file` and `doc_ids_sha256` to the memmap keys.
"""

from __future__ import annotations

import struct

import numpy as np

from packer.io import fs
from packer.store.formats import memmap, sidecars
from packer.store.formats.memmap import write_sidecar_chunks
from packer.store.rows import Layout, Rows

FILES = (
    ("file", "sha256", ".bin"),
    ("index_file", "index_sha256", ".idx"),
    ("doc_ids_file", "doc_ids_sha256", ".docids.npy"),
)
EXTRA_FILES = sidecars.FILES  # loss_mask, source_ids, role_ids: packer/store/formats/sidecars.py (Megatron ignores them)
NOTICE = ("megatron: Megatron's stock GPTDataset re-packs these shards (shuffled, re-chunked: attention, positions "
          "and loss cross documents; loss masks unread); train with packer.megatron.PackedGPTDataset, one stored row "
          "per sample (docs/format.md)")


def build_notes(manifest: dict) -> list[str]:
    """Said at the end of every megatron build: what stock GPTDataset does with these files."""
    return [NOTICE]


DERIVED_FILES = memmap.DERIVED_FILES  # nothing beside the shards
derived_files = memmap.derived_files
MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # 34 bytes
DTYPE_CODES = {2: 8, 4: 4}  # token itemsize -> Megatron DType code (uint16, int32)
TOKEN_DTYPES = {8: np.dtype("<u2"), 4: np.dtype("<u4")}  # code -> what packer reads (int32 ids are >= 0)


def _segment_lengths(offsets: np.ndarray, offset_starts: np.ndarray) -> np.ndarray:
    """Each segment's length: the steps of `offsets`, less the step from one row's end to the next 0."""
    steps = np.diff(offsets.astype(np.int64))
    keep = np.ones(len(steps), bool)
    keep[offset_starts[1:-1] - 1] = False
    return steps[keep]


def index_bytes(layout: Layout, itemsize: int) -> list[bytes | memoryview]:
    """The .idx file as a list of buffers (header first), ready to write or hash."""
    lengths = _segment_lengths(layout.offsets, layout.offset_starts)
    pointers = (np.cumsum(lengths) - lengths) * itemsize  # segments lie back to back in .bin
    document_indices = layout.offset_starts - np.arange(len(layout.offset_starts))
    header = HEADER.pack(MAGIC, VERSION, DTYPE_CODES[itemsize], len(lengths), len(document_indices))
    parts = [
        np.ascontiguousarray(lengths, dtype="<i4"),
        np.ascontiguousarray(pointers, dtype="<i8"),
        np.ascontiguousarray(document_indices, dtype="<i8"),
    ]
    return [header] + [memoryview(p).cast("B") for p in parts]


def write(layout: Layout, tokens_of, sinks, extras=()):
    bin_file, idx_file, doc_ids_file, *rest = sinks
    itemsize, bounds = write_sidecar_chunks(layout, tokens_of, bin_file, dict(zip(extras, rest)))
    for buf in index_bytes(layout, itemsize):
        idx_file.write(buf)
    np.lib.format.write_array(doc_ids_file, np.ascontiguousarray(layout.doc_ids, dtype="<i8"), version=(1, 0),
                              allow_pickle=False)
    return bounds


def read_index(path) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
    """(token dtype, sequence_lengths, sequence_pointers, document_indices) of a .idx file,
    checked against itself; ValueError naming the file otherwise."""
    return parse_index(fs.map_bytes(path), fs.redact(path))


def parse_index(raw: np.ndarray, where: str) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
    """read_index of the bytes of a .idx file (a uint8 array)."""
    if len(raw) < HEADER.size:
        raise ValueError(f"{where}: {len(raw)} bytes, shorter than the {HEADER.size}-byte Megatron index header (truncated?)")
    magic, version, code, n_sequences, n_documents = HEADER.unpack(raw[: HEADER.size].tobytes())
    if magic != MAGIC:
        raise ValueError(f"{where}: not a Megatron index file (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ValueError(f"{where}: Megatron index version {version}, this packer reads version {VERSION}")
    if code not in TOKEN_DTYPES:
        raise ValueError(f"{where}: Megatron dtype code {code}; packer stores tokens as uint16 (8) or int32 (4)")
    want = HEADER.size + 12 * n_sequences + 8 * n_documents
    if len(raw) != want or n_documents < 1:
        raise ValueError(f"{where}: {len(raw)} bytes, its header implies {want} (truncated or corrupt)")
    pos = HEADER.size
    lengths = raw[pos : pos + 4 * n_sequences].view("<i4")
    pointers = raw[pos + 4 * n_sequences : pos + 12 * n_sequences].view("<i8")
    document_indices = raw[pos + 12 * n_sequences :].view("<i8")
    dtype = TOKEN_DTYPES[code]
    if document_indices[0] != 0 or document_indices[-1] != n_sequences or (np.diff(document_indices) < 0).any():
        raise ValueError(f"{where}: document_indices must rise from 0 to the sequence count {n_sequences}")
    if not np.array_equal(pointers, (np.cumsum(lengths, dtype=np.int64) - lengths) * dtype.itemsize):
        raise ValueError(f"{where}: sequence_pointers are not the running sum of sequence_lengths (corrupt)")
    return dtype, lengths, pointers, document_indices


def _read_doc_ids(path, n_sequences: int, raw=None) -> np.ndarray:
    return sidecars.load_npy(path, "doc_ids", "<i8", n_sequences, "Megatron sequence", raw)


def blocks(paths, extras=(), sums=None):
    """The whole shard as one block: (Rows, doc_ids), tokens a view of the mapped .bin."""
    bin_path, idx_path, doc_ids_path, *rest = paths
    dtype, lengths, _, document_indices = read_index(idx_path)
    cumulative = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    token_starts = cumulative[document_indices]
    offset_starts = document_indices + np.arange(len(document_indices))
    row = np.repeat(np.arange(len(document_indices) - 1), np.diff(offset_starts))  # the row of each offset
    offsets = (cumulative[np.arange(len(row)) - row] - token_starts[row]).astype(np.int32)
    raw = fs.map_bytes(bin_path)
    if len(raw) != cumulative[-1] * dtype.itemsize:
        raise ValueError(f"{fs.redact(bin_path)}: {len(raw)} bytes, its index says {cumulative[-1]} tokens of "
                         f"{dtype.itemsize} bytes (truncated?)")
    tokens = raw.view(dtype) if len(raw) else np.zeros(0, dtype)
    more = sidecars.read(dict(zip(extras, rest)), len(tokens), len(lengths))
    yield Rows(tokens, token_starts, offsets, offset_starts, **more), _read_doc_ids(doc_ids_path, len(lengths))


# -- streaming reads (packer/store/stream.py): the .idx and doc_ids whole, the .bin by blocks --


def csr_index(lengths: np.ndarray, document_indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token_starts, offsets, offset_starts) of the rows a Megatron index describes (what
    `blocks` computes for the whole shard)."""
    cumulative = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    token_starts = cumulative[document_indices]
    offset_starts = document_indices + np.arange(len(document_indices))
    row = np.repeat(np.arange(len(document_indices) - 1), np.diff(offset_starts))  # the row of each offset
    offsets = (cumulative[np.arange(len(row)) - row] - token_starts[row]).astype(np.int32)
    return token_starts, offsets, offset_starts


def stream_index(read, size, paths, block_bytes: int, extras=(), sums=None):
    """memmap.stream_index's twin: (row bounds, byte ranges of each block, a memmap.StreamShard,
    counts). The .idx, the doc_ids and the source ids are read whole (by `read`); the .bin and the
    mask by blocks."""
    bin_path, idx_path, doc_ids_path = paths[:3]
    raw = np.frombuffer(read(idx_path, 0, size(idx_path)), np.uint8)
    dtype, lengths, _, document_indices = parse_index(raw, fs.redact(idx_path))
    token_starts, offsets, offset_starts = csr_index(lengths, document_indices)
    doc_ids = _read_doc_ids(doc_ids_path, len(lengths), raw=read(doc_ids_path, 0, size(doc_ids_path)))
    n_tokens = int(token_starts[-1])
    if (n := size(bin_path)) != n_tokens * dtype.itemsize:
        raise ValueError(f"{fs.redact(bin_path)}: {n} bytes, its index says {n_tokens} tokens of {dtype.itemsize} "
                         "bytes (truncated?)")
    sources, mask_file, role_file = memmap.stream_sidecars(read, size, paths, extras, n_tokens, len(lengths))
    shard = memmap.StreamShard(dtype, token_starts, offsets, offset_starts, doc_ids, sources, mask_file, role_file)
    bounds, ranges, counts = memmap.stream_ranges(shard, block_bytes, sums)
    return bounds, ranges, shard, counts, tuple(extras)


def stream_block(shard, bounds, k: int, buffers) -> tuple[Rows, np.ndarray]:
    return memmap.stream_rows(shard, bounds, k, buffers)
