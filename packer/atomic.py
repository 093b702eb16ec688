"""Atomic file writes: write to a temporary name beside the target, then rename into place.

A file that exists under its final name is therefore complete. Temporary names end in
`.tmp<pid>` (`shard-00003.arrow.tmp4711`), so a killed run's leftovers are easy to find
and remove (`remove_leftovers`).

Also here: `kill_point`, the test-only hook that makes crash tests deterministic.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import numpy as np

KILL_ENV = "PACKER_TEST_KILL_AT"
_TMP_RE = re.compile(r"\.tmp\d+$")


def _tmp(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp{os.getpid()}")


def write_json(path, obj):
    path = Path(path)
    tmp = _tmp(path)
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def save_npy(path, array: np.ndarray):
    path = Path(path)
    tmp = _tmp(path)
    with open(tmp, "wb") as f:
        np.save(f, array)
    os.replace(tmp, path)


def save_npz(path, **arrays):
    path = Path(path)
    tmp = _tmp(path)
    with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a name
        np.savez(f, **arrays)
    os.replace(tmp, path)


def copy_file(src, dst):
    dst = Path(dst)
    tmp = _tmp(dst)
    tmp.write_bytes(Path(src).read_bytes())
    os.replace(tmp, dst)


def tmp_path(path) -> Path:
    """A temporary name for `path`; the caller renames it with os.replace when done."""
    return _tmp(Path(path))


def is_tmp(path) -> bool:
    return bool(_TMP_RE.search(Path(path).name))


def remove_leftovers(directory) -> int:
    """Delete temporary files a killed run left in `directory` (not recursive); return how many."""
    n = 0
    for p in Path(directory).iterdir() if Path(directory).is_dir() else ():
        if p.is_file() and is_tmp(p):
            p.unlink(missing_ok=True)
            n += 1
    return n


def kill_point(stage: str, n: int):
    """Test hook: SIGKILL this process when PACKER_TEST_KILL_AT equals f"{stage}:{n}".

    Stages used: tokenize:N / write:N (driver, after N units / shards are done), plan:0
    (driver, after the plan is saved), finalize:0 (driver, before the manifest),
    tokenize-unit:K (the process tokenizing unit K, as it starts), write-shard:K (the process
    writing shard K, after its temporary files, before the renames).
    """
    if os.environ.get(KILL_ENV) == f"{stage}:{n}":
        os.kill(os.getpid(), signal.SIGKILL)
