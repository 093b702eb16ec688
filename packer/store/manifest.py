"""The manifest: what a dataset holds, which files are packer's, and how to read it back.

    OUTPUT/manifest.json   format version, tool, config, tokenizer, inputs, shards (file names with
                           sha256), totals; written last, so its presence means the build is complete

Shard entries name their files and their sha256 under keys their format lists
(packer/store/formats/: `file`/`sha256` for every format, `index_file`/`index_sha256` for memmap
and Megatron, `doc_ids_file`/`doc_ids_sha256` for Megatron), then `sequences`, `tokens`, `documents`.
"""

from __future__ import annotations

import hashlib
import json

from packer.io import fs

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATS = "stats.json"
REPORT = "report.html"  # stats.json drawn as a page (packer/stats/report.py)


def sha256_file(path, chunk_bytes: int = 8 * 2**20) -> str:
    h = hashlib.sha256()
    path = fs.location(path)
    with path.open("rb") as f:
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
