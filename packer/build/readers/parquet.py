"""Parquet (.parquet): the text column, one unit per row group; rows are numbered across the file.

    b.parquet, 3 row groups -> Unit(start=0, end=1), Unit(1, 2), Unit(2, 3)    (an empty file: one empty unit)
"""

from __future__ import annotations

from packer.build.readers.columns import check_text_column, column_texts
from packer.build.readers.common import SkipLog, Unit
from packer.io import fs

NAME = "parquet"
COMPRESSIBLE = False  # Parquet compresses inside the file


def plan(place, unit_bytes: int, *, compression: str | None, text_split: str) -> list[tuple[int, int, int]]:
    import pyarrow.parquet as pq

    with fs.open_arrow(place) as f:
        meta = pq.ParquetFile(f).metadata
    if meta.num_row_groups == 0:
        return [(0, 0, 0)]
    return [(i, i + 1, meta.row_group(i).total_byte_size) for i in range(meta.num_row_groups)]


def texts(unit: Unit, place, skips: SkipLog, *, text_field: str, text_split: str, max_doc_bytes: int):
    import pyarrow.parquet as pq

    with fs.open_arrow(place) as f:
        pf = pq.ParquetFile(f)
        check_text_column(pf.schema_arrow, text_field, unit.path)
        row = sum(pf.metadata.row_group(i).num_rows for i in range(unit.start))
        for batch in pf.iter_batches(batch_size=4096, row_groups=range(unit.start, unit.end), columns=[text_field]):
            yield from column_texts(batch.column(0), row, unit.path, skips, max_doc_bytes)
            row += batch.num_rows
