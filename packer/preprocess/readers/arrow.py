"""Arrow IPC (.arrow): the file format, or the stream format HF `datasets.save_to_disk` writes; one unit per file.

    data-00000-of-00002.arrow  (stream: schema, batch, batch, ...)  -> the text column of every batch, in order
                                                                       (`records`: the record columns of each row)
"""

from __future__ import annotations

from packer.io import fs
from packer.preprocess.readers.columns import check_record_columns, check_text_column, column_records, column_texts
from packer.preprocess.readers.common import SkipLog, Unit, whole_file

NAME = "arrow"
COMPRESSIBLE = False  # IPC compresses its buffers itself


def plan(place, unit_bytes: int, *, compression: str | None, text_split: str) -> list[tuple[int, int, int]]:
    return whole_file(place)


def texts(unit: Unit, place, skips: SkipLog, *, text_field: str, text_split: str, max_doc_bytes: int):
    with fs.open_arrow(place) as f:
        if (sums := skips.sums) is not None:  # the whole file, hashed before it is decoded: a change after this is caught
            sums.file_bytes = f.size()
            sums.add_ranges(f, [(0, f.size())])
            f.seek(0)
        schema, batches = _batches(f)
        check_text_column(schema, text_field, unit.path)
        row = 0
        for batch in batches:
            yield from column_texts(batch.column(text_field), row, unit.path, skips, max_doc_bytes)
            row += batch.num_rows


def records(unit: Unit, place, skips: SkipLog, *, fields: tuple[str, ...], max_doc_bytes: int, fix: str):
    """(where, record) of each row: the present `fields` (the first one required: FileError naming
    `fix` without it), nulls left out (columns.column_records)."""
    with fs.open_arrow(place) as f:
        schema, batches = _batches(f)
        check_record_columns(schema, fields, unit.path, fix)
        row = 0
        for batch in batches:
            yield from column_records(batch, fields, row, unit.path)
            row += batch.num_rows


def field_names(unit: Unit, place, *, max_doc_bytes: int) -> set[str]:
    """The file's column names, for --input-kind auto."""
    with fs.open_arrow(place) as f:
        return set(_batches(f)[0].names)


def _batches(f):
    """(schema, iterator of record batches) of an open Arrow file, IPC file or stream format."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        reader = ipc.open_file(f)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid:  # not the file format: HF save_to_disk writes the stream format
        f.seek(0)
        reader = ipc.open_stream(f)
        return reader.schema, iter(reader)
