"""A file written under a temporary name while its sha256 is computed, for the caller to rename.

    f = HashedFile(final)          # writes final.tmp<pid> (locally) or final itself (remote)
    f.write(buf); ...; f.close()   # raises what a write raised (disk full, ...)
    f.hexdigest()                  # sha256 of every byte written
    atomic.publish(f.tmp, final)   # rename into place; a no-op where tmp is None (remote)
"""

from __future__ import annotations

import collections
import hashlib
from concurrent.futures import ThreadPoolExecutor

from packer.io import atomic, fs

_THREADS: list[ThreadPoolExecutor] = []  # [writer, hasher], one thread each, made once per process


class HashedFile:
    """A temporary file beside `final` that two threads fill: one writes each buffer, one
    hashes it (both release the GIL), while the caller prepares the next. Small writes
    (pyarrow's IPC metadata) are coalesced so each hand-over moves megabytes. Buffers must
    not change after `write`. Also the file-like object pyarrow's IPC writer needs.

    `threads=False` writes and hashes in the calling thread: the same bytes and digest, for
    benchmarks/bench_write.py to measure what the threads buy (the writer always uses them)."""

    IN_FLIGHT = 4  # buffers queued per thread: bounds memory to a few chunks
    SMALL = 1 << 16

    def __init__(self, final, threads: bool = True):
        self._threads = threads
        if threads and not _THREADS:
            _THREADS.extend(ThreadPoolExecutor(1, thread_name_prefix=f"packer-{n}") for n in ("write", "hash"))
        final = fs.location(final)
        if isinstance(final, fs.RemotePath):  # no rename there: written in place, tmp None
            self._file, self.tmp = final.open_output(), None
        else:
            self.tmp = atomic.tmp_path(final)
            self._file = open(self.tmp, "wb")
        self._hash = hashlib.sha256()
        self._pos, self.closed = 0, False
        self._small = bytearray()
        self._pending: collections.deque = collections.deque()

    def _submit(self, buf):
        if not self._threads:
            self._file.write(buf)
            self._hash.update(buf)
            return
        writer, hasher = _THREADS
        self._pending.append(writer.submit(self._file.write, buf))
        self._pending.append(hasher.submit(self._hash.update, buf))
        while len(self._pending) > 2 * self.IN_FLIGHT:
            self._pending.popleft().result()

    def write(self, buf) -> int:
        n = memoryview(buf).nbytes
        self._pos += n
        if n < self.SMALL:
            self._small += buf
        else:
            if self._small:
                self._submit(bytes(self._small))
                self._small.clear()
            self._submit(buf)
        return n

    def tell(self) -> int:
        return self._pos

    def flush(self):
        pass

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            if self._small:
                self._submit(bytes(self._small))
            while self._pending:
                self._pending.popleft().result()  # re-raises a failed write (disk full, ...)
        finally:
            self._file.close()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()
