"""Plain text (.txt, optionally .gz/.zst): one document per file, or documents separated by blank lines.

    text_split="file"         the whole file is one document               units: one per file
    text_split="blank-line"   "a\\nb\\n\\n  \\nc\\n" -> ["a\\nb", "c"]        units: byte ranges (uncompressed)

A blank-line unit owns the documents whose first line starts inside [start, end), so any cut
of the file yields every document once. Invalid UTF-8 (raw surrogates included) is skipped as
invalid_utf8, a document of only whitespace as empty_text, and one over max_doc_bytes as
too_large (not held whole). A UTF-8 BOM is dropped; UTF-16/32 text (by its BOM) is decoded
(common.open_lines).

A text file holds no records: `records` refuses it (FileError), and it has no fields (--input-kind
auto reads it as text).
"""

from __future__ import annotations

from packer.io import memory
from packer.io.lines import iter_lines, previous_line_blank
from packer.preprocess.readers.common import (
    HUGE_TEXT_BYTES,
    FileError,
    SkipLog,
    Unit,
    Utf8Text,
    byte_ranges,
    decode,
    is_blank,
    open_lines,
    valid_utf8,
    where,
    whole_file,
)

NAME = "txt"
COMPRESSIBLE = True


def plan(place, unit_bytes: int, *, compression: str | None, text_split: str) -> list[tuple[int, int, int]]:
    if compression is None and text_split == "blank-line":
        return byte_ranges(place, unit_bytes)
    return whole_file(place)


def texts(unit: Unit, place, skips: SkipLog, *, text_field: str, text_split: str, max_doc_bytes: int):
    f, pos, end, _ = open_lines(unit, place, skips.sums)
    with f:
        if pos >= end and unit.start > 0:
            return  # no line starts in this byte range (or its file is UTF-16/32, read by the unit at 0)
        if text_split == "blank-line":
            yield from _paragraph_texts(f, pos, end, unit, skips, max_doc_bytes)
        else:
            yield from _whole_file_text(f, unit, skips, max_doc_bytes)


def records(unit: Unit, place, skips: SkipLog, *, fields: tuple[str, ...], max_doc_bytes: int, fix: str):
    raise FileError(unit.path, f"a {unit.format} input holds text, not records; use --input-kind text, "
                               "or give records as JSONL, Parquet or Arrow")


def field_names(unit: Unit, place, *, max_doc_bytes: int) -> set[str]:
    return set()


def _paragraph_texts(f, pos, end, unit: Unit, skips: SkipLog, max_bytes: int):
    """Documents separated by blank lines; a unit owns those whose first line starts inside it."""
    blank_before = True  # the file's first line (after any BOM) has nothing before it
    if unit.start > 0:  # byte ranges of uncompressed files only
        blank_before = previous_line_blank(f, pos)
        f.seek(pos)
    lines, size, first = None, 0, ""  # lines is None between documents
    for line_no, (pos, line) in enumerate(iter_lines(f, pos, max_bytes), 1):
        blank = line is not None and (not line or line.isspace())
        if lines is None and not blank and blank_before:
            if pos >= end:
                break
            lines, size, first = [], 0, where(unit, line_no, pos)
        elif lines is not None and blank:
            yield from _paragraph(lines, size, first, skips, max_bytes)
            lines = None
        if lines is not None:
            size += max_bytes + 1 if line is None else len(line) + 1
            if size <= max_bytes + 1:
                lines.append(line)
            else:
                lines.clear()  # too large: stop holding it, keep counting
        blank_before = blank
    if lines is not None:
        yield from _paragraph(lines, size, first, skips, max_bytes)


def _paragraph(lines, size, first, skips, max_bytes):
    if size - 1 > max_bytes:
        skips.add("too_large", first)
        return
    text = decode(b"\n".join(lines).rstrip(b"\r"), first, skips)
    if text is not None and is_blank(text):  # lines of Unicode spaces (bytes.isspace knows ASCII only)
        skips.add("empty_text", first)
    elif text is not None:
        yield text


def _whole_file_text(f, unit: Unit, skips: SkipLog, max_bytes: int):
    data = bytearray()  # grown in place: the file's bytes held once, not as chunks and their join
    while len(data) <= max_bytes and (block := f.read(min(16 << 20, max_bytes + 1 - len(data)))):
        data += block
    if len(data) > max_bytes:
        skips.add("too_large", unit.path)
        return
    if len(data) > HUGE_TEXT_BYTES:  # handed on as its bytes (common.Utf8Text), never a whole str
        memory.return_large_buffers()
        if not valid_utf8(data):
            skips.add("invalid_utf8", unit.path)
            return
        text = Utf8Text(data)
    else:
        text = decode(bytes(data), unit.path, skips)
    if text is not None and is_blank(text):
        skips.add("empty_text", unit.path)
    elif text is not None:
        yield text
