"""Input files -> (doc_index, text) streams, and the planning of work units over them.

A work unit is a byte range of one file, aligned to lines: the unit owns every line
that *starts* inside [start, end). Splitting a file at any byte offsets therefore
yields every line exactly once, and the output does not depend on the unit size.
"""

from __future__ import annotations

import glob
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

JSONL_SUFFIXES = (".jsonl", ".json")
MAX_EXAMPLES = 5  # skipped-record examples kept per unit


@dataclass(frozen=True)
class Unit:
    """One piece of work: bytes [start, end) of a file. `index` numbers units globally."""

    index: int
    path: str
    start: int
    end: int


@dataclass
class SkipLog:
    """Skipped records of one unit: counts by reason and the first few examples."""

    counts: Counter
    examples: list

    @classmethod
    def empty(cls) -> "SkipLog":
        return cls(Counter(), [])

    def add(self, reason: str, where: str):
        self.counts[reason] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append({"where": where, "reason": reason})


def expand_inputs(inputs) -> list[str]:
    """Files, directories (recursed, sorted, hidden entries skipped) and globs -> sorted file list."""
    files: list[str] = []
    for item in inputs:
        item = str(item)
        if any(ch in item for ch in "*?["):
            matches = sorted(glob.glob(item, recursive=True))
            if not matches:
                raise FileNotFoundError(f"input pattern matched no files: {item}")
            files.extend(m for m in matches if os.path.isfile(m))
        elif os.path.isdir(item):
            found = []
            for root, dirs, names in os.walk(item):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found.extend(os.path.join(root, n) for n in names if not n.startswith("."))
            files.extend(sorted(found))
        elif os.path.isfile(item):
            files.append(item)
        else:
            raise FileNotFoundError(f"input not found: {item} (give a file, a directory or a glob)")
    for f in files:
        if not f.endswith(JSONL_SUFFIXES):
            raise ValueError(
                f"unsupported input format: {f} (supported: {', '.join(JSONL_SUFFIXES)})"
            )
    if not files:
        raise FileNotFoundError(f"no input files found in {list(inputs)}")
    return files


def plan_units(files, unit_bytes: int) -> list[Unit]:
    """Cut each file into byte ranges of about unit_bytes (line alignment happens when reading)."""
    units = []
    for path in files:
        size = os.path.getsize(path)
        for start in range(0, max(size, 1), unit_bytes):
            units.append(Unit(len(units), path, start, min(start + unit_bytes, size)))
    return units


def _line_starts(f, start: int):
    """Seek f to the first line that starts at or after `start`."""
    if start == 0:
        f.seek(0)
        return
    f.seek(start - 1)
    if f.read(1) != b"\n":
        f.readline()


def read_jsonl_unit(unit: Unit, text_field: str, skips: SkipLog):
    """Yield the text of each valid record whose line starts inside the unit; count the rest."""
    with open(unit.path, "rb") as f:
        _line_starts(f, unit.start)
        pos = f.tell()
        while pos < unit.end:
            line = f.readline()
            if not line:
                break
            where = f"{unit.path}@byte {pos}"
            pos += len(line)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except UnicodeDecodeError:
                skips.add("invalid_utf8", where)
                continue
            except json.JSONDecodeError as e:
                skips.add("malformed_json", f"{where}: {e.msg}")
                continue
            if not isinstance(record, dict) or text_field not in record:
                skips.add("missing_field", where)
                continue
            text = record[text_field]
            if text is None:
                skips.add("null_text", where)
            elif not isinstance(text, str):
                skips.add("non_string_text", where)
            elif not text:
                skips.add("empty_text", where)
            else:
                yield text


def input_descriptions(files) -> list[dict]:
    return [{"path": str(Path(f)), "bytes": os.path.getsize(f)} for f in files]
