"""The optional per-shard files of the memmap and Megatron formats (packer/store/rows.py EXTRAS):

    shard-00000.loss_mask.bin    uint8, one per token of the .bin, no header (1 = trained)
    shard-00000.source_ids.npy   a NumPy .npy file (format 1.0, '<u2', shape (D,)): the source of
                                 each segment, in the order of the shard's doc_ids
    shard-00000.role_ids.bin     uint8, one per token of the .bin, no header: its chat role (the
                                 manifest's "roles" table)

Written only by builds that have them (SFT masks; named sources; --store-roles), so other shards
keep their files.
"""

from __future__ import annotations

import io
import threading

import numpy as np

from packer.io import fs

FILES = {
    "loss_mask": ("loss_mask_file", "loss_mask_sha256", ".loss_mask.bin"),
    "source_ids": ("source_ids_file", "source_ids_sha256", ".source_ids.npy"),
    "role_ids": ("role_ids_file", "role_ids_sha256", ".role_ids.bin"),
}
PER_TOKEN_WHAT = {"loss_mask": "mask byte", "role_ids": "role byte"}  # the uint8-per-token sidecars


def write_source_ids(sink, source_ids):
    np.lib.format.write_array(sink, np.ascontiguousarray(source_ids, dtype="<u2"), version=(1, 0), allow_pickle=False)


def read_loss_mask(path, n_tokens: int, name: str = "loss_mask") -> np.ndarray:
    """A uint8-per-token sidecar (loss_mask, role_ids), its size checked against the shard's tokens."""
    raw = fs.map_bytes(path)
    if len(raw) != n_tokens:
        raise ValueError(f"{fs.redact(path)}: {len(raw)} bytes, one {PER_TOKEN_WHAT[name]} per token of the shard's "
                         f"{n_tokens} (truncated or corrupt)")
    return raw.view(np.uint8) if len(raw) else np.zeros(0, np.uint8)


# np.load parses a header with ast.literal_eval, which CPython 3.11 does not make safe across threads
# (SystemError "AST constructor recursion depth mismatch" when a streamed dataset's shard indexes were
# read in parallel: benchmarks/corruption_matrix.py, 2026-12-03); headers are tiny, so one at a time.
_HEADER_LOCK = threading.Lock()


def read_source_ids(path, n_segments: int, raw=None) -> np.ndarray:
    return load_npy(path, "source_ids", "<u2", n_segments, "segment", raw)


def load_npy(path, name: str, dtype: str, n: int, per: str, raw=None) -> np.ndarray:
    """A 1-D .npy sidecar of exactly `dtype` and n values (memory-mapped when local; parsed from
    `raw`, its bytes, when given); ValueError naming the file for a damaged header, another dtype
    or another length."""
    source = io.BytesIO(memoryview(raw)) if raw is not None else fs.for_numpy(path)
    try:
        with _HEADER_LOCK:
            values = np.load(source, mmap_mode=None if isinstance(source, io.BytesIO) else "r",  # bytes, or a path to map
                             allow_pickle=False)
    except (ValueError, EOFError, SyntaxError) as e:  # a damaged header (read by ast.literal_eval)
        raise ValueError(f"{fs.redact(path)}: not a readable .npy file ({e}; truncated or corrupt?)") from None
    if values.dtype != np.dtype(dtype) or values.shape != (n,):
        raise ValueError(f"{fs.redact(path)}: {name} {values.dtype} {values.shape}, expected {np.dtype(dtype).name} "
                         f"({n},), one per {per}")
    return values.view(np.ndarray)


def read(paths: dict, n_tokens: int, n_segments: int) -> dict:
    """{"loss_mask": ..., "source_ids": ..., "role_ids": ...} of the sidecars in `paths` (extra name -> path)."""
    out = {}
    for name in PER_TOKEN_WHAT:
        if name in paths:
            out[name] = read_loss_mask(paths[name], n_tokens, name)
    if "source_ids" in paths:
        out["source_ids"] = read_source_ids(paths["source_ids"], n_segments)
    return out
