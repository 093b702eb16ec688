"""A Parquet text column chunk that may hold a huge value, read page by page by packer itself.

pyarrow reads a column chunk whole: the compressed pages, each page decompressed and the decoded
array side by side (a dictionary page: also a dense copy), 4-5x a 200 MB value. Here each page is
read from the file (never memory-mapped: mapped pages stay in RSS), decompressed, and its values
taken where they lie; a value over HUGE_TEXT_BYTES goes on as a Utf8Text over the page's buffer.

    row group 0 of a.parquet, column "text" (optional, snappy), pages:
        dictionary page  ["before", <200 MB>, "after"]      kept while the chunk is read
        data page        def levels [1, 1, 1], indices [0, 1, 2]
        -> "before", Utf8Text(<200 MB>), "after"   rows numbered, skips counted as columns.value_text says

Only a BYTE_ARRAY column, flat (required or optional) or a leaf of a list (repetition level 1:
its levels are read here, its rows put together by page_levels.py), PLAIN or dictionary-encoded,
in data pages v1 or v2, with a codec pyarrow.decompress knows, whose footer and page headers agree
(pages end where the chunk ends, their values add up to its rows or levels) and one page is over
HUGE_TEXT_BYTES, is read here; any other chunk (deeper nesting, DELTA_* encodings, LZ4 with
Hadoop framing, encrypted: its headers do not parse) is left to pyarrow (`page_chunk` gives None),
before anything of it is read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from packer.io import memory
from packer.preprocess.readers.columns import value_text
from packer.preprocess.readers.common import HUGE_TEXT_BYTES, FileError
from packer.preprocess.readers.parquet import page_headers, page_streams, snappy_pieces

CODECS = {"UNCOMPRESSED": None, "SNAPPY": "snappy", "GZIP": "gzip", "ZSTD": "zstd", "LZ4_RAW": "lz4_raw",
          "BROTLI": "brotli"}  # the footer's name -> pyarrow's
DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY = 0, 2, 3, 8
HEADER_BYTES = 1 << 12  # first read of a page header; doubled while it is cut short
MAX_HEADER_BYTES = 1 << 24  # (statistics can make one long; pyarrow's reader stops at 16 MiB too)
MAX_LIST_DEF = 4  # list<struct<string>>, each optional: list, element, struct, field (page_levels.py)


@dataclass(frozen=True)
class Chunk:
    """A column chunk packer reads itself: its codec (pyarrow's name; None: stored as is), its
    largest definition and repetition levels (0: none stored; a flat optional column: 1 and 0), its
    rows, and each page as (where its body starts in the file, its header)."""

    codec: str | None
    max_def: int
    max_rep: int
    n_rows: int
    pages: tuple


def column_index(meta, field: str) -> int | None:
    """The leaf column of top-level field `field` in the Parquet schema (None: not a flat column)."""
    for j in range(len(meta.schema)):
        if meta.schema.column(j).path == field:
            return j
    return None


def page_chunk(f, meta, group: int, column: int, huge: bool = True) -> Chunk | None:
    """The Chunk of `column` in row group `group` when packer reads it page by page, else None (pyarrow
    does); huge=False: whether or not a page is over HUGE_TEXT_BYTES (a record's other columns)."""
    info = meta.row_group(group).column(column)
    schema = meta.schema.column(column)
    max_def, max_rep = schema.max_definition_level, schema.max_repetition_level
    if ((huge and info.total_uncompressed_size <= HUGE_TEXT_BYTES) or schema.physical_type != "BYTE_ARRAY"
            or not (max_rep == 0 and max_def <= 1 or max_rep == 1 and 1 <= max_def <= MAX_LIST_DEF)
            or info.file_path or info.compression not in CODECS):
        return None
    start = info.data_page_offset
    if info.has_dictionary_page:
        start = info.dictionary_page_offset
        if start is None or not 0 < start < info.data_page_offset:
            return None
    end = start + info.total_compressed_size
    if start < 4 or end > f.size():
        return None
    pages = _scan_pages(f, start, end, max_def, max_rep)
    n_rows = meta.row_group(group).num_rows
    n_values = n_rows if max_rep == 0 else info.num_values  # a list's leaf: one value (level) per element
    if (pages is None or sum(_n_values(h) for _, h in pages) != n_values or info.num_values != n_values
            or (huge and not any(h["uncompressed_page_size"] > HUGE_TEXT_BYTES for _, h in pages))):
        return None
    return Chunk(CODECS[info.compression], max_def, max_rep, n_rows, tuple(pages))


def _scan_pages(f, start: int, end: int, max_def: int, max_rep: int) -> list | None:
    """[(body offset, header)] of the pages in [start, end), or None at anything this module does not read."""
    pages, at = [], start
    while at < end:
        header = _read_header(f, at, end)
        if header is None or not _readable(header[0], max_def, max_rep, first=not pages):
            return None
        header, n = header
        pages.append((at + n, header))
        at += n + header["compressed_page_size"]
    return pages if at == end else None


def _read_header(f, at: int, end: int) -> tuple[dict, int] | None:
    n = HEADER_BYTES
    while True:
        data = f.read_at(min(n, end - at), at)
        try:
            return page_headers.read_page_header(data)
        except page_headers.Truncated:
            if len(data) >= end - at or n >= MAX_HEADER_BYTES:
                return None
            n *= 2
        except ValueError:
            return None


def _readable(header: dict, max_def: int, max_rep: int, first: bool) -> bool:
    """A header whose page this module reads: sizes that make sense, known page type and encodings."""
    kind = header.get("type")
    size, stored = header.get("uncompressed_page_size", -1), header.get("compressed_page_size", -1)
    if size < 0 or stored < 0:
        return False
    if kind == DICTIONARY_PAGE:
        page = header.get("dictionary_page_header", {})
        return first and page.get("encoding") in (PLAIN, PLAIN_DICTIONARY) and page.get("num_values", -1) >= 0
    if kind == DATA_PAGE:
        page = header.get("data_page_header", {})
        levels_ok = ((not max_def or page.get("definition_level_encoding") == RLE)
                     and (not max_rep or page.get("repetition_level_encoding") == RLE))
    elif kind == DATA_PAGE_V2:
        page = header.get("data_page_header_v2", {})
        n_def, n_rep = page.get("definition_levels_byte_length", -1), page.get("repetition_levels_byte_length", -1)
        levels_ok = n_def >= 0 and n_rep >= 0 and n_def + n_rep <= min(size, stored)
        levels_ok = levels_ok and (max_def or n_def == 0) and (max_rep or n_rep == 0)
    else:
        return False
    return levels_ok and page.get("encoding") in (PLAIN, PLAIN_DICTIONARY, RLE_DICTIONARY) and page.get("num_values", -1) >= 0


def _n_values(header: dict) -> int:
    page = header.get("data_page_header") or header.get("data_page_header_v2")
    return page["num_values"] if page else 0


def chunk_texts(f, chunk: Chunk, first_row: int, path: str, skips, max_bytes: int, is_binary: bool):
    """column_texts of the chunk, page by page; each page's buffers are let go before the next is read."""
    for row, value in enumerate(chunk_values(f, chunk, path), first_row):
        if (text := value_text(value, is_binary, f"{path} row {row}", skips, max_bytes)) is not None:
            yield text


def chunk_values(f, chunk: Chunk, path: str):
    """Each row's value of a flat chunk: a memoryview into its page's buffer, or None (null)."""
    for _, defs, values in chunk_pages(f, chunk, path):
        values = iter(values)
        if defs is None:
            yield from values
            continue
        for present in defs.tolist():
            yield next(values) if present else None


def chunk_pages(f, chunk: Chunk, path: str):
    """Each data page of the chunk as (its repetition levels, its definition levels (None where the
    chunk has none), the values present (definition level max_def), memoryviews into the page's buffer)."""
    memory.return_large_buffers()
    dictionary = None
    for at, header in chunk.pages:
        if header["type"] == DICTIONARY_PAGE:
            _, data = _page_data(f, at, header, chunk.codec, 0, path)
            dictionary = _plain_values(data, header["dictionary_page_header"]["num_values"], 0, path)
            continue
        yield _data_page(f, at, header, chunk, dictionary, path)


def _data_page(f, at: int, header: dict, chunk: Chunk, dictionary, path: str):
    """chunk_pages of one data page: v1 holds [4-byte length, repetition levels] [4-byte length,
    definition levels] values, each part there only if its largest level is over 0, all compressed;
    v2 the repetition levels, the definition levels (their lengths in the header), stored as they
    are, then the values, compressed."""
    v2 = header["type"] == DATA_PAGE_V2
    page = header["data_page_header_v2"] if v2 else header["data_page_header"]
    n = page["num_values"]
    codec = chunk.codec if not v2 or page.get("is_compressed", True) else None
    n_rep = page["repetition_levels_byte_length"] if v2 else 0
    n_def = page["definition_levels_byte_length"] if v2 else 0
    levels, data = _page_data(f, at, header, codec, n_rep + n_def, path)
    reps, defs, pos = levels[:n_rep], levels[n_rep:], 0
    if not v2:
        if chunk.max_rep:
            reps, pos = _v1_levels(data, pos, path)
        if chunk.max_def:
            defs, pos = _v1_levels(data, pos, path)
    reps = _rle_hybrid(reps, chunk.max_rep.bit_length(), n, path) if chunk.max_rep else None
    defs = _rle_hybrid(defs, chunk.max_def.bit_length(), n, path) if chunk.max_def else None
    for levels, top in ((reps, chunk.max_rep), (defs, chunk.max_def)):
        if levels is not None and n and int(levels.max()) > top:
            raise FileError(path, "a Parquet level past the column's largest")
    n_present = n if defs is None else int(np.count_nonzero(defs == chunk.max_def))
    if page["encoding"] == PLAIN:
        values = _plain_values(data, n_present, pos, path)
    else:
        if dictionary is None or (n_present and pos >= len(data)):
            raise FileError(path, "a dictionary-encoded Parquet page without its dictionary")
        indices = _rle_hybrid(data[pos + 1:], data[pos], n_present, path) if n_present else np.zeros(0, np.int64)
        if n_present and int(indices.max()) >= len(dictionary):
            raise FileError(path, "a Parquet dictionary index past the dictionary's end")
        values = [dictionary[i] for i in indices.tolist()]
    del data  # the values hold the page's buffer as long as they are used, no longer
    return reps, defs, values


def _page_data(f, at: int, header: dict, codec: str | None, n_levels: int, path: str):
    """(the first n_levels bytes: a v2 page's levels, stored as they are; the rest, decompressed) of a page."""
    import pyarrow as pa

    stored, size = header["compressed_page_size"], header["uncompressed_page_size"]
    if size - n_levels > HUGE_TEXT_BYTES and codec is not None:  # never the whole compressed page beside its output
        data = None
        if codec == "snappy":
            data = snappy_pieces.decompress(f, at + n_levels, stored - n_levels, size - n_levels)
        elif codec in page_streams.CODECS:
            data = page_streams.decompress(f, at + n_levels, stored - n_levels, size - n_levels, codec)
        if data is not None:
            return memoryview(f.read_at(n_levels, at)), memoryview(data)
    body = memoryview(f.read_at(stored, at))
    if len(body) != stored:
        raise FileError(path, "a Parquet page runs past the end of the file")
    if codec is None:
        return body[:n_levels], body[n_levels:]
    levels = bytes(body[:n_levels])  # a copy (small), so the compressed page is let go
    try:
        data = pa.decompress(body[n_levels:], decompressed_size=size - n_levels, codec=codec,
                             memory_pool=pa.system_memory_pool())  # malloc: returned to the system when freed
    except (OSError, ValueError) as e:
        raise FileError(path, f"a Parquet page does not decompress ({codec}: {e})") from None
    return memoryview(levels), memoryview(data)


def _v1_levels(data, pos: int, path: str):
    """(a v1 page's levels at data[pos:]: a 4-byte length, then that many bytes; where what follows starts)."""
    (n,) = _unpack("<I", data, pos, path)
    return data[pos + 4:pos + 4 + n], pos + 4 + n


def _unpack(fmt: str, data, pos: int, path: str) -> tuple:
    if pos + struct.calcsize(fmt) > len(data):
        raise FileError(path, "a Parquet page cut short")
    return struct.unpack_from(fmt, data, pos)


def _plain_values(data, count: int, pos: int, path: str) -> list:
    """`count` PLAIN byte arrays from data[pos:] (each a 4-byte little-endian length, then its bytes), as memoryviews."""
    out, end, unpack = [], len(data), struct.Struct("<I").unpack_from
    for _ in range(count):
        if pos + 4 > end:
            raise FileError(path, "a Parquet page cut short")
        (n,) = unpack(data, pos)
        pos += 4
        if pos + n > end:
            raise FileError(path, "a Parquet value runs past its page")
        out.append(data[pos:pos + n])
        pos += n
    return out


def _rle_hybrid(data, bit_width: int, count: int, path: str) -> np.ndarray:
    """`count` values of Parquet's RLE / bit-packed hybrid (definition levels, dictionary indices):
    runs, each a varint header (low bit 1: header >> 1 groups of 8 values bit-packed, least significant
    bit first; 0: one value repeated header >> 1 times, in ceil(bit_width / 8) bytes).

        02 01 (bit width 1)  ->  [1]      03 05 (bit width 1)  ->  [1, 0, 1, 0, 0, 0, 0, 0]"""
    if bit_width > 32:
        raise FileError(path, f"a Parquet bit width of {bit_width}")
    runs, n, pos, data = [], 0, 0, memoryview(data).cast("B")
    weights = (1 << np.arange(bit_width, dtype=np.int64))
    while n < count:
        header, shift = 0, 0
        while True:
            if pos >= len(data) or shift > 35:
                raise FileError(path, "Parquet levels or indices cut short")
            b = data[pos]
            pos, header, shift = pos + 1, header | (b & 0x7F) << shift, shift + 7
            if not b & 0x80:
                break
        if header & 1:
            n_bytes = (header >> 1) * bit_width
            if pos + n_bytes > len(data):
                raise FileError(path, "Parquet levels or indices cut short")
            bits = np.unpackbits(np.frombuffer(data[pos:pos + n_bytes], np.uint8), bitorder="little")
            run = bits.reshape(-1, bit_width) @ weights if bit_width else np.zeros((header >> 1) * 8, np.int64)
            pos += n_bytes
        else:
            width = (bit_width + 7) // 8
            if pos + width > len(data):
                raise FileError(path, "Parquet levels or indices cut short")
            run = np.full(min(header >> 1, count - n), int.from_bytes(data[pos:pos + width], "little"), np.int64)
            pos += width
        runs.append(run)
        n += len(run)
    return np.concatenate(runs)[:count] if runs else np.zeros(0, np.int64)
