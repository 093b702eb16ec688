"""What every reader shares: the work unit, the skip log, the file error, and opening a unit's bytes.

    Unit(3, "a.jsonl", 0, 65536)                       bytes [0, 65536) of a.jsonl
    Unit(7, "b.parquet", 2, 3, "parquet", size=1<<20)  row group 2 of b.parquet
    Unit(9, "c.jsonl.zst", 0, UNBOUNDED, "jsonl", "zstd")  the whole of a compressed file

A compressed file is one unit (a stream cannot be entered in the middle); its first bytes are
checked against the codec its name claims before it is read.
"""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Protocol

from packer.io import fs
from packer.io.lines import Joined, Utf8Stream, bom_encoding, first_line_start
from packer.io.utf8 import HUGE_TEXT_BYTES, Utf8Text, encodable, is_blank, valid_utf8  # noqa: F401  (readers take them from here)

SPAN_NAMES = {"parquet": "row groups"}  # Unit.format -> what its start and end count (else bytes)
MAX_EXAMPLES = 5  # skipped-record examples kept per unit
COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
MAGIC = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd"}
# Compressed data in a file whose name says none (a .jsonl that is gzip data would read as lines of
# binary, each skipped as invalid_utf8): the codec by its first bytes, and the name to give it. No
# UTF-8 text starts with gzip's, zstd's or xz's bytes (0x8b, 0xb5 and 0xfd cannot begin a UTF-8
# character); bzip2's "BZh9" is ASCII, so its first block's magic (pi's digits) is asked for too.
NAMED_MAGIC = (("gzip", b"\x1f\x8b", "name it {name}.gz"), ("zstd", b"\x28\xb5\x2f\xfd", "name it {name}.zst"),
               ("bzip2", b"BZh", "decompress it (bunzip2), or recompress it as .gz or .zst"),
               ("xz", b"\xfd7zXZ\x00", "decompress it (unxz), or recompress it as .gz or .zst"))
UNBOUNDED = 1 << 62  # the end of a unit that reads its file to the end
HEAD_BYTES = 4096  # read at a file's start: its BOM, and (.json) whether it is one JSON array


@dataclass(frozen=True)
class Unit:
    """One piece of work: bytes [start, end) of a file, or row groups [start, end) of a Parquet file.

    `index` numbers units globally; `size` is the unit's approximate byte count (progress only).
    `path` is the file's name as the inputs gave it (a URI keeps its query): it is pickled to
    workers and written to counters; a reader gets it resolved, once per unit, as a place."""

    index: int
    path: str
    start: int
    end: int
    format: str = "jsonl"
    compression: str | None = None
    size: int = -1

    @property
    def span(self) -> str:
        """What of its file the unit covers, for messages: 'bytes 0-65536', 'whole file', 'row groups 2-3'."""
        if self.end >= UNBOUNDED:
            return "whole file"
        return f"{SPAN_NAMES.get(self.format, 'bytes')} {self.start}-{self.end}"


class FileError(ValueError):
    """A whole file cannot be read: `str(e)` is one line naming the file and the cause."""

    def __init__(self, path: str, cause: str):
        super().__init__(path, cause)
        self.path, self.cause = path, cause

    def __str__(self):
        return f"{fs.redact(self.path)}: {fs.redact_text(self.cause)}; {SKIP_FILES_HINT}"


SKIP_FILES_HINT = "--on-file-error skip would leave the file out and list it"
FIXES = {"too_large": "longer than --max-doc-bytes (raise the limit with --max-doc-bytes N)"}  # reason -> fix, in examples


@dataclass
class SkipLog:
    """Skipped records of one unit: counts by reason and the first few examples; and, in `sums` when
    set (packer/preprocess/changed.InputSum), what the reader read of the file, hashed while it reads.

    With strict=True the first skip raises ValueError instead (the run stops there)."""

    counts: Counter
    examples: list
    strict: bool = False
    sums: object = None

    @classmethod
    def empty(cls, strict: bool = False) -> "SkipLog":
        return cls(Counter(), [], strict)

    def add(self, reason: str, where: str):
        where = fs.redact_text(where)  # names the file: no credentials from its URI
        if reason in FIXES:
            where = f"{where}: {FIXES[reason]}"
        if self.strict:
            raise ValueError(f"{where}: {reason} (--strict stops at the first bad record; "
                             "without it bad records are skipped and counted)")
        self.counts[reason] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append({"where": where, "reason": reason})


class Reader(Protocol):
    """What one input family does (a module of this package is one): `NAME` is `Unit.format`,
    `COMPRESSIBLE` says whether a .gz/.zst variant of its suffix exists. Every way of reading the
    format is the reader's: documents (`texts`), records (`records`) and the fields --input-kind
    auto chooses by (`field_names`)."""

    NAME: str
    COMPRESSIBLE: bool

    def plan(self, place, unit_bytes: int, *, compression: str | None, text_split: str) -> list[tuple[int, int, int]]:
        """(start, end, size) of each unit of one file."""

    def texts(self, unit: Unit, place, skips: SkipLog, *, text_field: str, text_split: str,
              max_doc_bytes: int) -> Iterator[str]:
        """The unit's valid documents in file order; every other record counted in `skips`, and, when
        `skips.sums` is set, every stored byte read hashed into it as it is read."""

    def records(self, unit: Unit, place, skips: SkipLog, *, fields: tuple[str, ...], max_doc_bytes: int,
                fix: str) -> Iterator[tuple[str, dict]]:
        """(where, record) of each record of the unit in file order, for the record kinds
        (packer/encode/records.py); what is no record counted in `skips`. A table reads the columns
        `fields` (the first one required: FileError naming `fix` without it); a format that holds
        no records raises FileError. Nothing is hashed (skips.sums is left alone)."""

    def field_names(self, unit: Unit, place, *, max_doc_bytes: int) -> set[str]:
        """The fields of the unit's file (a table's columns, the first record's keys; none for
        text), the same for every unit of the file: what --input-kind auto chooses the kind by
        (packer/encode/records.py kind_of_fields)."""


def whole_file(place) -> list[tuple[int, int, int]]:
    return [(0, UNBOUNDED, fs.size(place))]


def byte_ranges(place, unit_bytes: int) -> list[tuple[int, int, int]]:
    """[start, end) ranges of `unit_bytes` covering the file (one empty range for an empty file)."""
    size = fs.size(place)
    return [(s, min(s + unit_bytes, size), min(unit_bytes, size - s)) for s in range(0, max(size, 1), unit_bytes)]


def open_lines(unit: Unit, place, sums=None):
    """(stream, pos, end, head): the unit's text as UTF-8 bytes, the stream positioned at `pos`, the
    first line that starts in the unit; the unit owns the lines that start before `end`, counted
    in the stream's own bytes; `head` is the file's first bytes of text (about HEAD_BYTES).
    With `sums` (packer/preprocess/changed.InputSum), every stored byte read is hashed into it.

    A compressed file is decompressed from 0 after checking its codec's magic bytes. A UTF-8
    byte-order mark is dropped (the first line starts after it, and still belongs to the unit
    at 0). A UTF-16/32 file (by its BOM) is decoded to UTF-8 while read, whole, by the unit at
    byte 0; its other units read nothing (byte ranges of UTF-16 cannot be cut at newlines)."""
    if unit.compression is not None:
        _check_magic(unit, place)
    f = fs.open_stream(place, unit.compression) if sums is None else _open_hashed(place, unit.compression, sums)
    try:
        head = f.read(HEAD_BYTES)
        encoding, bom = bom_encoding(head)
        if unit.start > 0:  # a later byte range of an uncompressed file
            if encoding != "utf-8":
                f.close()
                return io.BytesIO(), unit.start, unit.start, b""
            return f, first_line_start(f, unit.start), unit.end, head[bom:]
        if unit.compression is None:
            f.seek(bom)
        else:
            f = Joined(head[bom:], f)
        if encoding != "utf-8":
            return Utf8Stream(f, encoding), 0, UNBOUNDED, head[bom:].decode(encoding, "ignore").encode("utf-8", "replace")
        end = UNBOUNDED if unit.compression else max(unit.end, bom + 1) if bom else unit.end
        return f, bom, end, head[bom:]
    except BaseException:
        f.close()
        raise


def _open_hashed(place, compression: str | None, sums):
    """fs.open_stream's stream, its stored bytes hashed into `sums` as they are read (below the
    decompressor for a .gz/.zst file)."""
    import pyarrow as pa

    from packer.preprocess.changed import HashingReader

    sums.file_bytes = fs.size(place)
    raw = HashingReader(place.open("rb"), sums)
    if compression is None:
        return raw
    return pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), compression)


def compressed_unnamed(path: str, place) -> str | None:
    """Why a file whose name says no compression cannot be read as text: its first bytes are a
    codec's ("a.jsonl is gzip data: name it a.jsonl.gz"), or None."""
    with place.open("rb") as raw:
        head = raw.read(10)
    for codec, magic, fix in NAMED_MAGIC:
        if head.startswith(magic) and (codec != "bzip2" or (head[3:4].isdigit() and head[4:10] == b"1AY&SY")):
            name = path.rsplit("/", 1)[-1].split("?", 1)[0]
            return f"{codec} data (its name says no compression): {fix.format(name=name)}"
    return None


def _check_magic(unit: Unit, place):
    with place.open("rb") as raw:
        head = raw.read(4)
    for codec, magic in MAGIC.items():
        if head.startswith(magic) and codec != unit.compression:
            raise FileError(unit.path, f"named as {unit.compression} but it is {codec} data (rename it)")
    if head and not head.startswith(MAGIC[unit.compression]):
        raise FileError(unit.path, f"not {unit.compression} data (bad magic bytes {head.hex()})")


def where(unit: Unit, line_no: int, pos: int) -> str:
    # Line numbers are known only from the start of a file; later byte ranges say the byte.
    return f"{unit.path}:{line_no}" if unit.start == 0 else f"{unit.path}@byte {pos}"


def decode(data: bytes, where: str, skips: SkipLog) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        skips.add("invalid_utf8", where)
        return None


def cause(e: BaseException) -> str:
    """An OSError or Arrow error as one line of text, without credentials."""
    if isinstance(e, PermissionError):
        return "permission denied (cannot read the file)"
    if isinstance(e, (FileNotFoundError, IsADirectoryError)):
        return "cannot open the file (it is missing or not a regular file)"
    return fs.redact_text(f"{type(e).__name__}: {e}".replace("\n", " "))
