"""Pieces of remote unit token files by ranged reads: the writer's stand-in for memory maps.

    pieces (unit, byte range):  (3, 800-1600) (0, 0-400) (3, 1700-2000)
    reads:  unit 0 [0, 400)   unit 3 [800, 2000)      (gaps up to GAP_BYTES merged)
    result: the pieces' bytes joined in the order asked for

Reads run in a few threads (pyarrow releases the GIL), so an object store's per-request
latency overlaps; each unit file is opened once per shard (`files` is the caller's cache).
GAP_BYTES and THREADS are guesses, not yet measured against a real object store (none is
reachable from the machine this was written on; the tests use moto and fsspec's memory://).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

GAP_BYTES = 1 << 16  # read through a hole this small rather than issue another request
MAX_READ_BYTES = 64 << 20
THREADS = 8
_POOL: list[ThreadPoolExecutor] = []


def _open(units_dir, u: int, files: dict):
    """(RandomAccessFile, byte offset of the data) of unit u's tokens.npy, opened once."""
    if u not in files:
        f = (units_dir / f"unit-{u:06d}.tokens.npy").open_input()
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        read_header(f)
        files[u] = (f, f.tell())
    return files[u]


def spans(piece_unit, begin, end) -> tuple[list, list]:
    """Merged reads [unit, start, stop] and, per piece, the index of the read that holds it."""
    unit_l, begin_l, end_l = piece_unit.tolist(), begin.tolist(), end.tolist()
    reads, where = [], [0] * len(unit_l)
    for i in np.lexsort((begin, piece_unit)).tolist():
        last = reads[-1] if reads else None
        if (last and last[0] == unit_l[i] and begin_l[i] - last[2] <= GAP_BYTES
                and end_l[i] - last[1] <= MAX_READ_BYTES):
            last[2] = max(last[2], end_l[i])
        else:
            reads.append([unit_l[i], begin_l[i], end_l[i]])
        where[i] = len(reads) - 1
    return reads, where


def gather(units_dir, piece_unit, begin, end, files: dict) -> bytes:
    """The bytes of every piece (unit piece_unit[i], token bytes begin[i]..end[i]), joined in order."""
    reads, where = spans(piece_unit, begin, end)
    for u in dict.fromkeys(r[0] for r in reads):  # all opened before the threads start
        _open(units_dir, u, files)

    def read(r):
        f, data_offset = files[r[0]]
        return memoryview(f.read_at(r[2] - r[1], data_offset + r[1]))

    if not _POOL:
        _POOL.append(ThreadPoolExecutor(THREADS, thread_name_prefix="packer-read"))
    bufs = list(_POOL[0].map(read, reads)) if len(reads) > 1 else [read(r) for r in reads]
    begin_l, end_l = begin.tolist(), end.tolist()
    return b"".join([bufs[w][b - reads[w][1] : e - reads[w][1]] for w, b, e in zip(where, begin_l, end_l)])
