"""Input files -> raw records (dicts) one work unit at a time, for the record kinds (prompt-completion,
chat, tokens: packer/encode/records.py turns them into ids and a loss mask).

    a.jsonl   {"messages": [{"role": "user", "content": "Hi"}, ...]}\\n   -> ("a.jsonl:1", {"messages": [...]})
    b.parquet  columns prompt, completion                               -> ("b.parquet row 0", {"prompt": ..., "completion": ...})

The units are the ones the text readers plan (byte ranges of JSONL, runs of Parquet row groups, one
Arrow file), read the same way (packer/preprocess/readers/common.py: BOMs, codecs, lines that start in the
unit); a line that is not a JSON object is skipped and counted (malformed_json, invalid_utf8,
too_large, missing_field). A .txt input holds no records: FileError.

`detect_kind` is `--input-kind auto`: the kind a file's first record (JSONL) or its columns
(Parquet, Arrow) show: messages -> chat, input ids -> tokens, prompt and completion ->
prompt-completion, else text.
"""

from __future__ import annotations

import json

import orjson

from packer.encode.records import kind_of_fields
from packer.io import fs
from packer.io.lines import line_blocks
from packer.preprocess.readers import file_errors, jsonl
from packer.preprocess.readers.columns import check_record_columns, column_records
from packer.preprocess.readers.common import UNBOUNDED, FileError, SkipLog, Unit, open_lines, where

BATCH_ROWS = 4096


def read_records(unit: Unit, skips: SkipLog, fields: tuple[str, ...], *, max_doc_bytes: int = UNBOUNDED,
                 fix: str = ""):
    """Yield (where, record) for each record of the unit; `fields` are the columns to read from
    Parquet / Arrow (the first one required: FileError naming `fix` without it)."""
    place = fs.location(unit.path)
    with file_errors(unit):
        if unit.format == "jsonl":
            yield from _jsonl_records(unit, place, skips, max_doc_bytes)
        elif unit.format in ("parquet", "arrow"):
            yield from _table_records(unit, place, fields, fix)
        else:
            raise FileError(unit.path, f"a {unit.format} input holds text, not records; use --input-kind text, "
                                       "or give records as JSONL, Parquet or Arrow")


def _jsonl_records(unit: Unit, place, skips: SkipLog, max_bytes: int):
    f, pos, end, head = open_lines(unit, place)
    with f:
        if jsonl._is_array(unit.path, head):
            if unit.start == 0:
                yield from _array_records(f, unit, skips, max_bytes)
            return
        line_no = 1
        for pos, block in line_blocks(f, pos, max_bytes):
            if pos >= end:
                break
            if block is None:
                skips.add("too_large", where(unit, line_no, pos))
                line_no += 1
                continue
            if pos + len(block) > end:  # keep the lines that start inside the unit
                block = block[: block.find(b"\n", end - pos - 1) + 1 or len(block)]
            for line_no, line in enumerate(block.split(b"\n"), line_no):
                where_pos, pos = pos, pos + len(line) + 1
                if line and not line.isspace():
                    at = where(unit, line_no, where_pos)
                    record = _parse_line(line, at, skips, max_bytes)
                    if record is not None:
                        yield at, record


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
    goes to json, for json's record or json's reason and message (`fast` False: json only)."""
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
    except RecursionError:
        skips.add("malformed_json", f"{at}: nested too deeply")
        return None
    if not isinstance(record, dict):
        skips.add("missing_field", at)
        return None
    return record


def _array_records(f, unit: Unit, skips: SkipLog, max_bytes: int):
    data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileError(unit.path, f"a JSON array over --max-doc-bytes ({max_bytes:,} bytes): an array is read whole; "
                                   "raise the limit with --max-doc-bytes N, or convert the file to JSON Lines")
    try:
        records = json.loads(data.decode("utf-8", "surrogateescape"))
    except (json.JSONDecodeError, RecursionError):
        raise FileError(unit.path, "starts with '[' but is not one JSON array of records") from None
    for i, record in enumerate(records):
        if isinstance(record, dict):
            yield f"{unit.path} record {i}", record
        else:
            skips.add("missing_field", f"{unit.path} record {i}")


def _table_records(unit: Unit, place, fields: tuple[str, ...], fix: str):
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    with fs.open_arrow(place) as f:
        if unit.format == "parquet":
            pf = pq.ParquetFile(f)
            check_record_columns(pf.schema_arrow, fields, unit.path, fix)
            row = sum(pf.metadata.row_group(i).num_rows for i in range(unit.start))
            present = [c for c in fields if c in pf.schema_arrow.names]
            batches = pf.iter_batches(batch_size=BATCH_ROWS, row_groups=range(unit.start, unit.end), columns=present)
        else:
            try:
                reader = ipc.open_file(f)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:
                f.seek(0)
                reader = ipc.open_stream(f)
                batches = iter(reader)
            check_record_columns(reader.schema, fields, unit.path, fix)
            row = 0
        for batch in batches:
            yield from column_records(batch, fields, row, unit.path)
            row += batch.num_rows


def detect_kind(unit: Unit, config) -> str:
    """The input kind of the unit's file, for --input-kind auto (module docstring)."""
    if unit.format == "jsonl":
        first = Unit(unit.index, unit.path, 0, UNBOUNDED, unit.format, unit.compression)
        names = next((set(record) for _, record in _jsonl_records(first, fs.location(unit.path), SkipLog.empty(),
                                                                    config.max_doc_bytes)), set())
    elif unit.format in ("parquet", "arrow"):
        names = set(_schema_names(unit))
    else:
        return "text"
    return kind_of_fields(names, config)


def _schema_names(unit: Unit) -> list[str]:
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    with fs.open_arrow(fs.location(unit.path)) as f:
        if unit.format == "parquet":
            return pq.ParquetFile(f).schema_arrow.names
        try:
            return ipc.open_file(f).schema.names
        except pa.ArrowInvalid:
            f.seek(0)
            return ipc.open_stream(f).schema.names
