"""Arrow shards: one Arrow IPC stream per shard, one row per packed sequence, which HF `datasets` maps as is.

    shard-00000.arrow   IPC *stream* format (schema message, record batches, end-of-stream
                        marker ff ff ff ff 00 00 00 00), record batches of ROWS_PER_BATCH rows:
                        input_ids: list<uint16|uint32>   the row's tokens, unpadded
                        offsets:   list<int32>           document boundaries in the row: [0, ..., len(row)]
                        doc_ids:   list<int64>           global document index of each segment (audits)
                        loss_mask: list<uint8>           1 = trained, one per token   (only in SFT builds)
                        source_ids: list<uint16>         source of each segment       (only with named sources)

    state.json,         written next to the shards by hf_metadata (the build's finalize), so that
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

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from packer.io import fs
from packer.store.rows import Layout, Rows, row_chunks, split_chunk

FILES = (("file", "sha256", ".arrow"),)
EXTRA_FILES: dict = {}  # loss_mask and source_ids are columns of the one file
FILE_MAGIC = b"ARROW1"  # the first bytes of an IPC file (a shard of packer before 2026-12)
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the last 8 bytes of every IPC stream
HF_STATE, HF_INFO = "state.json", "dataset_info.json"  # what datasets.load_from_disk reads first


def _batch(layout: Layout, r0: int, r1: int, tokens: np.ndarray, mask: np.ndarray | None, extras) -> pa.RecordBatch:
    value_type = pa.uint16() if tokens.dtype.itemsize == 2 else pa.uint32()
    o0, o1 = int(layout.offset_starts[r0]), int(layout.offset_starts[r1])

    def column(bounds, values, type=None):
        return pa.ListArray.from_arrays(pa.array((bounds - bounds[0]).astype(np.int32)), pa.array(values, type=type))

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
    return pa.record_batch(columns)


def write(layout: Layout, tokens_of, sinks, extras=()):
    sink = pa.PythonFile(sinks[0], mode="w")
    with ipc.new_stream(sink, _batch(layout, 0, 0, *split_chunk(tokens_of(0, 0)), extras).schema) as writer:
        for r0, r1 in row_chunks(len(layout)):
            writer.write_batch(_batch(layout, r0, r1, *split_chunk(tokens_of(r0, r1)), extras))


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


def blocks(paths, extras=()):
    """One (Rows, doc_ids) per record batch, zero-copy over a memory map (read, if remote)."""
    where = fs.redact(paths[0])
    for batch in _record_batches(paths[0]):
        ids, offs, doc_ids = batch.column("input_ids"), batch.column("offsets"), batch.column("doc_ids")
        rows = Rows(
            ids.values.to_numpy(zero_copy_only=True),
            ids.offsets.to_numpy(),
            offs.values.to_numpy(zero_copy_only=True),
            offs.offsets.to_numpy(),
            loss_mask=_extra(batch, "loss_mask", ids, where),
            source_ids=_extra(batch, "source_ids", doc_ids, where),
        )
        yield rows, doc_ids.flatten().to_numpy(zero_copy_only=True)


def hf_metadata(shards: list[dict]) -> dict[str, bytes]:
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
