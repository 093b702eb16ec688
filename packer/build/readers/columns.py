"""Text out of an Arrow column (Parquet and Arrow IPC readers): rows -> documents, nulls and empties counted.

    column ["one", None, "", b"caf\\xe9", "two"]  (string or binary)
        -> "one", "two";  skipped: row 1 null_text, row 2 empty_text, row 3 invalid_utf8 (binary only)
"""

from __future__ import annotations

from packer.build.readers.common import FileError, SkipLog, decode


def check_text_column(schema, field: str, path: str):
    """FileError unless `schema` has a string or binary column `field`."""
    import pyarrow as pa

    if field not in schema.names:
        raise FileError(path, f"no column {field!r} (columns: {', '.join(schema.names)}; choose one with --text-field)")
    kind = schema.field(field).type
    if not any(check(kind) for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                         pa.types.is_large_binary)):
        raise FileError(path, f"column {field!r} is {kind}, not text (choose another with --text-field)")


def column_texts(column, first_row: int, path: str, skips: SkipLog, max_bytes: int):
    """Texts of one Arrow string/binary column chunk; rows are numbered from first_row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sizes = pc.binary_length(column).to_numpy(zero_copy_only=False)
    is_binary = pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)
    for i, value in enumerate(column.to_pylist()):
        if value is None:
            skips.add("null_text", f"{path} row {first_row + i}")
        elif sizes[i] > max_bytes:
            skips.add("too_large", f"{path} row {first_row + i}")
        elif not value:
            skips.add("empty_text", f"{path} row {first_row + i}")
        elif not is_binary:
            yield value
        elif (text := decode(value, f"{path} row {first_row + i}", skips)) is not None:
            yield text
