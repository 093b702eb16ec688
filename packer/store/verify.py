"""Check a built dataset against its manifest; the first problem found is raised as one line.

Checked, shard by shard: every file present; sha256 equal to the manifest's (skipped by
`checksums=False`, the `verify --quick`); what the shard's format checks when it opens
the files (headers, sizes, counts between them: packer/store/formats/); every row
non-empty and at most the context length; offsets start at 0, rise strictly and end at
the row length; one doc_id per segment; token ids below the vocabulary size (full check
only); sequence, token and document counts equal the manifest's, per shard and in total.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from packer.io import fs
from packer.store import formats
from packer.store.manifest import read_manifest, sha256_file
from packer.store.rows import Rows


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_rows(rows: Rows, n_doc_ids: int, where: str, first_row: int, context_length: int):
    """Vectorized checks of one block of rows (indices absolute into the block's arrays)."""
    lengths = np.diff(rows.token_starts)
    n_offsets = np.diff(rows.offset_starts)
    for bad, what in (
        (lengths < 1, "is empty"),
        (lengths > context_length, f"is longer than the context length {context_length}"),
        (n_offsets < 2, "has fewer than 2 offsets"),
    ):
        if bad.any():
            r = _first(bad)
            raise ValueError(f"{where} row {first_row + r}: {lengths[r]} tokens, {n_offsets[r]} offsets; the row {what}")
    o0, o1 = int(rows.offset_starts[0]), int(rows.offset_starts[-1])
    offsets = np.asarray(rows.offsets[o0:o1], dtype=np.int64)
    starts = rows.offset_starts[:-1] - o0
    ends = rows.offset_starts[1:] - o0 - 1
    bad = (offsets[starts] != 0) | (offsets[ends] != lengths)
    if bad.any():
        r = _first(bad)
        raise ValueError(
            f"{where} row {first_row + r}: offsets {offsets[starts[r] : ends[r] + 1].tolist()[:8]}... must start "
            f"at 0 and end at the row length {lengths[r]}"
        )
    rises = np.diff(offsets)
    rises[ends[:-1]] = 1  # the step from one row's end to the next row's 0 is not a rise
    if rises.size and (rises <= 0).any():
        r = int(np.searchsorted(ends, _first(rises <= 0)))
        raise ValueError(f"{where} row {first_row + r}: offsets must rise strictly (an empty or reversed segment)")
    if n_doc_ids != o1 - o0 - len(lengths):
        raise ValueError(f"{where}: {n_doc_ids} doc_ids for {o1 - o0 - len(lengths)} segments")


def _check_token_ids(rows: Rows, where: str, dtype: np.dtype, vocab_size: int):
    if rows.tokens.dtype.newbyteorder("=") != dtype.newbyteorder("="):
        raise ValueError(f"{where}: tokens are {rows.tokens.dtype}, the manifest says {dtype}")
    used = rows.tokens[int(rows.token_starts[0]) : int(rows.token_starts[-1])]
    if used.size and int(used.max()) >= vocab_size:
        raise ValueError(f"{where}: token id {int(used.max())} >= the vocabulary size {vocab_size}")


def verify_dataset(path, *, checksums: bool = True) -> dict:
    """Check a dataset; return its totals (sequences, tokens, documents) or raise ValueError."""
    path = fs.location(path)  # a directory, or a URI (packer/io/fs.py)
    manifest = read_manifest(path)
    config = manifest["config"]
    fmt = config.get("format", "arrow")
    dtype = np.dtype(config["token_dtype"])
    totals = {"sequences": 0, "tokens": 0, "documents": 0}
    for entry in manifest["shards"]:
        for name, sha256 in formats.entry_files(fmt, entry):
            file = path / name
            if not file.is_file():
                raise ValueError(f"shard missing: {fs.redact(file)} (listed in the manifest); restore it or rebuild")
            if checksums and sha256_file(file) != sha256:
                raise ValueError(f"{fs.redact(file)}: sha256 does not match the manifest (the file changed or is corrupt)")
        where = fs.redact(path / entry["file"])  # no credentials of a URI in messages
        counts = {"sequences": 0, "tokens": 0, "documents": 0}
        try:
            for rows, doc_ids in formats.shard_blocks(path, entry, fmt):
                n_doc_ids = len(doc_ids)
                _check_rows(rows, n_doc_ids, where, counts["sequences"], config["context_length"])
                if checksums:
                    _check_token_ids(rows, where, dtype, manifest["tokenizer"]["vocab_size"])
                counts["sequences"] += len(rows)
                counts["tokens"] += int(rows.token_starts[-1] - rows.token_starts[0])
                counts["documents"] += n_doc_ids
        except (pa.ArrowException, KeyError, OSError) as e:
            raise ValueError(f"{where}: unreadable shard ({type(e).__name__}: {e})") from None
        for key, value in counts.items():
            if value != entry[key]:
                raise ValueError(f"{where}: {value} {key}, the manifest says {entry[key]}")
            totals[key] += value
    t = manifest["totals"]
    for key, total_key in (("sequences", "sequences"), ("tokens", "tokens_out")):
        if totals[key] != t[total_key]:
            raise ValueError(f"{totals[key]} {key} in the shards, the manifest totals say {t[total_key]}")
    return totals
