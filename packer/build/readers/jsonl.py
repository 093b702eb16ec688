"""JSON Lines (.jsonl .json .ndjson, optionally .gz/.zst): one JSON object per line, its text field a document.

    {"text": "first doc", "id": 0}\\n          -> "first doc"
    {"text": null}\\n                          -> skipped: null_text
    {"text": \\n                               -> skipped: malformed_json

Units: byte ranges of ~unit_bytes for an uncompressed file (a unit owns every line that
*starts* inside [start, end)), one unit per compressed file. Lines are read in 1 MiB blocks
and a line longer than max_doc_bytes is never held whole: it is skipped as `too_large`.
"""

from __future__ import annotations

import json

from packer.build.readers.common import SkipLog, Unit, byte_ranges, open_lines, where, whole_file
from packer.io.lines import line_blocks

NAME = "jsonl"
COMPRESSIBLE = True


def plan(place, unit_bytes: int, *, compression: str | None, text_split: str) -> list[tuple[int, int, int]]:
    return whole_file(place) if compression else byte_ranges(place, unit_bytes)


def texts(unit: Unit, place, skips: SkipLog, *, text_field: str, text_split: str, max_doc_bytes: int):
    f, pos = open_lines(unit, place)
    with f:
        yield from _jsonl_texts(f, pos, unit, text_field, skips, max_doc_bytes)


def _jsonl_texts(f, pos, unit: Unit, field: str, skips: SkipLog, max_bytes: int):
    line_no = 1
    for pos, block in line_blocks(f, pos, max_bytes):
        if pos >= unit.end:
            break
        if block is None:
            skips.add("too_large", where(unit, line_no, pos))
            line_no += 1
            continue
        if pos + len(block) > unit.end:  # keep the lines that start inside the unit
            block = block[: block.find(b"\n", unit.end - pos - 1) + 1 or len(block)]
        texts = _parse_block(block, field, max_bytes)
        if texts is None:
            yield from _parse_lines(block, pos, line_no, unit, field, skips, max_bytes)
        else:
            yield from texts
        line_no += block.count(b"\n")


def _parse_block(block: bytes, field: str, max_bytes: int) -> list[str] | None:
    """Fast path: pyarrow's JSON reader over a block of lines, ~3x faster than json.loads per line
    (3 MB of sample JSONL: 11 ms against 34 ms of CPU, 2026-11-29). None when any line might need
    the per-line path (anything it would skip or count), which then decides line by line."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    if len(block) > max_bytes and _longest_line(block) > max_bytes:
        return None
    body = block[:-1] if block.endswith(b"\n") else block
    if not body or body[:1].isspace() or any(s in block for s in _LINE_STARTS_BLANK):
        return None  # a blank line (or one starting blank): rows would not match lines one to one
    if not block.isascii():
        try:
            block.decode("utf-8")  # the per-line path rejects bad bytes anywhere in a line
        except UnicodeDecodeError:
            return None
    try:
        table = pj.read_json(
            pa.py_buffer(block),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(block) + 1),
            parse_options=pj.ParseOptions(explicit_schema=pa.schema([(field, pa.string())]),
                                          unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowException, UnicodeDecodeError):
        return None
    column = table.column(0)
    if table.num_rows != body.count(b"\n") + 1:
        return None  # two objects on one line
    if column.null_count or (len(column) and pc.min(pc.binary_length(column)).as_py() == 0):
        return None  # missing, null or empty text
    return column.to_pylist()


_LINE_STARTS_BLANK = (b"\n\n", b"\n ", b"\n\t", b"\n\r", b"\n\x0b", b"\n\x0c")


def _longest_line(block: bytes) -> int:
    import numpy as np

    ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
    bounds = np.concatenate([[-1], ends, [len(block)]])
    return int(np.diff(bounds).max()) - 1


def _parse_lines(block: bytes, pos: int, line_no: int, unit: Unit, field: str, skips: SkipLog, max_bytes: int):
    """The per-line path: json.loads each line; every problem is counted by reason."""
    missing = object()
    for line_no, line in enumerate(block.split(b"\n"), line_no):
        where_pos, pos = pos, pos + len(line) + 1
        if not line or line.isspace():
            continue
        if len(line) > max_bytes:
            skips.add("too_large", where(unit, line_no, where_pos))
            continue
        try:
            record = json.loads(line)
        except UnicodeDecodeError:
            skips.add("invalid_utf8", where(unit, line_no, where_pos))
            continue
        except json.JSONDecodeError as e:
            skips.add("malformed_json", f"{where(unit, line_no, where_pos)}: {e.msg}")
            continue
        except RecursionError:  # e.g. a line of 100,000 "["
            skips.add("malformed_json", f"{where(unit, line_no, where_pos)}: nested too deeply")
            continue
        text = record.get(field, missing) if isinstance(record, dict) else missing
        if text is missing:
            skips.add("missing_field", where(unit, line_no, where_pos))
        elif text is None:
            skips.add("null_text", where(unit, line_no, where_pos))
        elif not isinstance(text, str):
            skips.add("non_string_text", where(unit, line_no, where_pos))
        elif not text:
            skips.add("empty_text", where(unit, line_no, where_pos))
        elif (b"\\ud" in line or b"\\uD" in line) and not _encodable(text):  # lone surrogate escapes
            skips.add("invalid_utf8", where(unit, line_no, where_pos))
        else:
            yield text


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
