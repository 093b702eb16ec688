"""A huge gzip, zstd or brotli Parquet page decompressed as a stream, so its compressed bytes are never held whole beside its output.

pyarrow.decompress takes the whole input (for a 192 MiB value with zstd: 61 MiB of compressed page
next to the output). These three codecs write one stream per page that pyarrow's
CompressedInputStream decodes as it reads: the page is read from the file a few MiB at a time and
decoded straight into the output.
"""

from __future__ import annotations

import io

CODECS = ("gzip", "zstd", "brotli")  # pyarrow's names; snappy: snappy_pieces; lz4_raw: whole
READ_BYTES = 4 << 20


def decompress(f, at: int, stored: int, size: int, codec: str):
    """The `stored` bytes at offset `at` of file `f`, a `codec` stream, decompressed into a bytearray of
    `size` bytes; None when it ends short or does not decode (the caller's whole decompression then reports it)."""
    import pyarrow as pa

    stream = pa.CompressedInputStream(pa.PythonFile(_Range(f, at, stored), mode="r"), codec)
    out = bytearray(size)
    view, n = memoryview(out), 0
    try:
        while n < size:
            data = stream.read(min(READ_BYTES, size - n))
            if not data:
                return None
            view[n:n + len(data)] = data
            n += len(data)
    except (OSError, ValueError):  # (pyarrow's ArrowIOError, ArrowInvalid)
        return None
    return out


class _Range(io.RawIOBase):
    """Bytes [at, at + n) of a pyarrow file, as a stream."""

    def __init__(self, f, at: int, n: int):
        super().__init__()
        self.f, self.at, self.end = f, at, at + n

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.end - self.at if n is None or n < 0 else min(n, self.end - self.at)
        data = self.f.read_at(n, self.at) if n > 0 else b""
        self.at += len(data)
        return data
