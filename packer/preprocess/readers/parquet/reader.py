"""Parquet (.parquet): the text column (`texts`), or the record columns (`records`); a unit is a run of
whole row groups of about unit_bytes (uncompressed, as the footer says), rows numbered across the file.

    b.parquet, row groups of 30, 30, 50, 10 MiB, unit_bytes 64 MiB
        -> Unit(start=0, end=2), Unit(2, 4)      (an empty file: one empty unit)

A unit costs one open and one footer read (the footer grows with the row-group count), so a file
of many small row groups is a few units, not one per group (units x row groups footer entries read
in all): 200k short texts as 10,000 row groups build in 6.1 s (5.9 CPU s, as for 10 row groups) at
--workers 1 where one unit per row group took 137 s (107 CPU s) (benchmarks/bench_parquet.py,
2026-12-01, shared 2-core machine). A row group bigger than unit_bytes is a unit of its own.
"""

from __future__ import annotations

import contextlib

from packer.io import fs
from packer.preprocess.readers.columns import (
    check_record_columns,
    check_text_column,
    column_records,
    column_texts,
    is_string_column,
    text_is_binary,
)
from packer.preprocess.readers.common import SkipLog, Unit
from packer.preprocess.readers.parquet import page_levels, pages

NAME = "parquet"
COMPRESSIBLE = False  # Parquet compresses inside the file
BATCH_ROWS = 4096


def plan(place, unit_bytes: int, *, compression: str | None, text_split: str) -> list[tuple[int, int, int]]:
    import pyarrow.parquet as pq

    with fs.open_arrow(place) as f:
        meta = pq.ParquetFile(f).metadata
    return group_runs([meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)], unit_bytes)


def group_runs(sizes: list[int], unit_bytes: int) -> list[tuple[int, int, int]]:
    """(start, end, bytes) of runs of consecutive row groups; a run ends before the group that would
    take it past unit_bytes: sizes [3, 3, 5, 1], unit_bytes 6 -> (0, 2, 6), (2, 4, 6)."""
    runs, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > unit_bytes:
            runs.append((start, i, total))
            start, total = i, 0
        total += size
    runs.append((start, len(sizes), total))  # no row groups: (0, 0, 0), one empty unit
    return runs


def texts(unit: Unit, place, skips: SkipLog, *, text_field: str, text_split: str, max_doc_bytes: int):
    import pyarrow.parquet as pq

    with fs.open_arrow(place) as f:
        pf = pq.ParquetFile(f)  # the footer, read once for the unit's row groups
        check_text_column(pf.schema_arrow, text_field, unit.path)
        meta = pf.metadata
        chunks = huge_chunks(f, meta, unit, text_field)
        # a huge chunk's pages are read unmapped: mapped pages, once touched, stay in RSS while the file is open
        with fs.open_arrow(place, mapped=False) if chunks else contextlib.nullcontext(f) as raw:
            if (sums := skips.sums) is not None:  # hashed before anything decodes them: a change after this is caught
                sums.file_bytes = f.size()
                sums.add_ranges(raw, read_ranges(meta, unit, raw))
            row = sum(meta.row_group(i).num_rows for i in range(unit.start))  # the unit's first row in the file
            is_binary = text_is_binary(pf.schema_arrow.field(text_field).type)
            for start, end in _runs(unit, chunks):
                if start in chunks:
                    yield from pages.chunk_texts(raw, chunks[start], row, unit.path, skips, max_doc_bytes, is_binary)
                    row += chunks[start].n_rows
                    continue
                batches = pf.iter_batches(batch_size=BATCH_ROWS, row_groups=range(start, end), columns=[text_field])
                for batch in batches:
                    yield from column_texts(batch.column(0), row, unit.path, skips, max_doc_bytes)
                    row += batch.num_rows


def huge_chunks(f, meta, unit: Unit, text_field: str) -> dict:
    """Row group -> pages.Chunk of the unit's groups whose text column packer reads page by
    page (one that may hold a value over HUGE_TEXT_BYTES); pyarrow reads the others."""
    column = pages.column_index(meta, text_field)
    if column is None:
        return {}
    chunks = {i: pages.page_chunk(f, meta, i, column) for i in range(unit.start, unit.end)}
    return {i: chunk for i, chunk in chunks.items() if chunk is not None}


def _runs(unit: Unit, chunks: dict) -> list[tuple[int, int]]:
    """The unit's row groups as runs: each group of `chunks` alone, the others in runs between them.

        groups 0-5, chunks {2, 3} -> (0, 2), (2, 3), (3, 4), (4, 6)"""
    runs, start = [], unit.start
    for i in range(unit.start, unit.end):
        if i in chunks:
            runs += [(start, i)] if i > start else []
            runs.append((i, i + 1))
            start = i + 1
    return runs + ([(start, unit.end)] if unit.end > start else [])


def records(unit: Unit, place, skips: SkipLog, *, fields: tuple[str, ...], max_doc_bytes: int, fix: str):
    """(where, record) of each row of the unit's row groups: the present `fields` (the first one
    required: FileError naming `fix` without it), nulls left out (columns.column_records); a row
    group with a page over HUGE_TEXT_BYTES among string or list-of-string columns is read by
    pages (page_levels)."""
    import pyarrow.parquet as pq

    with fs.open_arrow(place) as f:
        pf = pq.ParquetFile(f)
        check_record_columns(pf.schema_arrow, fields, unit.path, fix)
        row = sum(pf.metadata.row_group(i).num_rows for i in range(unit.start))
        present = [c for c in fields if c in pf.schema_arrow.names]
        chunks = huge_record_chunks(f, pf, unit, present)
        with fs.open_arrow(place, mapped=False) if chunks else contextlib.nullcontext(f) as raw:
            for start, end in _runs(unit, chunks):
                if start in chunks:
                    yield from page_levels.chunk_records(raw, chunks[start], row, unit.path)
                    row += pf.metadata.row_group(start).num_rows
                    continue
                for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=range(start, end), columns=present):
                    yield from column_records(batch, fields, row, unit.path)
                    row += batch.num_rows


def huge_record_chunks(f, pf, unit: Unit, present: list[str]) -> dict:
    """Row group -> {field: pages.Chunk, or page_levels.ListChunks} of the unit's groups whose
    record columns packer reads: every present field a flat string column or a list of strings or of
    structs of strings (page_levels.list_column) it can read, one of their leaves with a page over
    HUGE_TEXT_BYTES."""
    meta = pf.metadata
    fields = {name: _record_column(meta, pf.schema_arrow.field(name)) for name in present}
    if not present or None in fields.values():
        return {}
    leaves = [j for c in fields.values() for j in (c.columns if isinstance(c, page_levels.ListColumn) else [c])]
    out = {}
    for i in range(unit.start, unit.end):
        huge = {j: pages.page_chunk(f, meta, i, j) for j in leaves}
        if not any(huge.values()):
            continue
        chunks = {j: h or pages.page_chunk(f, meta, i, j, huge=False) for j, h in huge.items()}
        if all(chunks.values()):
            out[i] = {name: page_levels.ListChunks(c, tuple(chunks[j] for j in c.columns))
                      if isinstance(c, page_levels.ListColumn) else chunks[c] for name, c in fields.items()}
    return out


def _record_column(meta, field):
    """The leaf column index of a flat string field, the page_levels.ListColumn of a list one, or None."""
    if is_string_column(field.type):
        return pages.column_index(meta, field.name)
    return page_levels.list_column(meta, field)


def field_names(unit: Unit, place, *, max_doc_bytes: int) -> set[str]:
    """The file's column names, for --input-kind auto."""
    import pyarrow.parquet as pq

    with fs.open_arrow(place) as f:
        return set(pq.ParquetFile(f).schema_arrow.names)


def read_ranges(meta, unit: Unit, f) -> list[tuple[int, int]]:
    """(offset, length) of what a unit's decoding depends on: its row groups' column chunks (one span,
    first chunk to last: row groups are stored in order) and the footer (schema, row-group layout).

        row groups 2-4 of b.parquet -> [(start of group 2's first chunk, up to the end of group 3's last), footer]"""
    starts, ends = [], []
    for i in range(unit.start, unit.end):
        group = meta.row_group(i)
        for c in range(group.num_columns):
            chunk = group.column(c)
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                start = min(start, chunk.dictionary_page_offset)
            starts.append(start)
            ends.append(start + chunk.total_compressed_size)
    size = f.size()
    footer = int.from_bytes(f.read_at(4, size - 8), "little") + 8  # the footer, its 4-byte length, the magic
    groups = [(min(starts), max(ends) - min(starts))] if starts else []
    return groups + [(size - footer, footer)]
