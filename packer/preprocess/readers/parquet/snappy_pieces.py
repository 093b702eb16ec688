"""A huge raw-Snappy page decompressed a piece at a time, so its compressed bytes are never held whole beside its output.

pyarrow.decompress takes the whole input: for a 192 MiB value stored with Snappy (pyarrow's
default) that is 87 MiB of compressed page next to the output, which alone put a build over 2x
the value (2.1x, 2026-12-04). Snappy's compressor (Google's, which Arrow and parquet-mr use)
compresses its input in 64 KiB blocks, each on its own: no copy reaches back past its block's
start. So the stream can be cut where a block's output starts, and each piece decompressed alone
once given its output length:

    stream  varint(size) | elements of block 0 | elements of block 1 | ...
    piece   varint(its size) | elements of blocks k..m   -> pyarrow.decompress -> output[k*64Ki : ...]

Finding the cuts means reading every element's tag in Python (~30 M elements for a 192 MiB value:
8.1 s, against 0.7 s to decompress it whole; 2026-12-04, shared 2-core box); a stream with a copy across a cut (another compressor) gives None, and the caller
decompresses it whole.
"""

from __future__ import annotations

BLOCK_BYTES = 1 << 16  # Snappy's compression block
PIECE_BYTES = 8 << 20  # output decompressed at once (cut at the first block start past it)
WINDOW_BYTES = 4 << 20  # compressed bytes read at once to find the cuts


def decompress(f, at: int, stored: int, size: int):
    """The `stored` bytes of raw Snappy at offset `at` of file `f`, decompressed into a bytearray of
    `size` bytes, a piece at a time; None when the stream cannot be cut (or is not what it says:
    the caller's one-shot decompression then reports it)."""
    import pyarrow as pa

    n, pos = _varint(f.read_at(min(10, stored), at), 0)
    if n != size or pos is None:
        return None
    out = bytearray(size)
    piece_at, piece_out, low = pos, 0, 0  # where the piece starts (compressed, output); the lowest output a copy read
    try:
        for cut_at, cut_out, reached in _cuts(f, at, pos, stored):
            low = min(low, reached)
            if low < piece_out or cut_out > size:
                return None  # a copy from before the piece (or a stream longer than it says)
            if cut_out - piece_out < PIECE_BYTES and cut_at < stored:
                continue
            body = _varint_bytes(cut_out - piece_out) + f.read_at(cut_at - piece_at, at + piece_at)
            data = pa.decompress(body, decompressed_size=cut_out - piece_out, codec="snappy",
                                 memory_pool=pa.system_memory_pool())
            out[piece_out:cut_out] = memoryview(data)
            del body, data
            piece_at, piece_out, low = cut_at, cut_out, cut_out
    except (OSError, ValueError, IndexError):  # (a cut-off element, a piece pyarrow refuses)
        return None
    return out if piece_at == stored and piece_out == size else None


def _cuts(f, at: int, pos: int, stored: int):
    """(compressed position, output position, the lowest output position a copy read since the last
    cut) at each block start of the stream and at its end; stops early where the stream is cut off
    or a block start is passed over (not a stream of independent blocks)."""
    out, low, last = 0, 0, 0
    while pos < stored:
        window = f.read_at(min(WINDOW_BYTES, stored - pos), at + pos)
        limit = len(window) - 5 if pos + len(window) < stored else len(window)  # an element's tag is at most 5 bytes
        p = 0
        while p < limit:
            tag = window[p]
            kind = tag & 3
            if kind == 0:  # literal: its length - 1 in the tag, or in the 1-4 bytes after it
                n = tag >> 2
                if n >= 60:
                    k = n - 59
                    n = int.from_bytes(window[p + 1:p + 1 + k], "little")
                    p += k
                p += n + 2
                out += n + 1
            else:  # copy: its length, and its offset back from the output so far
                if kind == 1:
                    back, length, p = (tag >> 5) << 8 | window[p + 1], ((tag >> 2) & 7) + 4, p + 2
                elif kind == 2:
                    back, length, p = window[p + 1] | window[p + 2] << 8, (tag >> 2) + 1, p + 3
                else:
                    back, length, p = int.from_bytes(window[p + 1:p + 5], "little"), (tag >> 2) + 1, p + 5
                if out - back < low:
                    low = out - back
                out += length
            if not out & (BLOCK_BYTES - 1):
                yield pos + p, out, low
                low = last = out
        if p == 0 or out - last > BLOCK_BYTES:  # (an element across a block start: not Snappy's blocks)
            return
        pos += p
    if pos == stored and out != last:
        yield pos, out, low


def _varint(data, pos: int):
    n, shift = 0, 0
    while pos < len(data) and shift < 35:
        b = data[pos]
        n, pos, shift = n | (b & 0x7F) << shift, pos + 1, shift + 7
        if not b & 0x80:
            return n, pos
    return None, None


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
