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
shard's checksums, as it checks the store's, and `discard`s one that does not match. Nor what sits
at a block's name: anything but a regular file of the block's size (a FIFO, which would block the
reader forever; a 1 GB sparse file, which would be read whole; a directory; a symlink) is dropped
unread and the block fetched again. The name is lstat'ed, opened with O_NOFOLLOW | O_NONBLOCK and
checked again on the open descriptor; temporary files are created with O_EXCL | O_NOFOLLOW.

Bound: after each `max_bytes / 16` bytes it added, a process scans the directory under the lock
and deletes the oldest files until at most 7/8 of `max_bytes` remain. So the directory holds at
most max_bytes x (1 + P / 16) with P processes writing at once (at most 1.5 max_bytes for 8
DataLoader workers), and a scan happens only once per max_bytes / 16 bytes fetched.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import shutil
import stat
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

    def get(self, key: str, n_bytes: int):
        """The `n_bytes` bytes kept for `key`, or None: never cached, evicted, or something other than
        a regular file of that size at its name (dropped, so the caller's put writes it again)."""
        path = self._file(key)
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # never cached, or evicted by another process
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size != n_bytes:
            self._drop(path)
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError:  # replaced by a link (ELOOP) or something unopenable since the lstat
            self._drop(path)
            return None
        try:
            st = os.fstat(fd)  # what was opened, whatever the name points at now
            if not stat.S_ISREG(st.st_mode) or st.st_size != n_bytes:
                data = None
            else:
                data = np.empty(n_bytes, dtype=np.uint8)
                view, got = memoryview(data), 0
                while got < n_bytes:
                    n = os.readv(fd, [view[got:]])
                    if n == 0:
                        break
                    got += n
                if got != n_bytes:
                    data = None
                else:
                    os.utime(fd)  # read now: the last to be evicted
        finally:
            os.close(fd)
        if data is None:
            self._drop(path)
        return data

    def _drop(self, path: Path) -> None:
        """Remove what sits at a block's name (a file, a link itself, a FIFO, a directory of this cache)."""
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                shutil.rmtree(path)  # never follows a link inside it
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass

    def discard(self, key: str) -> None:
        """Forget `key`'s bytes (a reader found them damaged); the next put writes them again."""
        self._drop(self._file(key))

    def put(self, key: str, data) -> None:
        path = self._file(key)
        try:
            self._write(path, memoryview(data).cast("B"))
        except OSError:  # the cache is an optimisation: a block it cannot keep is read from the store next time
            return
        with self._guard:
            self._added += len(memoryview(data).cast("B"))
            due = self._added >= self.max_bytes // SCAN_FRACTION
            if due:
                self._added = 0
        if due:
            self.evict()

    def _write(self, path: Path, data: memoryview) -> None:
        path.parent.mkdir(exist_ok=True)
        if not stat.S_ISDIR(os.lstat(path.parent).st_mode):  # a link in place of a subdirectory: not ours
            raise NotADirectoryError(path.parent)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            try:
                os.replace(tmp, path)
            except OSError:  # a directory (or another non-file) at the name: dropped, then once more
                self._drop(path)
                os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def files(self) -> list[tuple[int, int, str]]:
        """(mtime_ns, bytes, path) of every cached file, oldest read first."""
        out = []
        for sub in os.scandir(self.directory):
            if not sub.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(sub.path):
                if entry.name.endswith(".blk"):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    out.append((st.st_mtime_ns, st.st_size, entry.path))
        return sorted(out)

    def size(self) -> int:
        return sum(size for _, size, _ in self.files())

    def evict(self) -> int:
        """Delete the least recently read files until at most LOW_WATER x max_bytes remain (under
        the directory's lock, so two processes do not both delete); bytes deleted."""
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
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
