"""Text out of an Arrow column (Parquet and Arrow IPC readers): rows -> documents, nulls and empties counted.

    column ["one", None, "", b"caf\\xe9", "two"]  (string or binary)
        -> "one", "two";  skipped: row 1 null_text, row 2 empty_text, row 3 invalid_utf8 (binary only)

Every Arrow text layout reads the same: string / binary, their large_ (64-bit offsets) and _view
forms, and a dictionary of any of them (pandas categoricals, Spark, Parquet's dictionary pages
read with their Arrow schema), each chunk with its own dictionary:

    dictionary<values=string, indices=int8>  indices [0, 1, 0, null], dictionary ["a", None]
        -> "a", "a";  skipped: row 1 null_text (a null value), row 3 null_text (a null index)
"""

from __future__ import annotations

from packer.io import memory
from packer.io.utf8 import HugeRecord
from packer.preprocess.readers.common import HUGE_TEXT_BYTES, FileError, SkipLog, Utf8Text, decode, is_blank, valid_utf8


def _is_string(kind) -> bool:
    import pyarrow.types as t

    return t.is_string(kind) or t.is_large_string(kind) or t.is_string_view(kind)


def _is_binary(kind) -> bool:
    import pyarrow.types as t

    return t.is_binary(kind) or t.is_large_binary(kind) or t.is_binary_view(kind)


def _is_text(kind) -> bool:
    import pyarrow.types as t

    if t.is_dictionary(kind):
        kind = kind.value_type
    return _is_string(kind) or _is_binary(kind)


def check_text_column(schema, field: str, path: str):
    """FileError unless `schema` has a text column `field` (string or binary, any of the layouts above)."""
    if field not in schema.names:
        raise FileError(path, f"no column {field!r} (columns: {', '.join(schema.names)}; choose one with --text-field)")
    kind = schema.field(field).type
    if not _is_text(kind):
        raise FileError(path, f"column {field!r} is {kind}, not text (string or binary, plain, large, view or "
                              "dictionary-encoded; choose another with --text-field)")


def _plain(column):
    """The same values as a string or binary array with offsets: dictionary decoded, view cast.

    binary_length has no kernel for dictionaries or views (pyarrow 26), and to_pylist of a
    dictionary would look every row up in Python."""
    import pyarrow as pa
    import pyarrow.types as t

    if t.is_dictionary(column.type):
        column = column.dictionary_decode()
    if t.is_string_view(column.type):
        column = column.cast(pa.large_string())
    elif t.is_binary_view(column.type):
        column = column.cast(pa.large_binary())
    return column


def column_texts(column, first_row: int, path: str, skips: SkipLog, max_bytes: int):
    """Texts of one Arrow text column chunk (any layout check_text_column accepts); rows are numbered from first_row."""
    import pyarrow.compute as pc

    if _longest(column) > HUGE_TEXT_BYTES:
        yield from _huge_texts(column, first_row, path, skips, max_bytes)
        return
    column = _plain(column)
    values = column.to_pylist()
    is_binary = _is_binary(column.type)
    if not is_binary and column.null_count == 0 and _all_sized(column, 1, max_bytes) and not any(map(str.isspace, values)):
        yield from values  # the common chunk: nothing to skip, no per-row checks in Python
        return
    sizes = pc.binary_length(column).to_numpy(zero_copy_only=False)
    for i, value in enumerate(values):
        if (text := _row_text(value, sizes[i], is_binary, f"{path} row {first_row + i}", skips, max_bytes)) is not None:
            yield text


def _row_text(value, n_bytes: int, is_binary: bool, at: str, skips: SkipLog, max_bytes: int):
    """One row's text, or None with its skip counted: over max_bytes, null, bad UTF-8 in a binary
    column, or blank (the one rule of every reader, common.is_blank). A Utf8Text comes checked."""
    if n_bytes > max_bytes:  # (a null's size is 0, or NaN from a column's sizes)
        skips.add("too_large", at)
        return None
    if value is None:
        skips.add("null_text", at)
        return None
    if is_binary and not isinstance(value, Utf8Text) and value:
        value = decode(value, at, skips)
        if value is None:
            return None
    if is_blank(value):
        skips.add("empty_text", at)
        return None
    return value


def _longest(column) -> int:
    """The longest value's bytes (0 for none), a dictionary's read from its dictionary (nothing decoded)."""
    import pyarrow.compute as pc
    import pyarrow.types as t

    values = column.dictionary if t.is_dictionary(column.type) else column
    if t.is_string_view(values.type) or t.is_binary_view(values.type):
        values = _plain(values)
    return (pc.max(pc.binary_length(values)).as_py() or 0) if len(values) else 0


def _huge_texts(column, first_row: int, path: str, skips: SkipLog, max_bytes: int):
    """column_texts of a chunk holding a value over HUGE_TEXT_BYTES, row by row: such a value is
    handed on as a Utf8Text over its Arrow buffer (a dictionary's value where the column is one),
    never a str, nor a decoded copy of the dictionary; the others as column_texts gives them."""

    memory.return_large_buffers()
    is_binary = text_is_binary(column.type)
    for i, data in enumerate(_value_buffers(column)):
        if (text := value_text(data, is_binary, f"{path} row {first_row + i}", skips, max_bytes)) is not None:
            yield text


def _value_buffers(column):
    """Each row's value as a slice of the column's data buffer (no copy; None for a null), a dictionary's
    from its dictionary. Never a scalar: pyarrow copies a string scalar's bytes out of a memory-mapped
    Arrow file (a 200 MB value read twice, 2026-12-04)."""
    import numpy as np
    import pyarrow.types as t

    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if t.is_dictionary(column.type):
        rows, values = column.indices.fill_null(0).to_numpy(zero_copy_only=False), _plain(column.dictionary)
    else:
        rows, values = np.arange(len(column)), _plain(column)  # views cast; a plain column is left as it is
    ends, data = _offsets(values)
    for i in range(len(column)):
        yield _slice(data, ends, int(rows[i])) if valid[i] else None


def _offsets(values):
    """(the value ends of a string or binary array with offsets, from its own offset on; its data buffer)."""
    import numpy as np
    import pyarrow.types as t

    _, offsets, data = values.buffers()[:3]
    large = t.is_large_string(values.type) or t.is_large_binary(values.type)
    return np.frombuffer(offsets, np.int64 if large else np.int32)[values.offset:values.offset + len(values) + 1], data


def _slice(data, ends, k: int):
    """Value k's bytes: a slice of the data buffer, no copy (an array of empty values has no data)."""
    return data[int(ends[k]):int(ends[k + 1])] if data is not None else memoryview(b"")


def string_value(data):
    """A string value given as its bytes (a buffer) as Python reads it: a str, or over HUGE_TEXT_BYTES a
    Utf8Text over the buffer (bad UTF-8 raises UnicodeDecodeError either way, as pyarrow's to_pylist
    raises on it)."""
    if len(data) > HUGE_TEXT_BYTES and valid_utf8(data):
        return Utf8Text(data)
    return str(data, "utf-8")


def value_text(data, is_binary: bool, at: str, skips: SkipLog, max_bytes: int):
    """_row_text of a value given as its bytes (any buffer; None: null): one over HUGE_TEXT_BYTES is
    handed on as a Utf8Text over that buffer, checked, never copied; a smaller one as a str (bytes
    from a binary column). Shared by _huge_texts and packer's own Parquet page reader (parquet/pages.py)."""
    value, n_bytes = None, 0
    if data is not None:
        n_bytes = len(data)
        if HUGE_TEXT_BYTES < n_bytes <= max_bytes:
            if not valid_utf8(data):
                if not is_binary:
                    str(data, "utf-8")  # a string column's bad UTF-8: what column_texts meets in to_pylist (it raises)
                skips.add("invalid_utf8", at)
                return None
            value = Utf8Text(data)
        elif n_bytes <= max_bytes:  # (a larger one is not read: _row_text counts it too_large)
            value = bytes(data) if is_binary else str(data, "utf-8")
    return _row_text(value, n_bytes, is_binary, at, skips, max_bytes)


def is_string_column(kind) -> bool:
    """A string column (plain, large, view, or a dictionary of one): Python reads its values as str."""
    import pyarrow.types as t

    return _is_string(kind.value_type if t.is_dictionary(kind) else kind)


def text_is_binary(kind) -> bool:
    """Whether a text column of Arrow type `kind` (any layout check_text_column accepts) holds bytes, not strings."""
    import pyarrow.types as t

    return _is_binary(kind.value_type if t.is_dictionary(kind) else kind)


def _all_sized(column, low: int, high: int) -> bool:
    """Every (non-null) value of `column` has low..high bytes."""
    import pyarrow.compute as pc

    if len(column) == 0:
        return True
    bounds = pc.min_max(pc.binary_length(column))
    return bounds["min"].as_py() >= low and bounds["max"].as_py() <= high


def check_record_columns(schema, fields: tuple[str, ...], path: str, fix: str):
    """FileError unless `schema` has at least the first of `fields` (the others are optional)."""
    if fields[0] not in schema.names:
        raise FileError(path, f"no column {fields[0]!r} (columns: {', '.join(schema.names)}; {fix})")


def column_records(batch, fields: tuple[str, ...], first_row: int, path: str):
    """(where, record) per row of an Arrow record batch: the present `fields` as Python values,
    keys whose value is null left out (as transformers drops None keys of chat messages):

        columns messages: list<struct<role, content, tool_calls>>
        row 0  [{"role": "user", "content": "Hi", "tool_calls": None}]  ->  ("a.parquet row 0", {"messages": [{"role": "user", "content": "Hi"}]})
    """
    names = [f for f in fields if f in batch.schema.names]
    if any(_longest_leaf(batch.column(name)) > HUGE_TEXT_BYTES for name in names):
        yield from _huge_records(batch, names, first_row, path)
        return
    columns = [batch.column(name).to_pylist() for name in names]
    for i, values in enumerate(zip(*columns)):
        yield f"{path} row {first_row + i}", {k: _without_nulls(v) for k, v in zip(names, values) if v is not None}


def _huge_records(batch, names: list[str], first_row: int, path: str):
    """column_records of a batch holding a string over HUGE_TEXT_BYTES at any depth (a chat message's
    content): row by row, such a string a Utf8Text over its Arrow buffer, never a str; the record a
    HugeRecord, so the record kinds look for it (packer/encode/records.py)."""
    memory.return_large_buffers()
    columns = [batch.column(name) for name in names]
    for i in range(batch.num_rows):
        values = [_py(column, i) for column in columns]
        yield f"{path} row {first_row + i}", HugeRecord({k: _without_nulls(v) for k, v in zip(names, values)
                                                          if v is not None})


def _py(array, i: int):
    """array[i].as_py(), but a string over HUGE_TEXT_BYTES, at any depth, a Utf8Text over the array's buffer."""
    import pyarrow.types as t

    bitmap, j = array.buffers()[0], array.offset + i
    if bitmap is not None and not memoryview(bitmap)[j >> 3] >> (j & 7) & 1:
        return None
    kind = array.type
    if t.is_struct(kind):
        return {kind.field(j).name: _py(array.field(j), i) for j in range(kind.num_fields)}
    if t.is_list(kind) or t.is_large_list(kind):
        offsets = array.offsets.to_numpy()
        return [_py(array.values, k) for k in range(int(offsets[i]), int(offsets[i + 1]))]
    if _is_string(kind) and not t.is_string_view(kind):
        ends, data = _offsets(array)
        return string_value(_slice(data, ends, i))
    return array[i].as_py()


def _longest_leaf(array) -> int:
    """The longest string or binary value's bytes at any depth of `array` (lists flattened, struct fields)."""
    import pyarrow.compute as pc
    import pyarrow.types as t

    kind = array.type
    if t.is_struct(kind):
        return max((_longest_leaf(array.field(j)) for j in range(kind.num_fields)), default=0)
    if t.is_list(kind) or t.is_large_list(kind):
        return _longest_leaf(pc.list_flatten(array))
    if t.is_dictionary(kind) or _is_string(kind) or _is_binary(kind):
        return _longest(array)
    return 0


def _without_nulls(value):
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value
