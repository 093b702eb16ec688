"""Arrow shards: one Arrow IPC file per shard, one row per packed sequence.

    shard-00000.arrow   IPC *file* format (footer, random access), record batches of
                        ROWS_PER_BATCH rows:
                        input_ids: list<uint16|uint32>   the row's tokens, unpadded
                        offsets:   list<int32>           document boundaries in the row: [0, ..., len(row)]
                        doc_ids:   list<int64>           global document index of each segment (audits)

Readable by plain pyarrow (`ipc.open_file(pa.memory_map(path))`) and by HF `datasets`
(`load_dataset("arrow", data_files=...)`). Read back one block per record batch, zero-copy over a
memory map; a remote shard by ranged reads (packer/io/fs.py `open_arrow`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from packer.io import fs
from packer.store.rows import Layout, Rows, row_chunks

FILES = (("file", "sha256", ".arrow"),)


def _batch(layout: Layout, r0: int, r1: int, tokens: np.ndarray) -> pa.RecordBatch:
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


def write(layout: Layout, tokens_of, sinks):
    sink = pa.PythonFile(sinks[0], mode="w")
    with ipc.new_file(sink, _batch(layout, 0, 0, tokens_of(0, 0)).schema) as writer:
        for r0, r1 in row_chunks(len(layout)):
            writer.write_batch(_batch(layout, r0, r1, tokens_of(r0, r1)))


def blocks(paths):
    """One (Rows, doc_ids) per record batch, zero-copy over a memory map (read, if remote)."""
    reader = ipc.open_file(fs.open_arrow(paths[0]))
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
