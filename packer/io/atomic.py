"""Atomic file writes: write to a temporary name beside the target, then rename into place.

A file that exists under its final name is therefore complete. Temporary names end in
`.tmp<pid>` (`shard-00003.arrow.tmp4711`), so a killed run's leftovers are easy to find
and remove (`remove_leftovers`). A remote location (packer/io/fs.py) has no rename: there each
file is written straight to its final name, and a marker written after it says it is complete.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from packer.io import failpoints, fs

_TMP_RE = re.compile(r"\.tmp\d+$")


def _tmp(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp{os.getpid()}")


def write_bytes(path, data: bytes):
    path = fs.location(path)
    if isinstance(path, fs.RemotePath):
        path.write_bytes(data)
        return
    tmp = _tmp(path)
    with _removed_on_failure(tmp):
        tmp.write_bytes(data)
        _rename(tmp, path)


class _removed_on_failure:
    """Delete the temporary file `tmp` if the block fails (a full disk mid-write): no partial file stays."""

    def __init__(self, tmp: Path):
        self.tmp = tmp

    def __enter__(self):
        return self.tmp

    def __exit__(self, kind, *_):
        if kind is not None:
            self.tmp.unlink(missing_ok=True)


def _rename(tmp: Path, path: Path):
    """The last step of every local file write. Failpoint `file:N` (packer/io/failpoints.py) fires
    here for the N-th file this process writes, its bytes in `tmp`: the fault matrix's 'every write'."""
    failpoints.hit_next("file")
    os.replace(tmp, path)


class Staged:
    """A seekable binary file that becomes `path` only on commit(): locally a temporary name
    beside it, renamed into place; for a remote path (no rename, no seek) a nameless local
    temporary file, uploaded on commit, so a killed process leaves nothing anywhere.
    abort() discards it. `f` is the open file."""

    def __init__(self, path):
        self.path = fs.location(path)
        if isinstance(self.path, fs.RemotePath):
            self.tmp, self.f = None, tempfile.TemporaryFile(prefix="packer-")
        else:
            self.tmp = _tmp(self.path)
            self.f = open(self.tmp, "wb")

    def commit(self):
        if self.tmp is None:
            self.f.seek(0)
            with self.f:
                fs.upload(self.f, self.path)
        else:
            with _removed_on_failure(self.tmp):
                self.f.close()
                _rename(self.tmp, self.path)

    def abort(self):
        self.f.close()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def write_json(path, obj):
    """`obj` as indented JSON, with credentials in any URI it names redacted (packer/io/fs.py)."""
    write_bytes(path, (json.dumps(fs.redact_json(obj), indent=2) + "\n").encode("utf-8"))


def _save(path, save):
    path = fs.location(path)
    if isinstance(path, fs.RemotePath):
        buf = io.BytesIO()
        save(buf)
        path.write_bytes(buf.getvalue())
        return
    tmp = _tmp(path)
    with _removed_on_failure(tmp):
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a name
            save(f)
        _rename(tmp, path)


def save_npz(path, **arrays):
    _save(path, lambda f: np.savez(f, **arrays))


def copy_file(src, dst):
    write_bytes(dst, fs.location(src).read_bytes())


def publish(staged, final):
    """Rename a staged temporary file into place; None (written in place, remote) does nothing."""
    if staged is not None:
        with _removed_on_failure(Path(staged)):
            _rename(Path(staged), Path(final))


def tmp_path(path) -> Path:
    """A temporary name for `path`; the caller renames it with os.replace when done."""
    return _tmp(Path(path))


def is_tmp(path) -> bool:
    return bool(_TMP_RE.search(Path(path).name))


def remove_leftovers(directory) -> int:
    """Delete temporary files a killed run left in `directory` (not recursive); return how many."""
    if fs.is_remote(directory):
        return 0  # nothing is written under a temporary name there
    n = 0
    for p in Path(directory).iterdir() if Path(directory).is_dir() else ():
        if p.is_file() and is_tmp(p):
            p.unlink(missing_ok=True)
            n += 1
    return n
