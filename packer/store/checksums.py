"""Block checksums: one xxh3_64 per read block of every shard file, so a reader checks each block before any row of it is used.

    shard-00000.sums   byte 0   8 bytes      magic b"PACKSUM1"
                       byte 8   uint32       version (1: xxh3_64, seed 0, of each byte range)
                       byte 12  uint32       F, files covered: the shard entry's other files, in its order
                       byte 16  uint64       K, blocks of rows
                       byte 24  int64[K+1]   row bounds: block k holds rows bounds[k]..bounds[k+1]
                       then per file, in order:
                                int64        first: the range holding row block 0 (block k in range
                                             first + k), or -1 for a file read whole (an index)
                                uint64       n, its byte ranges
                                int64[n+1]   cuts, rising from 0 to the file's size
                                uint64[n]    xxh3_64 of each range file[cuts[i]:cuts[i+1]]

All integers little-endian (every section 8-byte aligned). A memmap shard of 3 blocks: the .bin
cut at its blocks' first tokens (first 0), the .idx one range (first -1). An Arrow shard of 2
record batches: the schema message, each batch's message, the end-of-stream marker (first 1).
The file's own sha256 is in the manifest entry (`checksums_file`, `checksums_sha256`), so the
chain is manifest -> sums -> every block.

Why xxh3_64: 58 GB/s on 1 MiB numpy buffers against crc32c's 27 (google-crc32c 1.9, hardware) and
sha256's 1.8 (benchmarks/bench_loader.py's box, 2026-12-03); a reader checks a block once per process,
so on a first read its cost sits beside the page faults, not above them.
"""

from __future__ import annotations

import collections
import hashlib
import struct
from typing import NamedTuple

import numpy as np
import xxhash

from packer.io import fs

MAGIC = b"PACKSUM1"
VERSION = 1
HEADER = struct.Struct("<8sIIQ")  # 24 bytes
BLOCK_BYTES = 32 << 10  # memmap/Megatron: a block is the rows starting in one 32 KiB window of the .bin (the streamer reads runs of them)
SUFFIX = ".sums"
NAME_KEY, SHA_KEY = "checksums_file", "checksums_sha256"
CAUSES = "replaced, truncated or corrupted after the build"


class ChecksumError(ValueError):
    """A byte range whose xxh3_64 is not the one its checksums file holds."""


def digest(data) -> int:
    return xxhash.xxh3_64_intdigest(data)


class FileSums(NamedTuple):
    first: int  # range of row block 0, or -1 (the file is read whole)
    cuts: np.ndarray  # int64 [n + 1]
    digests: np.ndarray  # uint64 [n]


class Sums(NamedTuple):
    rows: np.ndarray  # int64 [K + 1]
    files: list  # FileSums per covered file, in the shard entry's order

    @property
    def n_blocks(self) -> int:
        return len(self.rows) - 1


# -- writing -----------------------------------------------------------------------------


class BlockSink:
    """A sink (HashedFile) that also hashes what passes through it in byte ranges: a range ends at
    each position given to `cut_at` (before or while the bytes arrive) and at the end."""

    def __init__(self, sink):
        self._sink = sink
        self._pos = 0
        self._hash = xxhash.xxh3_64()
        self._cuts, self._digests = [0], []
        self._pending: collections.deque = collections.deque()
        self.first = -1

    def cut_at(self, positions):
        """End a range at each of `positions` (ascending, at or after what was written so far)."""
        for at in np.asarray(positions, np.int64).tolist():
            if at < self._pos:
                raise AssertionError(f"cut at {at} behind the write position {self._pos}")
            self._pending.append(at)
        self._settle(memoryview(b""), 0)

    def _end(self, at: int):
        if at > self._cuts[-1]:  # no empty range
            self._cuts.append(at)
            self._digests.append(self._hash.intdigest())
            self._hash.reset()

    def _settle(self, data: memoryview, offset: int) -> int:
        """Hash data[offset:] up to each pending cut it reaches (pos is where data[offset] goes)."""
        while self._pending and self._pending[0] <= self._pos + len(data) - offset:
            at = self._pending.popleft()
            k = offset + at - self._pos
            self._hash.update(data[offset:k])
            self._pos += k - offset
            offset = k
            self._end(at)
        return offset

    def write(self, buf) -> int:
        data = memoryview(buf).cast("B")
        offset = self._settle(data, 0)
        self._hash.update(data[offset:])
        self._pos += len(data) - offset
        return self._sink.write(buf)

    def tell(self) -> int:
        return self._pos

    def flush(self):
        pass

    @property
    def closed(self) -> bool:
        return self._sink.closed

    def close(self):
        pass  # the caller closes the file underneath

    def sums(self) -> FileSums:
        self._end(self._pos)
        return FileSums(self.first, np.asarray(self._cuts, np.int64), np.asarray(self._digests, np.uint64))


def sums_bytes(rows, files: list[FileSums]) -> list:
    """The checksums file's bytes (module docstring) as buffers."""
    rows = np.ascontiguousarray(rows, dtype="<i8")
    out = [HEADER.pack(MAGIC, VERSION, len(files), len(rows) - 1), rows.tobytes()]
    for f in files:
        out += [struct.pack("<qQ", f.first, len(f.digests)), np.ascontiguousarray(f.cuts, "<i8").tobytes(),
                np.ascontiguousarray(f.digests, "<u8").tobytes()]
    return out


# -- reading -----------------------------------------------------------------------------


def parse_sums(raw: bytes, where: str, n_files: int) -> Sums:
    """A checksums file's content (its sha256 already checked against the manifest), its shape checked."""
    def bad(why):
        return ValueError(f"{where}: {why} (a damaged checksums file; rebuild the dataset)")

    raw = memoryview(raw)
    if len(raw) < HEADER.size:
        raise bad(f"{len(raw)} bytes, shorter than its header")
    magic, version, files, k = HEADER.unpack(raw[: HEADER.size])
    if magic != MAGIC:
        raise bad(f"magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise ValueError(f"{where}: checksums version {version}, this packer reads version {VERSION}; upgrade packer")
    if files != n_files:
        raise bad(f"covers {files} files, the shard entry names {n_files}")
    pos = HEADER.size

    def take(count: int, dtype: str) -> np.ndarray:
        nonlocal pos
        end = pos + 8 * count
        if count < 0 or end > len(raw):
            raise bad(f"ends at byte {len(raw)}, inside a section")
        out = np.frombuffer(raw[pos:end], dtype)
        pos = end
        return out

    rows = take(k + 1, "<i8")
    if rows[0] != 0 or (np.diff(rows) < 0).any():
        raise bad("row bounds do not rise from 0")
    out = []
    for _ in range(files):
        first, n = (int(x) for x in take(2, "<i8"))
        cuts, digests = take(n + 1, "<i8"), take(n, "<u8")
        if cuts[0] != 0 or (np.diff(cuts) <= 0).any():
            raise bad("byte ranges do not rise from 0")
        if first < -1 or (first >= 0 and first + k > n):
            raise bad(f"row block 0 at range {first} of {n}")
        out.append(FileSums(first, cuts, digests))
    if pos != len(raw):
        raise bad(f"{len(raw) - pos} bytes after its last section")
    return Sums(rows, out)


def check_range(sums: FileSums, start: int, stop: int, data, where: str, cause: str = CAUSES):
    """data (bytes [start, stop) of a file) against the xxh3_64 of each range it spans; `start` and
    `stop` must be range bounds. ChecksumError naming the file, the range and `cause` otherwise."""
    cuts = sums.cuts
    i, j = int(np.searchsorted(cuts, start)), int(np.searchsorted(cuts, stop))
    if i >= len(cuts) or cuts[i] != start or j >= len(cuts) or cuts[j] != stop:
        raise ChecksumError(f"{where} bytes {start}-{stop}: not a run of checksummed blocks (the index and the "
                            f"checksums file disagree: {cause}); run `packer verify`, or rebuild the dataset")
    view = memoryview(data).cast("B")
    if len(view) != stop - start:
        raise ChecksumError(f"{where} bytes {start}-{stop}: {len(view)} bytes read ({cause}); run `packer verify`, "
                            "or rebuild the dataset")
    bounds = (cuts[i:j + 1] - start).tolist()
    want = sums.digests[i:j].tolist()
    for a, b, w in zip(bounds, bounds[1:], want):
        if xxhash.xxh3_64_intdigest(view[a:b]) != w:
            raise ChecksumError(f"{where} bytes {start + a}-{start + b}: checksum mismatch ({cause}); run `packer "
                                "verify`, or rebuild the dataset")


def head_ranges(sums: Sums) -> list[tuple[int, int, int]]:
    """(file, start, stop) of every range no row block holds: whole files and Arrow's schema and end marker,
    which a reader checks at open."""
    out = []
    for f, s in enumerate(sums.files):
        n = len(s.digests)
        inner = range(s.first, s.first + sums.n_blocks) if s.first >= 0 else range(0)
        out += [(f, int(s.cuts[i]), int(s.cuts[i + 1])) for i in range(n) if i not in inner]
    return out


def block_ranges(sums: Sums, k0: int, k1: int) -> list[tuple[int, int, int]]:
    """(file, start, stop) of row blocks k0..k1 in each file that holds them by rows."""
    return [(f, int(s.cuts[s.first + k0]), int(s.cuts[s.first + k1])) for f, s in enumerate(sums.files)
            if s.first >= 0 and k1 > k0]


def read_sums(path, sha256: str | None, n_files: int) -> Sums:
    """A shard's checksums file (local or remote), checked against its manifest sha256, then parsed."""
    return parse_checked(fs.location(path).read_bytes(), path, sha256, n_files)


def parse_checked(raw, path, sha256: str | None, n_files: int) -> Sums:
    """parse_sums of a checksums file's bytes once their sha256 is the manifest's."""
    where = fs.redact(path)
    if hashlib.sha256(memoryview(raw).cast("B")).hexdigest() != sha256:
        raise ChecksumError(f"{where}: sha256 does not match the manifest ({CAUSES}); run `packer verify`, or rebuild "
                            "the dataset")
    return parse_sums(raw, where, n_files)


class _Discard:
    closed = False

    def write(self, data) -> int:
        return len(data)


def check_file(path, sha256: str | None, file_sums: FileSums | None = None, chunk_bytes: int = 8 << 20):
    """A whole file's sha256 against the manifest's and, given its checksummed ranges, each range's
    xxh3_64, in one pass over its bytes; ValueError naming the file (and the range) otherwise."""
    path = fs.location(path)
    where, h = fs.redact(path), hashlib.sha256()
    blocks = BlockSink(_Discard())
    if file_sums is not None:
        blocks.cut_at(file_sums.cuts[1:])
    with path.open("rb") as f:
        while data := f.read(chunk_bytes):
            h.update(data)
            blocks.write(data)
    if h.hexdigest() != sha256:
        raise ValueError(f"{where}: sha256 does not match the manifest (the file changed or is corrupt)")
    if file_sums is None:
        return
    got = blocks.sums()
    if not np.array_equal(got.cuts, file_sums.cuts):
        raise ChecksumError(f"{where}: {int(got.cuts[-1])} bytes, its checksums file says {int(file_sums.cuts[-1])} "
                            "(the checksums file does not match the shard; rebuild the dataset)")
    bad = np.flatnonzero(got.digests != file_sums.digests)
    if len(bad):
        a, b = int(got.cuts[bad[0]]), int(got.cuts[bad[0] + 1])
        raise ChecksumError(f"{where} bytes {a}-{b}: checksum mismatch (the checksums file does not match the shard, "
                            "whose sha256 is the manifest's; rebuild the dataset)")
