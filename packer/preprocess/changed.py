"""What each work unit read of its input, hashed while it was read, and whether the input still holds it.

A unit's counters (`_work/units/unit-XXXXXX.json`) keep the record under "input":

    {"hash": "xxh3-128", "digest": "9f2c...", "file_bytes": 10485760,
     "ranges": [[0, 4096], [2097151, 65536], [2097152, 2097152]]}

`ranges` are [offset, length] runs of the file's stored bytes in the order the reader consumed
them (a compressed file's compressed bytes: [[0, size]]; a later byte range of a JSONL file its
BOM head, the scan for its first line start, then its lines and the read past its end), and
`digest` hashes them in that order. Before a build reuses finished units (resume) and before it
writes the manifest, every unit's ranges are read again and hashed (`refuse_changed`): a file
edited after its unit was read (during the build, or between a kill and the resume, whatever its
size and mtime say) stops the build with the file, the unit and what to do.

Cost (benchmarks/bench_input_hash.py --mb 10 --repeat 3, sample_data JSONL repeated, one core,
busy 2-core box, 2026-12-01): the tokenize stage's CPU with hashing on / off, per round 0.960,
0.973, 1.036 (gzip: 0.925, 0.981, 1.064): no cost above the noise; the hash itself is 0.010 of the
stage's 2.9 CPU seconds (0.35%). The re-check takes 0.014 CPU s (0.5% of the stage) here, from
the page cache; it reads every input once more (at the disk's speed when not cached), spread
over the workers.
"""

from __future__ import annotations

import hashlib
import json

import xxhash

from packer.io import fs

HASH = "xxh3-128"  # new records; a record names its hash, so a _work/ from before still checks (HASHERS)
ENABLED = True  # benchmarks/bench_input_hash.py turns it off to time the same build without hashing
CHUNK_BYTES = 4 << 20


class InputChanged(ValueError):
    """An input differs from what a finished unit read of it."""


# Not a defence against someone forging an input, a check for edits: xxh3-128 runs at 12 GB/s here against
# blake2b's 0.9 (62 MB, 2026-12-04), which was 0.14 s of a 5 s build with the tiktoken engine (read + re-check).
HASHERS = {"xxh3-128": xxhash.xxh3_128, "blake2b-128": lambda: hashlib.blake2b(digest_size=16)}


def _hasher(name: str = HASH):
    return HASHERS[name]()


class InputSum:
    """The running record of one unit's reads: the hash and the [offset, length] runs it covers."""

    def __init__(self):
        self._hash = _hasher()
        self.ranges: list[list[int]] = []
        self.file_bytes: int | None = None

    def add(self, offset: int, data) -> None:
        """Bytes `data` of the file, read at `offset`."""
        n = memoryview(data).nbytes
        if not n:
            return
        self._hash.update(data)
        if self.ranges and self.ranges[-1][0] + self.ranges[-1][1] == offset:
            self.ranges[-1][1] += n
        else:
            self.ranges.append([offset, n])

    def add_ranges(self, f, ranges) -> None:
        """Read (offset, length) runs of `f` (a pyarrow RandomAccessFile) into the record."""
        for offset, length in ranges:
            for at, data in _read_range(f, offset, length):
                self.add(at, data)

    def record(self) -> dict | None:
        """The JSON record; None when no read came through here (a reader that does not hash)."""
        if self.file_bytes is None:
            return None
        return {"hash": HASH, "digest": self._hash.hexdigest(), "file_bytes": self.file_bytes, "ranges": self.ranges}


def _read_range(f, offset: int, length: int):
    """(offset, bytes) chunks of `length` bytes of `f` from `offset`; fewer at the end of the file."""
    f.seek(offset)
    end = offset + length
    while offset < end:
        data = f.read(min(CHUNK_BYTES, end - offset))
        if not data:
            return
        yield offset, data
        offset += len(data)


class HashingReader:
    """A binary file read through: every byte `read` hands out goes into an InputSum, with its offset.

    Takes what Python and pyarrow file objects share (read, seek, tell, close), so it also sits
    under pyarrow's decompressor (pa.PythonFile) to hash a .gz/.zst file's stored bytes."""

    def __init__(self, f, sums: InputSum):
        self.f, self.sums, self.pos = f, sums, 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read() if n is None or n < 0 else self.f.read(n)
        self.sums.add(self.pos, data)
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = self.f.seek(offset, whence)
        if self.pos is None:  # a file whose seek returns nothing
            self.pos = self.f.tell()
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return bool(getattr(self.f, "closed", False))

    def close(self):
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _why_changed(path: str, record: dict) -> str | None:
    """Why the file at `path` no longer holds what `record` says was read, or None when it does."""
    place = fs.location(path)
    try:
        size = fs.size(place)
    except OSError as e:
        return f"it cannot be read now ({fs.redact_text(f'{type(e).__name__}: {e}')})"
    if record.get("file_bytes") is not None and size != record["file_bytes"]:
        return f"it is {size:,} bytes now, {record['file_bytes']:,} when read"
    h = _hasher(record["hash"])
    with place.open("rb") as f:
        for offset, length in record["ranges"]:
            n = 0
            for _, data in _read_range(f, offset, length):
                h.update(data)
                n += len(data)
            if n != length:
                return f"bytes {offset:,}-{offset + length:,} are no longer all there"
    if h.hexdigest() != record["digest"]:
        spans = ", ".join(f"{o:,}-{o + n:,}" for o, n in record["ranges"][:3]) + (", ..." if len(record["ranges"]) > 3 else "")
        return f"the bytes it read ({spans}) differ now, same size"
    return None


def check_unit(unit, counters_path: fs.Place) -> str | None:
    """One line naming the unit's file, span and change when its input no longer holds what the unit
    read; None when it does, or when the counters hold no record (a unit of an older packer, or one
    whose file failed and was skipped)."""
    counters = json.loads(counters_path.read_text(encoding="utf-8"))
    record = counters.get("input")
    if not record or record.get("hash") not in HASHERS:
        return None
    why = _why_changed(unit.path, record)
    return None if why is None else f"{fs.redact(unit.path)} changed after packer read it (unit {unit.index}, {unit.span}: {why})"


def refuse_changed(unit_counters, executor, *, stage: str):
    """Re-hash what every finished unit read (on the executor's workers); raise InputChanged naming the
    first changed file when any differs. `unit_counters`: (unit, path of its counters json) of every
    unit, finished or not; `stage` says what is refused: "resume" or "finalize"."""
    items = [(u, p) for u, p in unit_counters if p.exists()]
    if not items:
        return
    problems = [p for p in executor.map(check_unit, items) if p]
    if problems:
        more = f" (and {len(problems) - 1} more unit(s))" if len(problems) > 1 else ""
        what = "resume over it" if stage == "resume" else "write a manifest over it"
        raise InputChanged(f"{problems[0]}{more}; refusing to {what}: the dataset would not be what the inputs hold. "
                           "Restore the file as it was (bytes and mtime: cp -p from a copy), or pass --overwrite to rebuild "
                           "from the inputs as they are now")
