"""Parquet page headers out of Thrift's compact protocol: the fields packer's page reader needs, the rest skipped.

    15 00 15 a8 1f 15 e8 01 2c 15 04 15 00 15 06 15 06 1c 00 00 00     (pyarrow's, for 2 PLAIN values, snappy)
        -> ({"type": 0, "uncompressed_page_size": 2004, "compressed_page_size": 116,
             "data_page_header": {"num_values": 2, "encoding": 0, "definition_level_encoding": 3,
                                  "repetition_level_encoding": 3}}, 21)

A compact-protocol struct is a run of fields, each a byte (high nibble: the field id's step from
the last one, or 0 and a zigzag varint id; low nibble: the type) and its value, up to a 0 byte.
Integers are zigzag varints; a field packer does not ask for is skipped by its type, whatever it
holds (statistics, CRC, a future field).
"""

from __future__ import annotations

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
MAX_DEPTH = 32  # nesting beyond this is not a page header

DATA_PAGE_HEADER = {1: "num_values", 2: "encoding", 3: "definition_level_encoding", 4: "repetition_level_encoding"}
DICTIONARY_PAGE_HEADER = {1: "num_values", 2: "encoding"}
DATA_PAGE_HEADER_V2 = {1: "num_values", 2: "num_nulls", 3: "num_rows", 4: "encoding",
                       5: "definition_levels_byte_length", 6: "repetition_levels_byte_length", 7: "is_compressed"}
PAGE_HEADER = {1: "type", 2: "uncompressed_page_size", 3: "compressed_page_size",
               5: ("data_page_header", DATA_PAGE_HEADER), 7: ("dictionary_page_header", DICTIONARY_PAGE_HEADER),
               8: ("data_page_header_v2", DATA_PAGE_HEADER_V2)}


class Truncated(ValueError):
    """The header runs past the bytes given: read more of the file and parse again."""


def read_page_header(data) -> tuple[dict, int]:
    """(the header's wanted fields, its length in bytes) of the page header at the start of `data`;
    Truncated when `data` ends first, ValueError when it is not a compact-protocol struct."""
    reader = _Reader(memoryview(data).cast("B"))
    header = reader.struct(PAGE_HEADER, 0)
    return header, reader.pos


class _Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise Truncated("page header cut short")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        n, shift = 0, 0
        while True:
            b = self.byte()
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
            if shift > 63:
                raise ValueError("varint longer than 64 bits")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, n: int):
        if n < 0:
            raise ValueError("negative length")
        if self.pos + n > len(self.data):
            raise Truncated("page header cut short")
        self.pos += n

    def struct(self, wanted: dict, depth: int) -> dict:
        """The fields of `wanted` (id -> name, or (name, wanted of the nested struct)) that are present."""
        if depth > MAX_DEPTH:
            raise ValueError("structs nested too deep")
        out, field = {}, 0
        while (head := self.byte()) != STOP:
            kind, step = head & 0x0F, head >> 4
            field = field + step if step else self.zigzag()
            name = wanted.get(field)
            if isinstance(name, tuple) and kind == STRUCT:
                out[name[0]] = self.struct(name[1], depth + 1)
            elif isinstance(name, str) and kind in (TRUE, FALSE, I16, I32, I64):
                out[name] = kind == TRUE if kind in (TRUE, FALSE) else self.zigzag()
            else:
                self.value(kind, depth)
        return out

    def value(self, kind: int, depth: int, in_collection: bool = False):
        """Skip one value of type `kind` (a bool in a list or map is a byte of its own; in a struct, none)."""
        if kind in (TRUE, FALSE):
            if in_collection:
                self.skip(1)
        elif kind == BYTE:
            self.skip(1)
        elif kind in (I16, I32, I64):
            self.varint()
        elif kind == DOUBLE:
            self.skip(8)
        elif kind == BINARY:
            self.skip(self.varint())
        elif kind in (LIST, SET):
            head = self.byte()
            n = self.varint() if head >> 4 == 15 else head >> 4
            for _ in range(n):
                self.value(head & 0x0F, depth + 1, in_collection=True)
        elif kind == MAP:
            n = self.varint()
            if n:
                types = self.byte()
                for _ in range(n):
                    self.value(types >> 4, depth + 1, in_collection=True)
                    self.value(types & 0x0F, depth + 1, in_collection=True)
        elif kind == STRUCT:
            self.struct({}, depth + 1)
        else:
            raise ValueError(f"unknown compact-protocol type {kind}")
