"""Atomic file writes: write to a temporary name beside the target, then rename into place.

A file that exists under its final name is therefore complete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


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


def tmp_path(path) -> Path:
    """A temporary name for `path`; the caller renames it with os.replace when done."""
    return _tmp(Path(path))
