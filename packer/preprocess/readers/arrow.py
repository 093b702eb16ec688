"""Arrow IPC (.arrow): the file format, or the stream format HF `datasets.save_to_disk` writes; one unit per file.

    data-00000-of-00002.arrow  (stream: schema, batch, batch, ...)  -> the text column of every batch, in order
"""

from __future__ import annotations

from packer.io import fs
from packer.preprocess.readers.columns import check_text_column, column_texts
from packer.preprocess.readers.common import SkipLog, Unit, whole_file

NAME = "arrow"
COMPRESSIBLE = False  # IPC compresses its buffers itself


def plan(place, unit_bytes: int, *, compression: str | None, text_split: str) -> list[tuple[int, int, int]]:
    return whole_file(place)


def texts(unit: Unit, place, skips: SkipLog, *, text_field: str, text_split: str, max_doc_bytes: int):
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with fs.open_arrow(place) as f:
        if (sums := skips.sums) is not None:  # the whole file, hashed before it is decoded: a change after this is caught
            sums.file_bytes = f.size()
            sums.add_ranges(f, [(0, f.size())])
            f.seek(0)
        try:
            reader = ipc.open_file(f)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:  # not the file format: HF save_to_disk writes the stream format
            f.seek(0)
            reader = ipc.open_stream(f)
            batches = iter(reader)
        check_text_column(reader.schema, text_field, unit.path)
        row = 0
        for batch in batches:
            yield from column_texts(batch.column(text_field), row, unit.path, skips, max_doc_bytes)
            row += batch.num_rows
