"""Arrow shards: one Arrow IPC stream per shard, one row per packed sequence, which HF `datasets` maps as is.

    shard-00000.arrow   IPC *stream* format (schema message, record batches, end-of-stream
                        marker ff ff ff ff 00 00 00 00), record batches of ROWS_PER_BATCH rows:
                        input_ids: list<uint16|uint32>   the row's tokens, unpadded
                        offsets:   list<int32>           document boundaries in the row: [0, ..., len(row)]
                        doc_ids:   list<int64>           global document index of each segment (audits)
                        loss_mask: list<uint8>           1 = trained, one per token   (only in SFT builds)
                        source_ids: list<uint16>         source of each segment       (only with named sources)
                        role_ids:  list<uint8>           chat role of each token      (only with --store-roles)

    state.json,         derived_files: written next to the shards by the build's finalize, so that
    dataset_info.json   `datasets.load_from_disk(DIR)` maps every shard; `Dataset.from_file(shard)`
                        needs neither

Why a stream and not an IPC *file*: `datasets` memory-maps only streams (`pa.ipc.open_stream`
in datasets/table.py: its own cache files are streams). An IPC file is the same stream between an
8-byte header (b"ARROW1\\0\\0") and a footer, so the stream form holds the same bytes less those:
shards of packer before 2026-12 are IPC files, and `blocks` reads both forms. The footer's random
access to record batches is not needed: a shard is opened by reading every batch's header anyway.

Readable by plain pyarrow (`ipc.open_stream(pa.memory_map(path))`) and by HF `datasets`
(`Dataset.from_file`, `load_from_disk`, `load_dataset("arrow", ...)`). Read back one block per
record batch, zero-copy over a memory map; a remote shard by reads (packer/io/fs.py `open_arrow`).
"""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from packer.io import fs
from packer.store.rows import EXTRAS, Layout, Rows, row_chunks, split_chunk

FILES = (("file", "sha256", ".arrow"),)
EXTRA_FILES: dict = {}  # loss_mask, source_ids and role_ids are columns of the one file
FILE_MAGIC = b"ARROW1"  # the first bytes of an IPC file (a shard of packer before 2026-12)
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the last 8 bytes of every IPC stream
HF_STATE, HF_INFO = "state.json", "dataset_info.json"  # what datasets.load_from_disk reads first
DERIVED_FILES = (HF_STATE, HF_INFO)


def _array(values: np.ndarray, type=None) -> pa.Array:
    """pa.array of a numpy array, without pa.array's check for pandas objects, which imports pandas
    (0.2 s of a build, 2026-12-04): the same buffer, no nulls."""
    values = np.ascontiguousarray(values)
    if type is None:
        type = pa.from_numpy_dtype(values.dtype)
    elif np.dtype(type.to_pandas_dtype()) != values.dtype:
        return pa.array(values, type=type)  # a cast, checked by Arrow
    return pa.Array.from_buffers(type, len(values), [None, pa.py_buffer(values)])


def _batch(layout: Layout, r0: int, r1: int, tokens: np.ndarray, mask: np.ndarray | None, roles: np.ndarray | None,
           extras) -> pa.RecordBatch:
    value_type = pa.uint16() if tokens.dtype.itemsize == 2 else pa.uint32()
    o0, o1 = int(layout.offset_starts[r0]), int(layout.offset_starts[r1])

    def column(bounds, values, type=None):
        return pa.ListArray.from_arrays(_array((bounds - bounds[0]).astype(np.int32)), _array(values, type))

    segment_bounds = layout.offset_starts[r0 : r1 + 1] - np.arange(r0, r1 + 1)
    columns = {
        "input_ids": column(layout.token_starts[r0 : r1 + 1], tokens, value_type),
        "offsets": column(layout.offset_starts[r0 : r1 + 1], layout.offsets[o0:o1]),
        "doc_ids": column(segment_bounds, layout.doc_ids[o0 - r0 : o1 - r1]),
    }
    if "loss_mask" in extras:
        columns["loss_mask"] = column(layout.token_starts[r0 : r1 + 1], np.asarray(mask, np.uint8), pa.uint8())
    if "source_ids" in extras:
        columns["source_ids"] = column(segment_bounds, np.asarray(layout.source_ids[o0 - r0 : o1 - r1], np.uint16),
                                       pa.uint16())
    if "role_ids" in extras:
        columns["role_ids"] = column(layout.token_starts[r0 : r1 + 1], np.asarray(roles, np.uint8), pa.uint8())
    return pa.record_batch(columns)


def write(layout: Layout, tokens_of, sinks, extras=()):
    """The stream, its checksummed ranges (checksums.BlockSink) cut at each message: the schema
    (written with the first batch, as `Schema.serialize` gives it), each record batch, the end marker."""
    schema = _batch(layout, 0, 0, *split_chunk(tokens_of(0, 0)), extras).schema
    sinks[0].first = 1
    sinks[0].cut_at([schema.serialize().size])
    bounds = [0]
    with ipc.new_stream(pa.PythonFile(sinks[0], mode="w"), schema) as writer:
        for r0, r1 in row_chunks(len(layout)):
            writer.write_batch(_batch(layout, r0, r1, *split_chunk(tokens_of(r0, r1)), extras))
            sinks[0].cut_at([sinks[0].tell()])
            bounds.append(r1)
    return np.asarray(bounds, np.int64)


def _record_batches(path):
    """The shard's record batches in order, stream or (older shards) file form. A stream must end
    with its end-of-stream marker at the last byte: a shard cut at a batch boundary is still a
    readable stream, so this is what tells it from a whole one."""
    f = fs.open_arrow(path)
    if f.read_at(len(FILE_MAGIC), 0) == FILE_MAGIC:
        reader = ipc.open_file(f)
        for b in range(reader.num_record_batches):
            yield reader.get_batch(b)
        return
    f.seek(0)  # read_at moves the position of some remote files (fsspec's, through pyarrow.PythonFile)
    yield from ipc.open_stream(f)
    end, size = f.tell(), f.size()
    if end != size or f.read_at(len(END_OF_STREAM), end - len(END_OF_STREAM)) != END_OF_STREAM:
        raise ValueError(f"{fs.redact(path)}: the Arrow stream ends at byte {end} of {size} without its end-of-stream "
                         "marker (truncated, or bytes after it); rebuild the dataset")


def _extra(batch, name: str, ids, where):
    """The values of optional column `name` (None if absent), checked to align with `ids`'s rows."""
    if batch.schema.get_field_index(name) < 0:
        return None
    column = batch.column(name)
    if not np.array_equal(column.offsets.to_numpy(), ids.offsets.to_numpy()):
        raise ValueError(f"{where}: column {name} does not have the row lengths of its partner (corrupt shard)")
    return column.values.to_numpy(zero_copy_only=True)


def blocks(paths, extras=(), sums=None):
    """One (Rows, doc_ids) per record batch, zero-copy over a memory map (read, if remote). With
    the shard's checksums, each batch from its checksummed byte range (the bytes a reader checks)."""
    where = fs.redact(paths[0])
    if sums is not None:
        yield from _summed_blocks(paths[0], sums, where)
        return
    for batch in _record_batches(paths[0]):
        yield _batch_rows(batch, where)


def _summed_blocks(path, sums, where):
    raw = fs.map_bytes(path)
    cuts = sums.files[0].cuts
    if sums.files[0].first != 1 or len(cuts) != sums.n_blocks + 3 or len(raw) != cuts[-1]:
        raise ValueError(f"{where}: {len(raw)} bytes, its checksums file describes {int(cuts[-1])} in {len(cuts) - 1} "
                         "ranges (truncated, or replaced); rebuild the dataset")
    schema = ipc.read_schema(pa.py_buffer(raw[cuts[0] : cuts[1]]))
    for k in range(sums.n_blocks):
        message = ipc.read_message(pa.py_buffer(raw[cuts[k + 1] : cuts[k + 2]]))
        batch = ipc.read_record_batch(message, schema)
        if batch.num_rows != sums.rows[k + 1] - sums.rows[k]:
            raise ValueError(f"{where}: record batch {k} holds {batch.num_rows} rows, its checksums file says "
                             f"{int(sums.rows[k + 1] - sums.rows[k])} (corrupt; rebuild the dataset)")
        yield _batch_rows(batch, where)


def derived_files(shards: list[dict]) -> dict[str, bytes]:
    """The two files `datasets.load_from_disk(DIR)` reads before it maps the shards, as
    {file name: bytes}, for the manifest's shard entries (in order):

        state.json          {"_data_files": [{"filename": "shard-00000.arrow"}, ...],
                             "_fingerprint": 16 hex digits of the shards' sha256, ...}
        dataset_info.json   {"description": ..., "features": null}

    `features` is left out so that datasets takes it from the shards' own schema (List(Value
    ("uint16")) and the rest): nothing to disagree with it, in any datasets version. The same
    shards give the same bytes (sorted keys, no time). No shards, no files: datasets cannot open a
    dataset of no data files."""
    if not shards:
        return {}
    digest = hashlib.sha256("".join(f"{s['file']} {s['sha256']}\n" for s in shards).encode("utf-8"))
    state = {
        "_data_files": [{"filename": s["file"]} for s in shards],
        "_fingerprint": digest.hexdigest()[:16],  # datasets keys its caches of .map() etc. on this
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    info = {"description": "packed sequences written by packer; manifest.json says what they hold", "features": None}
    return {name: (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8")
            for name, value in ((HF_STATE, state), (HF_INFO, info))}


# -- streaming reads (packer/store/stream.py): record batches located by their message headers --
#
# An IPC stream is a run of messages, each
#     ff ff ff ff | int32 metadata length M | M bytes: a flatbuffer `Message` | bodyLength bytes of body
# and ends with ff ff ff ff 00 00 00 00 (M = 0). The Message table (Arrow's format/Message.fbs) holds
# field 1 header_type (ubyte: 1 Schema, 2 DictionaryBatch, 3 RecordBatch), field 2 the header table
# (for a RecordBatch, its field 0 is the row count `length`, int64) and field 3 bodyLength (int64).
# Reading those few scalars is all a streaming open needs: one small ranged read per batch.

HEAD_READ_BYTES = 4096  # read this much at a message's start: its metadata (a few hundred bytes here) in one request
_SCHEMA, _RECORD_BATCH = 1, 3


def _table_field(buf: memoryview, table: int, field: int, fmt: str, default=0):
    """Scalar `field` of the flatbuffer table at byte `table` (its vtable gives the field's place)."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    vtable_size = struct.unpack_from("<H", buf, vtable)[0]
    slot = 4 + 2 * field
    at = struct.unpack_from("<H", buf, vtable + slot)[0] if slot < vtable_size else 0
    return struct.unpack_from(fmt, buf, table + at)[0] if at else default


def message_header(meta: bytes) -> tuple[int, int, int]:
    """(header_type, bodyLength, row count or 0) of one IPC message's flatbuffer metadata."""
    buf = memoryview(meta)
    root = struct.unpack_from("<I", buf, 0)[0]
    kind = _table_field(buf, root, 1, "<B")
    body = _table_field(buf, root, 3, "<q")
    n_rows = 0
    if kind == _RECORD_BATCH:
        at = _table_field(buf, root, 2, "<I")  # the offset field itself, relative to where it sits
        vtable = root - struct.unpack_from("<i", buf, root)[0]
        header = root + struct.unpack_from("<H", buf, vtable + 8)[0] + at
        n_rows = _table_field(buf, header, 0, "<q")
    return kind, body, n_rows


def _messages(read, size, path) -> tuple[list[tuple[int, int, int, int]], bytes]:
    """(header_type, start, stop, row count) of every message of a shard's IPC stream, and the
    schema message's bytes: one ranged read of HEAD_READ_BYTES at each message start not already
    read (the schema and a first small batch come in one). Also the IPC file form (its stream
    starts at byte 8, its footer after the end-of-stream marker)."""
    where, total = fs.redact(path), size(path)
    window, base = bytes(read(path, 0, min(total, HEAD_READ_BYTES))), 0
    file_form = window[: len(FILE_MAGIC)] == FILE_MAGIC
    pos, out, schema = (8 if file_form else 0), [], b""

    def at(start, n):  # bytes [start, start + n), from the window when it holds them
        nonlocal window, base
        if not (base <= start and start + n <= base + len(window)):
            window, base = bytes(read(path, start, min(total, start + max(n, HEAD_READ_BYTES)))), start
        return window[start - base : start - base + n]

    while True:
        head = at(pos, 8)
        if len(head) < 8:
            raise ValueError(f"{where}: the Arrow stream ends at byte {total} inside a message header (truncated); "
                             "rebuild the dataset")
        marker, meta_len = struct.unpack("<Ii", head)
        if marker != 0xFFFFFFFF or meta_len < 0:
            raise ValueError(f"{where}: no Arrow IPC message at byte {pos} (corrupt shard); rebuild the dataset")
        if meta_len == 0:  # the end-of-stream marker
            if not file_form and pos + 8 != total:
                raise ValueError(f"{where}: the Arrow stream ends at byte {pos + 8} of {total} (bytes after its "
                                 "end-of-stream marker); rebuild the dataset")
            return out, schema
        if pos + 8 + meta_len > total:
            raise ValueError(f"{where}: an Arrow message header at byte {pos} runs past the end {total} (truncated)")
        meta = at(pos + 8, meta_len)
        kind, body, n_rows = message_header(meta)
        stop = pos + 8 + meta_len + body
        if body < 0 or stop > total:
            raise ValueError(f"{where}: an Arrow message at byte {pos} runs to byte {stop}, past the end {total} "
                             "(truncated); rebuild the dataset")
        if not out:
            schema = at(pos, stop - pos)
        out.append((kind, pos, stop, n_rows))
        pos = stop


def stream_index(read, size, paths, block_bytes: int, extras=(), sums=None):
    """What a streaming reader needs of one shard before any token (memmap.stream_index's shape):
    (row bounds of its blocks, each block's byte range, (schema, name), counts, the optional
    fields its columns hold). A block is one record
    batch (ROWS_PER_BATCH rows); `block_bytes` does not apply. Counts hold only `sequences` (the
    batch headers' row counts): tokens and documents are in the bodies. With the shard's
    checksums, the batches are where its ranges say (no header read at all)."""
    path = paths[0]
    if sums is not None:
        return _summed_index(read, size, path, sums)
    messages, schema_bytes = _messages(read, size, path)
    if not messages or messages[0][0] != _SCHEMA:
        raise ValueError(f"{fs.redact(path)}: the Arrow stream does not start with its schema (corrupt shard); rebuild")
    if any(kind != _RECORD_BATCH for kind, *_ in messages[1:]):
        raise ValueError(f"{fs.redact(path)}: an Arrow message other than a record batch (dictionaries are not "
                         "packer's); rebuild the dataset")
    schema = ipc.read_schema(pa.py_buffer(schema_bytes))
    bounds = np.concatenate([[0], np.cumsum([m[3] for m in messages[1:]], dtype=np.int64)]).astype(np.int64)
    ranges = [((0, start, stop),) for _, start, stop, _ in messages[1:]]
    fields = tuple(name for name in EXTRAS if schema.get_field_index(name) >= 0)
    return bounds, ranges, (schema, fs.redact(path)), {"sequences": int(bounds[-1])}, fields


def _summed_index(read, size, path, sums):
    cuts, where, n = sums.files[0].cuts, fs.redact(path), size(path)
    if sums.files[0].first != 1 or len(cuts) != sums.n_blocks + 3 or n != cuts[-1]:
        raise ValueError(f"{where}: {n} bytes, its checksums file describes {int(cuts[-1])} in {len(cuts) - 1} "
                         "ranges (truncated, or replaced); rebuild the dataset")
    schema = ipc.read_schema(pa.py_buffer(read(path, int(cuts[0]), int(cuts[1]))))
    bounds = np.asarray(sums.rows, np.int64)
    ranges = [((0, int(a), int(b)),) for a, b in zip(cuts[1:-2], cuts[2:-1])]
    fields = tuple(name for name in EXTRAS if schema.get_field_index(name) >= 0)
    return bounds, ranges, (schema, where), {"sequences": int(bounds[-1])}, fields


def stream_block(state, bounds, k: int, buffers) -> tuple[Rows, np.ndarray]:
    """Record batch k of a streamed shard from its message bytes, zero-copy over them (as `blocks`
    reads a batch, optional columns too)."""
    schema, where = state
    batch = ipc.read_record_batch(ipc.read_message(pa.py_buffer(buffers[0])), schema)
    return _batch_rows(batch, where)


def _batch_rows(batch, where) -> tuple[Rows, np.ndarray]:
    ids, offs, doc_ids = batch.column("input_ids"), batch.column("offsets"), batch.column("doc_ids")
    rows = Rows(ids.values.to_numpy(zero_copy_only=True), ids.offsets.to_numpy(),
                offs.values.to_numpy(zero_copy_only=True), offs.offsets.to_numpy(),
                loss_mask=_extra(batch, "loss_mask", ids, where), source_ids=_extra(batch, "source_ids", doc_ids, where),
                role_ids=_extra(batch, "role_ids", ids, where))
    return rows, doc_ids.flatten().to_numpy(zero_copy_only=True)
