"""A bounded local cache of remote byte ranges, shared by the processes of one node: files, renames, LRU by size.

    CACHE_DIR/
      .lock                          flock'ed by the process that is evicting
      3f/3f9c...e1.blk               the bytes of one range, named by the sha256 of its key
      3f/.3f9c...e1.blk.tmp4711.2    being written (renamed into place when complete)

A key names content, not a place: packer's streaming reader (packer/store/stream.py) uses the
file's sha256 from the manifest and the byte range, so a rebuilt dataset never reads a stale
block, and two URIs of one dataset (rotated credentials) share entries. Files appear whole (rename)
and are never changed, so a reader needs no lock: it either opens a complete file or finds none.
A read touches the file's mtime; eviction removes the least recently read files first. The cache
trusts nothing it holds: the streaming reader checks each block it gets from here against the
shard's checksums, as it checks the store's, and `discard`s one that does not match.

Bound: after each `max_bytes / 16` bytes it added, a process scans the directory under the lock
and deletes the oldest files until at most 7/8 of `max_bytes` remain. So the directory holds at
most max_bytes x (1 + P / 16) with P processes writing at once (at most 1.5 max_bytes for 8
DataLoader workers), and a scan happens only once per max_bytes / 16 bytes fetched.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from pathlib import Path

import numpy as np

SCAN_FRACTION = 16  # scan after adding max_bytes / SCAN_FRACTION
LOW_WATER = 7 / 8  # evict down to this share of max_bytes


def key_name(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class BlockCache:
    """cache.get(key) -> uint8 array or None; cache.put(key, data). Any number of processes may
    share one `directory`; each keeps its own count of bytes added since its last scan."""

    def __init__(self, directory, max_bytes: int):
        if max_bytes < 1:
            raise ValueError(f"cache max_bytes={max_bytes}: give a positive size in bytes, or no cache directory")
        self.directory, self.max_bytes = Path(directory), int(max_bytes)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._added = 0
        self._guard = threading.Lock()

    def _file(self, key: str) -> Path:
        name = key_name(key)
        return self.directory / name[:2] / f"{name}.blk"

    def get(self, key: str):
        path = self._file(key)
        try:
            data = np.fromfile(path, dtype=np.uint8)
            os.utime(path)  # read now: the last to be evicted
        except FileNotFoundError:  # never cached, or evicted by another process
            return None
        return data

    def discard(self, key: str) -> None:
        """Forget `key`'s bytes (a reader found them damaged); the next put writes them again."""
        self._file(key).unlink(missing_ok=True)

    def put(self, key: str, data) -> None:
        path = self._file(key)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
        with open(tmp, "wb") as f:
            f.write(memoryview(data).cast("B"))
        os.replace(tmp, path)
        with self._guard:
            self._added += len(memoryview(data).cast("B"))
            due = self._added >= self.max_bytes // SCAN_FRACTION
            if due:
                self._added = 0
        if due:
            self.evict()

    def files(self) -> list[tuple[int, int, str]]:
        """(mtime_ns, bytes, path) of every cached file, oldest read first."""
        out = []
        for sub in os.scandir(self.directory):
            if not sub.is_dir():
                continue
            for entry in os.scandir(sub.path):
                if entry.name.endswith(".blk"):
                    try:
                        st = entry.stat()
                    except FileNotFoundError:
                        continue
                    out.append((st.st_mtime_ns, st.st_size, entry.path))
        return sorted(out)

    def size(self) -> int:
        return sum(size for _, size, _ in self.files())

    def evict(self) -> int:
        """Delete the least recently read files until at most LOW_WATER x max_bytes remain (under
        the directory's lock, so two processes do not both delete); bytes deleted."""
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            files = self.files()
            total, target, freed = sum(f[1] for f in files), int(self.max_bytes * LOW_WATER), 0
            for _, size, path in files:
                if total - freed <= target:
                    break
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                freed += size
            return freed
        finally:
            os.close(fd)  # closing releases the flock
