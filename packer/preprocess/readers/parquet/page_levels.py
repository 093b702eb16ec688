"""A Parquet row group's record columns read page by page, a list column's rows put together from its leaves' levels.

A list column (list<string>, or list<struct<string, ...>>: a chat's messages) is stored as one
leaf column per string, each value with a repetition level (0: a new row; 1: the next element of
the row's list) and a definition level (how deep the row is there). For messages:
list<struct<role, content>>, every level optional, the definition levels say 0 a null list,
1 an empty list, 2 a null message, 3 a null field, 4 a value:

    rep      [0, 1, 0, 0, 0]
    .role    [4, 2, 0, 1, 4]  "user",             "system"
    .content [4, 2, 0, 1, 3]  "Hi"
        -> {"messages": [{"role": "user", "content": "Hi"}, None]}, {}, {"messages": []},
           {"messages": [{"role": "system"}]}

as columns.column_records gives them from pyarrow: a null field, or a null list, left out; a null
element kept. The leaves are read side by side, a page at a time each; a value over
HUGE_TEXT_BYTES is a Utf8Text over its page, and its record a HugeRecord, the mark the record kinds
look for (packer/encode/records.py; columns._huge_records marks every record of a 4096-row batch
holding one, the same shards either way). Reading levels a value at a time in Python costs about
5 us a message (50,000 two-message chats in a row group: 0.55 s, 0.25 s by pyarrow; 2026-12-04),
paid only for a row group with a huge page. Only the Parquet spec's three-level list layout (what
pyarrow writes), with string leaves, is read here (`list_column`); any other nested column (a
two-level legacy list, a map, a list of lists, a number or binary field) is left to pyarrow before a
page of it is read.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from packer.io.utf8 import HugeRecord, Utf8Text
from packer.preprocess.readers.columns import string_value
from packer.preprocess.readers.common import FileError
from packer.preprocess.readers.parquet import pages

_END = object()


@dataclass(frozen=True)
class ListColumn:
    """A list field's leaf columns (one per struct field, in the struct's order; or the list's own
    strings: names None), and the definition levels of an empty list (list_def; below it the list
    is null) and of a present element (item_def; below it the element is null)."""

    columns: tuple[int, ...]
    names: tuple[str, ...] | None
    list_def: int
    item_def: int


@dataclass(frozen=True)
class ListChunks:
    """A row group's chunks of a ListColumn's leaves (pages.Chunk, in its columns' order)."""

    column: ListColumn
    chunks: tuple


def list_column(meta, field) -> ListColumn | None:
    """The ListColumn of the top-level Arrow field `field` (of the file's schema_arrow) when packer
    reads it: a list or large list of strings, or of structs of strings, whose Parquet leaves sit at
    field.list.element[.name] with the levels its nullability gives; else None."""
    import pyarrow.types as t

    kind = field.type
    if not (t.is_list(kind) or t.is_large_list(kind)):
        return None
    item = kind.value_field
    is_struct = t.is_struct(item.type)
    leaves = [item.type.field(j) for j in range(item.type.num_fields)] if is_struct else [item]
    if not leaves or not all(t.is_string(leaf.type) or t.is_large_string(leaf.type) for leaf in leaves):
        return None
    list_def = int(field.nullable)
    item_def = list_def + 1 + int(item.nullable)  # the repeated level, then the element's own
    schema = meta.schema
    found = [j for j in range(len(schema)) if schema.column(j).path.split(".")[0] == field.name]
    if len(found) != len(leaves):
        return None
    middles = set()
    for j, leaf in zip(found, leaves):
        column, parts = schema.column(j), schema.column(j).path.split(".")
        max_def = item_def + int(leaf.nullable) if is_struct else item_def
        if (len(parts) != (4 if is_struct else 3) or (is_struct and parts[3] != leaf.name)
                or column.max_repetition_level != 1 or column.max_definition_level != max_def):
            return None
        middles.add(tuple(parts[1:3]))
    if len(middles) != 1:
        return None
    return ListColumn(tuple(found), tuple(leaf.name for leaf in leaves) if is_struct else None, list_def, item_def)


def chunk_records(f, chunks: dict, first_row: int, path: str):
    """column_records of a row group whose `chunks` (field -> pages.Chunk of a flat string
    column, or ListChunks; in the fields' order) packer reads: (where, record) per row, nulls left out,
    a value over HUGE_TEXT_BYTES a Utf8Text over its page and its record a HugeRecord (bad UTF-8
    raises, as pyarrow's to_pylist does)."""
    names = list(chunks)
    fields = [_list_rows(f, c, path) if isinstance(c, ListChunks) else _flat_rows(f, c, path) for c in chunks.values()]
    for row, values in enumerate(itertools.zip_longest(*fields, fillvalue=_END), first_row):
        if any(v is _END for v in values):
            raise FileError(path, "a Parquet row group whose columns hold different numbers of rows")
        record = {k: v for k, (v, _) in zip(names, values) if v is not None}
        yield f"{path} row {row}", HugeRecord(record) if any(huge for _, huge in values) else record


def _flat_rows(f, chunk, path: str):
    """(value, whether it is a Utf8Text) of each row of a flat string chunk."""
    for data in pages.chunk_values(f, chunk, path):
        value = None if data is None else string_value(data)
        yield value, isinstance(value, Utf8Text)


def _list_rows(f, lists: ListChunks, path: str):
    """(list, whether it holds a Utf8Text) of each row of a list column: None for a null list."""
    column, n_rows, row, huge = lists.column, lists.chunks[0].n_rows, _END, False
    for entries in itertools.zip_longest(*(_entries(f, c, path) for c in lists.chunks), fillvalue=_END):
        if any(e is _END for e in entries):
            raise FileError(path, "a Parquet list column whose leaves hold different numbers of values")
        rep, level = entries[0][0], min(entries[0][1], column.item_def)  # what the leaves share: list and element
        if any(e[0] != rep or min(e[1], column.item_def) != level for e in entries):
            raise FileError(path, "a Parquet list column whose leaves' levels do not agree")
        if rep == 0:
            if row is not _END:
                yield row, huge
                n_rows -= 1
            row, huge = (None if level < column.list_def else []), False
        elif row is _END or level <= column.list_def:
            raise FileError(path, "a Parquet list column's levels out of order")
        if level <= column.list_def:
            continue
        item = None
        if level == column.item_def:
            values = [(k, string_value(e[2])) for k, e in zip(column.names or [None], entries) if e[2] is not None]
            huge = huge or any(isinstance(v, Utf8Text) for _, v in values)
            item = dict(values) if column.names else values[0][1]
        row.append(item)
    if row is not _END:
        yield row, huge
        n_rows -= 1
    if n_rows:
        raise FileError(path, "a Parquet list column whose levels do not add up to its rows")


def _entries(f, chunk, path: str):
    """(repetition level, definition level, value: a memoryview, or None below max_def) of each
    value of a list's leaf chunk, page after page."""
    for reps, defs, values in pages.chunk_pages(f, chunk, path):
        values = iter(values)
        for rep, level in zip(reps.tolist(), defs.tolist()):
            yield rep, level, next(values) if level == chunk.max_def else None
