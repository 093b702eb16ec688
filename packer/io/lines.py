"""Whole lines out of a binary stream in ~1 MiB blocks, with memory bounded whatever the line length.

    b'{"a":1}\n{"b":2}\n{"c"'  ->  (0, b'{"a":1}\n{"b":2}\n'), then the rest once its newline arrives

A line longer than max_bytes is reported as (pos, None) and dropped while it streams past,
so a 300 MB line costs one block of memory, not 300 MB. Positions are byte offsets in the file.

A byte-order mark at a file's start names its encoding (`bom_encoding`): UTF-8's is dropped,
UTF-16/32 text is read through `Utf8Stream`, which hands out the same text as UTF-8 bytes:

    b'\xff\xfeh\x00i\x00\n\x00'  (UTF-16-LE, BOM)  ->  b'hi\n'
"""

from __future__ import annotations

import codecs

BLOCK_BYTES = 1 << 20
UTF8_BOM = b"\xef\xbb\xbf"
BOMS = (  # longest first: a UTF-32-LE mark starts with UTF-16-LE's
    (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe\x00\x00", "utf-32-le"), (UTF8_BOM, "utf-8"),
    (b"\xfe\xff", "utf-16-be"), (b"\xff\xfe", "utf-16-le"),
)


def line_blocks(f, pos: int, max_bytes: int):
    """Yield (pos, block): about BLOCK_BYTES of whole lines (only the file's last line may lack its
    newline), or (pos, None) standing for one line longer than max_bytes, never held whole.

    A line longer than one read is gathered in place (a bytearray grown read by read: no list of
    reads and their join side by side) and comes as a block of its own, which this generator does
    not keep: a caller that drops it frees the only copy. Blocks are bytes or bytearray."""
    pending, skipped, skipping = bytearray(), 0, False  # the unfinished line at the end of the last read
    while data := f.read(BLOCK_BYTES):
        if skipping:
            i = data.find(b"\n")
            if i < 0:
                skipped += len(data)
                continue
            yield pos, None
            pos += skipped + i + 1
            skipped, skipping, data = 0, False, data[i + 1:]
        cut = data.rfind(b"\n") + 1
        first = data.find(b"\n") + 1
        if cut and len(pending) + first > BLOCK_BYTES:  # a long line ends here: a block of its own
            n = len(pending) + first
            if n - 1 > max_bytes:
                pending = bytearray()
                yield pos, None
            else:
                pending += memoryview(data)[:first]
                held, pending = [pending], bytearray()
                yield pos, held.pop()  # nothing here refers to it once handed over
            pos += n
            data, cut = data[first:], cut - first
        if cut == 0:
            pending += data
            if len(pending) > max_bytes:
                skipped, pending, skipping = len(pending), bytearray(), True
            continue
        block = b"".join((pending, data[:cut])) if pending else data[:cut]
        pending = bytearray(data[cut:])
        yield pos, block
        pos += len(block)
    if skipping:
        yield pos, None
    elif pending:
        held, pending = [pending], None
        yield pos, held.pop()


def iter_lines(f, pos: int, max_bytes: int):
    """Yield (byte position, line without its newline), or (pos, None) for a line over max_bytes."""
    for pos, block in line_blocks(f, pos, max_bytes):
        if block is None:
            yield pos, None
            continue
        parts = block.split(b"\n")
        if not parts[-1]:
            parts.pop()
        for part in parts:
            yield pos, part if len(part) <= max_bytes else None
            pos += len(part) + 1


def first_line_start(f, start: int) -> int:
    """The first line start at or after `start`; leaves f positioned there."""
    pos = start
    if start > 0:
        f.seek(start - 1)
        pos = start - 1
        while block := f.read(1 << 16):
            i = block.find(b"\n")
            if i >= 0:
                pos += i + 1
                break
            pos += len(block)
    f.seek(pos)
    return pos


def previous_line_blank(f, pos: int) -> bool:
    """Is the line that ends just before `pos` (a line start) blank? True at the file start."""
    end = pos - 1  # the newline that ends the previous line
    while end > 0:
        begin = max(0, end - (1 << 16))
        f.seek(begin)
        chunk = f.read(end - begin)
        i = chunk.rfind(b"\n")
        line = chunk[i + 1:] if i >= 0 or begin > 0 else chunk.removeprefix(UTF8_BOM)  # a BOM is no text
        if line.strip():
            return False
        if i >= 0:
            return True
        end = begin
    return True


def bom_encoding(head: bytes) -> tuple[str, int]:
    """(encoding, byte-order mark length) of a file that starts with `head`: ('utf-8', 0) without a mark."""
    for mark, encoding in BOMS:
        if head.startswith(mark):
            return encoding, len(mark)
    return "utf-8", 0


class Joined:
    """A stream that first hands out `head` (bytes already read from `f`), then the rest of `f`."""

    def __init__(self, head: bytes, f):
        self.head, self.f = head, f

    def read(self, n: int = -1) -> bytes:
        if not self.head:
            return self.f.read() if n is None or n < 0 else self.f.read(n)
        if n is None or n < 0:
            out, self.head = self.head + self.f.read(), b""
        elif n <= len(self.head):
            out, self.head = self.head[:n], self.head[n:]
        else:
            out, self.head = self.head + self.f.read(n - len(self.head)), b""
        return out

    def close(self):
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _mark_invalid(e: UnicodeDecodeError):
    return "\udcff", e.end  # a lone surrogate: encoded below it is bytes no UTF-8 reader accepts


codecs.register_error("packer.mark_invalid", _mark_invalid)


class Utf8Stream(Joined):
    """UTF-16/32 bytes (after their BOM) read as UTF-8: `read(n)` returns about n bytes, b'' only at
    the end. Undecodable input (a lone surrogate, a cut-off last character) comes out as bytes that
    are not UTF-8, so the record holding it is skipped as invalid_utf8, never silently replaced."""

    def __init__(self, f, encoding: str):
        super().__init__(b"", f)
        self.decoder = codecs.getincrementaldecoder(encoding)(errors="packer.mark_invalid")

    def read(self, n: int = -1) -> bytes:
        while True:
            raw = self.f.read() if n is None or n < 0 else self.f.read(n)
            text = self.decoder.decode(raw, final=not raw)
            if text or not raw:
                return text.encode("utf-8", "surrogatepass")
