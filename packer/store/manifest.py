"""The manifest: what a dataset holds, which files are packer's, and how to read it back.

    OUTPUT/manifest.json   format version, tool, config, tokenizer, inputs, shards (file names with
                           sha256), totals; written last, so its presence means the build is complete

Shard entries name their files; `shard_files(entry)` lists them (a memmap shard has two).
"""

from __future__ import annotations

import hashlib
import json

from packer.io import fs

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATS = "stats.json"
REPORT = "report.html"  # stats.json drawn as a page (packer/stats/report.py)
SUFFIX = {"arrow": ".arrow", "memmap": ".bin"}


def shard_name(index: int, fmt: str = "arrow") -> str:
    return f"shard-{index:05d}{SUFFIX[fmt]}"


def shard_files(entry: dict) -> list[str]:
    """Every file of one manifest shard entry (a memmap shard has two)."""
    return [entry["file"]] + ([entry["index_file"]] if "index_file" in entry else [])


def sha256_file(path, chunk_bytes: int = 8 * 2**20) -> str:
    h = hashlib.sha256()
    path = fs.location(path)
    with path.open_input() if isinstance(path, fs.RemotePath) else open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def read_manifest(path) -> dict:
    path = fs.location(path)
    file = path / MANIFEST if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no {MANIFEST} in {fs.redact(path)}: not a packer dataset, or its build did not finish "
            "(run the same `packer build` command again to resume it)"
        )
    return json.loads(file.read_text(encoding="utf-8"))
