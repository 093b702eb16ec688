"""Whole lines out of a binary stream in ~1 MiB blocks, with memory bounded whatever the line length.

    b'{"a":1}\n{"b":2}\n{"c"'  ->  (0, b'{"a":1}\n{"b":2}\n'), then the rest once its newline arrives

A line longer than max_bytes is reported as (pos, None) and dropped while it streams past,
so a 300 MB line costs one block of memory, not 300 MB. Positions are byte offsets in the file.
"""

from __future__ import annotations

BLOCK_BYTES = 1 << 20


def line_blocks(f, pos: int, max_bytes: int):
    """Yield (pos, block): about BLOCK_BYTES of whole lines (only the file's last line may lack its
    newline), or (pos, None) standing for one line longer than max_bytes, never held whole."""
    pending, pending_len, skipping = [], 0, False  # the unfinished line at the end of the last read
    while data := f.read(BLOCK_BYTES):
        if skipping:
            i = data.find(b"\n")
            if i < 0:
                pending_len += len(data)
                continue
            yield pos, None
            pos += pending_len + i + 1
            pending_len, skipping, data = 0, False, data[i + 1:]
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            pending.append(data)
            pending_len += len(data)
            if pending_len > max_bytes:
                pending, skipping = [], True
            continue
        block = b"".join([*pending, data[:cut]]) if pending else data[:cut]
        pending, pending_len = [data[cut:]], len(data) - cut
        yield pos, block
        pos += len(block)
    if skipping:
        yield pos, None
    elif pending_len:
        yield pos, b"".join(pending)


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
        if chunk[i + 1:].strip():
            return False
        if i >= 0:
            return True
        end = begin
    return True
