"""Input files -> streams of document texts or of records, one work unit at a time, with bad records counted.

The one table of input formats, by the end of the file name (a .gz/.zst after it means that
codec, for the readers that allow one):

    .jsonl .json .ndjson   jsonl.py     one JSON object per line       units: byte ranges (~unit_bytes); compressed: one per file
    .txt                   text.py      one document per file, or blank-line separated (text_split); no records
    .parquet               parquet/     the text column / record columns   units: runs of row groups (~unit_bytes)
    .arrow                 arrow.py     Arrow IPC file or stream (HF save_to_disk data files): one per file

A reader is a module with NAME, COMPRESSIBLE, plan(place, ...), texts(unit, place, ...),
records(unit, place, ...) and field_names(unit, place, ...) (common.Reader): every way of
reading its format; a new format is one module and one line in READERS. read_unit, read_records
and field_names below find a unit's reader. Places are resolved
here, once per file when units are planned and once per unit when it is read: readers open
the place they are given (packer/io/fs.py), never a name.

Skip reasons: malformed_json, invalid_utf8, missing_field, null_text, non_string_text,
empty_text (empty or whitespace only), too_large. A problem with a whole file (unreadable,
corrupt stream, no text column; and, found when units are planned, before any byte is read:
not a regular file, a symlink loop, a name no reader claims) raises FileError naming the file
and the cause, or with on_file_error="skip" the file is left out and listed in files_skipped.
Text files are UTF-8; a byte-order mark is honoured (common.open_lines).
"""

from __future__ import annotations

import contextlib
import os

from packer.io import fs
from packer.preprocess.inputs import OutsideLink, expand_inputs, link_problem  # noqa: F401  (re-exported: readers.expand_inputs)
from packer.preprocess.readers import arrow, jsonl, parquet, text
from packer.preprocess.readers.common import (
    COMPRESSION,
    UNBOUNDED,
    FileError,
    Reader,
    SkipLog,
    Unit,
    cause,
    compressed_unnamed,
)

READERS: dict[str, Reader] = {
    ".jsonl": jsonl,
    ".json": jsonl,
    ".ndjson": jsonl,
    ".txt": text,
    ".parquet": parquet,
    ".arrow": arrow,
}


def _match(path: str) -> tuple[Reader, str | None]:
    """(reader, codec) of a file by its name: 'x/a.JSONL.zst' -> (jsonl, 'zstd')."""
    match = _match_or_none(path)
    if match is None:
        raise ValueError(f"unsupported input format: {fs.redact(path)} ({_unsupported_fix()})")
    return match


def _match_or_none(path: str) -> tuple[Reader, str | None] | None:
    if fs.is_uri(path):
        path = path.split("?", 1)[0]  # s3://b/a.jsonl?region=x: the name ends before the query
    name = path.rsplit("/", 1)[-1].lower()
    compression = None
    for suffix, codec in COMPRESSION.items():
        if name.endswith(suffix):
            name, compression = name[: -len(suffix)], codec
            break
    for suffix, reader in READERS.items():
        if name.endswith(suffix) and (compression is None or reader.COMPRESSIBLE):
            return reader, compression
    return None


def _not_readable(path: str, place) -> str | None:
    """Why a listed file cannot be planned before any byte of it is read, or None: not a regular
    file (a FIFO would block its reader forever), a symlink loop (listed as the link), a link out
    of its input directory (inputs.OutsideLink), or a name
    no reader claims."""
    if isinstance(path, OutsideLink):
        return (f"a symbolic link to {path.target}, outside the input directory {path.root}: not followed (name "
                "the target as an input to include it, or remove the link)")
    if (why := link_problem(path)) is not None:  # a loop, a chain too deep, a link to nothing
        return why
    kind = fs.not_regular(place)
    if kind == "directory":  # inputs.py lists a link that leads back to its own ancestor as itself
        return (f"symlink loop: it leads back to {os.path.realpath(path)}, a directory above it "
                "(remove the link, or list the inputs without it)")
    if kind is not None:
        return (f"a {kind}, not a regular file: never opened (packer reads inputs by byte ranges and reads "
                "them again to resume; copy it to a file first)")
    if _match_or_none(path) is None:
        return f"unsupported input format ({_unsupported_fix()})"
    return None


def _supported() -> str:
    """'.jsonl/.json/.ndjson, .txt, each optionally .gz/.zst, .parquet, .arrow', from the tables."""
    suffixes: dict = {}
    for suffix, reader in READERS.items():
        suffixes.setdefault(reader, []).append(suffix)
    codecs: dict = {}
    for suffix, codec in COMPRESSION.items():
        codecs.setdefault(codec, suffix)
    compressible = ["/".join(s) for r, s in suffixes.items() if r.COMPRESSIBLE]
    if compressible:
        compressible[-1] += f", each optionally {'/'.join(codecs.values())}"
    return ", ".join(compressible + ["/".join(s) for r, s in suffixes.items() if not r.COMPRESSIBLE])


def _unsupported_fix() -> str:
    return f"supported: {_supported()}, HF save_to_disk directories; select files with a glob"


def file_format(path: str) -> tuple[str, str | None]:
    """'a.jsonl.zst' -> ('jsonl', 'zstd'); unsupported names raise ValueError."""
    reader, compression = _match(path)
    return reader.NAME, compression


def reader_for(fmt: str) -> Reader:
    """The reader of a `Unit.format`."""
    for reader in READERS.values():
        if reader.NAME == fmt:
            return reader
    raise ValueError(f"no reader named {fmt!r} (readers: {', '.join(sorted({r.NAME for r in READERS.values()}))})")


def plan_units(files, unit_bytes: int, *, text_split: str = "file", skipped_files: list | None = None) -> list[Unit]:
    """Cut each file into units. A file that cannot be planned (unreadable, not a regular file, a
    symlink loop, an unsupported name) raises FileError, or, when `skipped_files` is a list, is
    appended there as {"path", "error"} and left out."""
    import pyarrow as pa

    units = []
    for path in files:
        place = fs.location(path)
        try:
            why = _not_readable(path, place)
            if why is not None:
                raise FileError(path, why)
            reader, compression = _match(path)
            if compression is None and reader.COMPRESSIBLE and (why := compressed_unnamed(path, place)):
                raise FileError(path, why)
            planned = reader.plan(place, unit_bytes, compression=compression, text_split=text_split)
        except (FileError, OSError, pa.ArrowException) as e:
            why = e.cause if isinstance(e, FileError) else cause(e)
            if skipped_files is None:
                raise FileError(path, why) from None
            skipped_files.append({"path": path, "error": why})
            continue
        for start, end, size in planned:
            units.append(Unit(len(units), path, start, end, reader.NAME, compression, size))
    return units


def read_unit(unit: Unit, skips: SkipLog, *, text_field: str = "text", text_split: str = "file",
              max_doc_bytes: int = UNBOUNDED, sums=None):
    """Yield the text of each valid document of the unit, in file order; count the rest in `skips`;
    with `sums` (packer/preprocess/changed.InputSum), hash the stored bytes the reader reads into it.

    Problems with the file itself (unreadable, corrupt or truncated stream, no text column)
    raise FileError; bad records never do (unless skips.strict)."""
    reader = reader_for(unit.format)
    skips.sums = sums  # a reader that does not hash leaves it empty: the unit has no record
    with file_errors(unit):
        yield from reader.texts(unit, fs.location(unit.path), skips, text_field=text_field, text_split=text_split,
                                max_doc_bytes=max_doc_bytes)


def read_records(unit: Unit, skips: SkipLog, fields: tuple[str, ...], *, max_doc_bytes: int = UNBOUNDED,
                 fix: str = ""):
    """Yield (where, record) for each record of the unit, in file order, for the record kinds
    (packer/encode/records.py): a JSONL object whole, a table's `fields` columns (the first one
    required: FileError naming `fix` without it). What is no record is counted in `skips`; a text
    file holds none (FileError).

        a.jsonl    {"messages": [{"role": "user", "content": "Hi"}, ...]}\\n  -> ("a.jsonl:1", {"messages": [...]})
        b.parquet  columns prompt, completion                          -> ("b.parquet row 0", {"prompt": ..., "completion": ...})
    """
    reader = reader_for(unit.format)
    with file_errors(unit):
        yield from reader.records(unit, fs.location(unit.path), skips, fields=fields, max_doc_bytes=max_doc_bytes,
                                  fix=fix)


def field_names(unit: Unit, *, max_doc_bytes: int = UNBOUNDED) -> set[str]:
    """The fields of the unit's file (the first record's keys, a table's columns; none for text):
    what --input-kind auto reads the kind from (packer/encode/records.py kind_of_fields)."""
    reader = reader_for(unit.format)
    with file_errors(unit):
        return set(reader.field_names(unit, fs.location(unit.path), max_doc_bytes=max_doc_bytes))


@contextlib.contextmanager
def file_errors(unit: Unit):
    """Problems reading the unit's file (OSError, a truncated stream, a damaged Arrow/Parquet file)
    as one FileError naming it; a FileError passes as it is. the one rule of read_unit, read_records and field_names."""
    import pyarrow as pa

    try:
        yield
    except FileError:
        raise
    except (OSError, EOFError, pa.ArrowException) as e:
        why = cause(e)
        if unit.compression and not isinstance(e, (PermissionError, FileNotFoundError, IsADirectoryError)):
            why = f"corrupt or truncated {unit.compression} stream ({e})"
        raise FileError(unit.path, why) from None


def input_descriptions(files) -> list[dict]:
    return [{"path": fs.redact(str(f)), "bytes": _size_or_none(f)} for f in files]  # no credentials


def _size_or_none(path: str) -> int | None:
    try:
        return None if fs.not_regular(path) else fs.size(path)
    except OSError:  # a file skipped as unreadable (--on-file-error skip)
        return None
