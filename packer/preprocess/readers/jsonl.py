"""JSON Lines (.jsonl .json .ndjson, optionally .gz/.zst): one JSON object per line, its text field a
document (`texts`), or the object itself a record (`records`: prompt/completion, chat, tokens).

    {"text": "first doc", "id": 0}\\n          -> "first doc"       records: ("a.jsonl:1", {"text": "first doc", "id": 0})
    {"text": null}\\n                          -> skipped: null_text
    {"text": \\n                               -> skipped: malformed_json
    {"text": "a \\xed\\xa0\\x80 b"}\\n                -> skipped: invalid_utf8 (raw surrogate bytes, CESU-8)
    {"text": "  "}\\n                         -> skipped: empty_text (whitespace only, as in .txt)

Units: byte ranges of ~unit_bytes for an uncompressed file (a unit owns every line that
*starts* inside [start, end)), one unit per compressed file. Lines are read in 1 MiB blocks
and a line longer than max_doc_bytes is never held whole: it is skipped as `too_large`.

A .json file whose text starts with "[" is one JSON array of records instead,
`[{"text": "a"}, {"text": "b"}]`: read whole by its first unit (so the whole file must fit in
max_doc_bytes, else it fails as a file) and each element counted as a line would be.

One line loop serves both ways of reading (`_unit_blocks`: the lines that start in the unit, in
blocks). Texts take a block of plain records through pyarrow's JSON reader at once; anything else,
and every record, goes line by line (`_line_records`: orjson where it reads as json does, else json).
"""

from __future__ import annotations

import json
import re

import orjson

from packer.io import memory
from packer.io.lines import line_blocks
from packer.preprocess.readers import huge_json
from packer.preprocess.readers.common import (
    COMPRESSION,
    HUGE_TEXT_BYTES,
    UNBOUNDED,
    FileError,
    SkipLog,
    Unit,
    Utf8Text,
    byte_ranges,
    encodable,
    is_blank,
    open_lines,
    valid_utf8,
    where,
    whole_file,
)

NAME = "jsonl"
COMPRESSIBLE = True


def plan(place, unit_bytes: int, *, compression: str | None, text_split: str) -> list[tuple[int, int, int]]:
    return whole_file(place) if compression else byte_ranges(place, unit_bytes)


def texts(unit: Unit, place, skips: SkipLog, *, text_field: str, text_split: str, max_doc_bytes: int):
    f, pos, end, head = open_lines(unit, place, skips.sums)
    with f:
        if _is_array(unit.path, head):
            if unit.start == 0:  # later byte ranges of an array file read nothing
                for at, item in _array_items(f, unit, max_doc_bytes):
                    text, reason = _record_text(item, text_field)
                    if reason:
                        skips.add(reason, at)
                    else:
                        yield text
        elif pos < end:
            yield from _jsonl_texts(f, pos, end, unit, text_field, skips, max_doc_bytes)


def records(unit: Unit, place, skips: SkipLog, *, fields: tuple[str, ...], max_doc_bytes: int, fix: str):
    """(where, record) of each JSON object of the unit in file order, every field of it (`fields` and
    `fix` name the columns of the table readers); a line that is no object is counted in `skips`."""
    f, pos, end, head = open_lines(unit, place)
    with f:
        if _is_array(unit.path, head):
            if unit.start == 0:
                for at, item in _array_items(f, unit, max_doc_bytes):
                    if isinstance(item, dict):
                        yield at, item
                    else:
                        skips.add("missing_field", at)
        elif pos < end:
            for pos, line_no, held in _unit_blocks(f, pos, end, unit, skips, max_doc_bytes):
                if _one_huge_line(held[0]):
                    memory.return_large_buffers()
                    if (record := huge_json.huge_record(held[0])) is not None:  # long strings as Utf8Text
                        held.clear()
                        yield where(unit, line_no, pos), record
                        del record  # not held while the next line is read
                        continue
                for at, record, _ in _line_records(held.pop(), pos, line_no, unit, skips, max_doc_bytes):
                    yield at, record


def field_names(unit: Unit, place, *, max_doc_bytes: int) -> set[str]:
    """The fields of the file's first record (every unit of a file gets the same answer), for --input-kind auto."""
    first = Unit(unit.index, unit.path, 0, UNBOUNDED, unit.format, unit.compression)
    found = records(first, place, SkipLog.empty(), fields=(), max_doc_bytes=max_doc_bytes, fix="")
    return next((set(record) for _, record in found), set())


def _unit_blocks(f, pos: int, end: int, unit: Unit, skips: SkipLog, max_bytes: int):
    """(pos, line_no, [block]) for the lines that start inside the unit, in blocks of whole lines; a
    line over max_bytes is counted too_large and never held. The caller takes the block out of its
    list: then the caller's is its only reference (a huge line is freed as soon as it is parsed)."""
    line_no = 1
    for pos, block in line_blocks(f, pos, max_bytes):
        if pos >= end:
            break
        if block is None:
            skips.add("too_large", where(unit, line_no, pos))
            line_no += 1
            continue
        if pos + len(block) > end:  # keep the lines that start inside the unit
            cut = block.find(b"\n", end - pos - 1) + 1 or len(block)
            block = block[:cut] if cut < len(block) else block  # (a bytearray's slice would copy it)
        n_lines = block.count(b"\n")
        held = [block]
        del block
        yield pos, line_no, held
        line_no += n_lines


def _jsonl_texts(f, pos, end, unit: Unit, field: str, skips: SkipLog, max_bytes: int):
    for pos, line_no, held in _unit_blocks(f, pos, end, unit, skips, max_bytes):
        if _one_huge_line(held[0]):
            yield from _huge_line(held, pos, line_no, unit, field, skips, max_bytes)  # it takes the only reference
            continue
        block = held.pop()
        texts = _parse_block(block, field, max_bytes)
        if texts is None:
            yield from _parse_lines(block, pos, line_no, unit, field, skips, max_bytes)
        else:
            yield from texts


def _one_huge_line(block) -> bool:
    return len(block) > HUGE_TEXT_BYTES and block.count(b"\n", 0, len(block) - 1) == 0


def _parse_block(block: bytes, field: str, max_bytes: int, as_column: bool = False) -> list[str] | None:
    """Fast path: pyarrow's JSON reader over a block of lines, ~3x faster than json.loads per line
    (3 MB of sample JSONL: 11 ms against 34 ms of CPU, 2026-11-29). None when any line might need
    the per-line path (anything it would skip or count), which then decides line by line.
    `as_column`: the Arrow column of texts instead of the list, without the whitespace check
    (a huge line: its bytes are freed before its text is made)."""
    import pyarrow as pa
    import pyarrow.json as pj

    if len(block) > max_bytes and _longest_line(block) > max_bytes:
        return None
    n_body = len(block) - block.endswith(b"\n")  # the block without its last newline (never sliced: a copy)
    if not n_body or block[:1].isspace() or _LINE_STARTS_BLANK.search(block):
        return None  # a blank line (or one starting blank): rows would not match lines one to one
    if not as_column and not block.isascii() and not valid_utf8(block):
        return None  # the per-line path rejects bad bytes anywhere in a line
    try:
        table = pj.read_json(
            pa.py_buffer(block),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(block) + 1),
            parse_options=pj.ParseOptions(explicit_schema=pa.schema([(field, pa.string())]),
                                          unexpected_field_behavior="ignore"),
            # a huge line: malloc, which hands a freed buffer back at once (mimalloc keeps it cached)
            memory_pool=pa.system_memory_pool() if as_column else None,
        )
    except (pa.ArrowException, UnicodeDecodeError):
        return None
    column = table.column(0)
    if table.num_rows != block.count(b"\n", 0, n_body) + 1:
        return None  # two objects on one line
    if column.null_count or any(_has_empty(chunk) for chunk in column.chunks):
        return None  # missing, null or empty text
    if as_column:
        return column
    texts = column.to_pylist()
    if any(map(str.isspace, texts)):  # stops at a text's first non-space: ~free
        return None  # whitespace-only text
    return texts


def _has_empty(strings) -> bool:
    """Whether a string array (pa.string(), no nulls) holds an empty string: two equal offsets in a
    row. numpy, not pyarrow.compute, whose import alone cost a build ~0.06 s."""
    import numpy as np

    offsets = np.frombuffer(strings.buffers()[1], np.int32)[strings.offset: strings.offset + len(strings) + 1]
    return bool((offsets[1:] == offsets[:-1]).any())


def _huge_line(held: list, pos: int, line_no: int, unit: Unit, field: str, skips: SkipLog, max_bytes: int):
    """One line over HUGE_TEXT_BYTES (`held` = [its bytes], taken from the caller) -> its text as a
    Utf8Text. Its long strings decoded where they lie (huge_json: the line is the only copy of the
    document); else over the Arrow value pyarrow parses, the line's bytes freed before (two copies
    while it is parsed); anything the fast path would not take goes the per-line way."""
    line = held.pop()
    memory.return_large_buffers()
    record = huge_json.huge_record(line, keys={field})
    if record is not None:
        del line
        text, reason = _record_text(record, field, may_hold_surrogates=False)  # huge_json refuses \\ud escapes
        if reason:
            skips.add(reason, where(unit, line_no, pos))
        else:
            yield text
        return
    column = None
    if b"\\ud" not in line and b"\\uD" not in line and (line.isascii() or valid_utf8(line)):  # \\ud: per line
        column = _parse_block(line, field, max_bytes, as_column=True)
    if column is None or column.num_chunks != 1:
        yield from _parse_lines(line, pos, line_no, unit, field, skips, max_bytes)
        return
    del line
    value = column.chunk(0)[0]
    del column
    text = Utf8Text(value.as_buffer())
    if is_blank(text):
        skips.add("empty_text", where(unit, line_no, pos))
    else:
        yield text


# a line that is blank or starts blank (bytes.isspace's six); one regex pass: six `in` searches cost
# 20x more (10.7 against 0.55 ms a 1.9 MB block, 2026-12-04), a third of reading a unit
_LINE_STARTS_BLANK = re.compile(rb"\n[\n \t\r\x0b\x0c]")


def _longest_line(block: bytes) -> int:
    import numpy as np

    ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
    bounds = np.concatenate([[-1], ends, [len(block)]])
    return int(np.diff(bounds).max()) - 1


def _parse_lines(block: bytes, pos: int, line_no: int, unit: Unit, field: str, skips: SkipLog, max_bytes: int):
    """The per-line path of texts: each line's record, then its text; every problem counted by reason."""
    for at, record, line in _line_records(block, pos, line_no, unit, skips, max_bytes):
        text, reason = _record_text(record, field, b"\\ud" in line or b"\\uD" in line)
        if reason:
            skips.add(reason, at)
        else:
            yield text


def _line_records(block: bytes, pos: int, line_no: int, unit: Unit, skips: SkipLog, max_bytes: int):
    """(where, record, line) of each non-blank line of a block that is a JSON object; the others counted."""
    for line_no, line in enumerate(block.split(b"\n"), line_no):
        where_pos, pos = pos, pos + len(line) + 1
        if line and not line.isspace():
            at = where(unit, line_no, where_pos)
            record = _parse_line(line, at, skips, max_bytes)
            if record is not None:
                yield at, record, line


_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # translate table: each digit -> "0", else " "
_MAX_NESTING = 256  # fewer brackets than this nest less deep than json's recursion limit refuses (orjson's differs)


def _orjson_reads_as_json(line: bytes) -> bool:
    """No 19 digits in a row (an integer past 64 bits, which orjson reads as a float, json as an
    int) and few brackets: then orjson reads the line as json does, or refuses it (NaN, a lone
    surrogate, bad UTF-8 or JSON). A pass over the line, 0.3 ms a MB (2026-12-01)."""
    return line.count(b"[") + line.count(b"{") < _MAX_NESTING and b"0" * 19 not in line.translate(_DIGITS)


def _parse_line(line: bytes, at: str, skips: SkipLog, max_bytes: int, fast: bool = True):
    """The line's record (a dict), or None with the skip counted. Parsed by orjson where it reads as
    json does (2x json's speed on chat records, 2026-12-01); what it refuses or reads as no object
    goes to json, for json's record or json's reason and message (`fast` False: json only). json
    decodes strictly first: json.loads(bytes) would let CESU-8 surrogates through."""
    if len(line) > max_bytes:
        skips.add("too_large", at)
        return None
    if fast and _orjson_reads_as_json(line):
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            record = None  # json says why, or reads it (NaN, a lone surrogate)
        if isinstance(record, dict):
            return record
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        skips.add("invalid_utf8", at)
        return None
    except json.JSONDecodeError as e:
        skips.add("malformed_json", f"{at}: {e.msg}")
        return None
    except RecursionError:  # e.g. a line of 100,000 "["
        skips.add("malformed_json", f"{at}: nested too deeply")
        return None
    if not isinstance(record, dict):
        skips.add("missing_field", at)
        return None
    return record


_MISSING = object()


def _record_text(record, field: str, may_hold_surrogates: bool = True) -> tuple[str | None, str | None]:
    """(text, None) of a usable record, else (None, the skip reason). A lone surrogate (from a
    \\ud800 escape) cannot be encoded, so it is invalid_utf8 like a bad byte."""
    text = record.get(field, _MISSING) if isinstance(record, dict) else _MISSING
    if text is _MISSING:
        return None, "missing_field"
    if text is None:
        return None, "null_text"
    if not isinstance(text, (str, Utf8Text)):  # Utf8Text: a long string of a huge line (huge_json)
        return None, "non_string_text"
    if is_blank(text):
        return None, "empty_text"
    if may_hold_surrogates and not encodable(text):
        return None, "invalid_utf8"
    return text, None


def _is_array(path: str, head: bytes) -> bool:
    """A .json file (optionally .gz/.zst) whose text starts with '['."""
    name = path.split("?", 1)[0].lower() if "://" in path else path.lower()
    for suffix in COMPRESSION:
        name = name.removesuffix(suffix)
    return name.endswith(".json") and head.lstrip()[:1] == b"["


def _array_items(f, unit: Unit, max_bytes: int):
    """(where, element) of a file holding one JSON array, held whole: at most max_bytes of it."""
    chunks, n = [], 0
    while n <= max_bytes and (chunk := f.read(min(16 << 20, max_bytes + 1 - n))):
        chunks.append(chunk)
        n += len(chunk)
    if n > max_bytes:
        raise FileError(unit.path, f"a JSON array over --max-doc-bytes ({max_bytes:,} bytes): an array is read whole; "
                                   "raise the limit with --max-doc-bytes N, or convert the file to JSON Lines "
                                   "(jq -c '.[]' FILE > FILE.jsonl)")
    data = b"".join(chunks).decode("utf-8", "surrogateescape")  # a bad byte in a text: that record is invalid_utf8
    try:
        items = json.loads(data)
    except (json.JSONDecodeError, RecursionError) as e:
        why = f"{e.msg} at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else "nested too deeply"
        raise FileError(unit.path, f"starts with '[' but is not one JSON array ({why}); a .json input is JSON Lines "
                                   "or one array of records") from None
    for i, item in enumerate(items):
        yield f"{unit.path} record {i}", item
