"""The manifest: what a dataset holds, which files are packer's, and how to read it back.

    OUTPUT/manifest.json   format version, tool, config, tokenizer, inputs, shards (file names with
                           sha256), totals; written last, so its presence means the build is complete

Shard entries name their files and their sha256 under keys their format lists
(packer/store/formats/: `file`/`sha256` for every format, `index_file`/`index_sha256` for memmap
and Megatron, `doc_ids_file`/`doc_ids_sha256` for Megatron, `checksums_file`/`checksums_sha256`
since format version 2: packer/store/checksums.py), then `sequences`, `tokens`, `documents`.

A dataset's *generation* is the sha256 of its manifest.json bytes: every build writes a new one
(`created_unix`), so a reader that pins the generation it opened (`load_manifest`) tells, on every
later open in any process, whether the dataset was replaced since (`check_generation`).
"""

from __future__ import annotations

import hashlib
import json

from packer.io import fs

FORMAT_VERSION = 2  # 2: shards carry block checksums (packer/store/checksums.py); 1 is still read
MANIFEST = "manifest.json"
STATS = "stats.json"
TOKENIZER = "tokenizer.json"  # the build's tokenizer, copied: the dataset decodes without its source
REPORT = "report.html"  # stats.json drawn as a page (packer/stats/report.py)


def sha256_file(path, chunk_bytes: int = 8 * 2**20) -> str:
    h = hashlib.sha256()
    path = fs.location(path)
    with path.open("rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def read_manifest(path) -> dict:
    return load_manifest(path)[0]


def load_manifest(path) -> tuple[dict, str]:
    """(the manifest of the dataset at `path` (a directory, or its manifest.json), its generation:
    the sha256 of the manifest's bytes)."""
    path = fs.location(path)
    file = path / MANIFEST if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no {MANIFEST} in {fs.redact(path)}: not a packer dataset, or its build did not finish "
            "(run the same `packer build` command again to resume it)"
        )
    raw = file.read_bytes()
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{fs.redact(file)}: not readable JSON ({type(e).__name__} at byte {getattr(e, 'pos', '?')}): "
                         "damaged; restore it or rebuild the dataset") from None
    _check_shape(manifest, file)
    return manifest, hashlib.sha256(raw).hexdigest()


class DatasetReplaced(ValueError):
    """The dataset a reader opened was replaced (another build moved in) since."""


def generation_of(path) -> str | None:
    """The generation of the dataset at `path` now (None: no manifest, as while a build moves in)."""
    file = fs.location(path) / MANIFEST
    try:
        return hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else None
    except FileNotFoundError:  # gone between the two calls
        return None


def check_generation(path, pinned: str | None, now: str | None = None):
    """DatasetReplaced unless the dataset at `path` is still generation `pinned` (None: anything goes)."""
    if pinned is None:
        return
    now = generation_of(path) if now is None else now
    if now != pinned:
        raise DatasetReplaced(f"the dataset at {fs.redact(path)} was replaced after this loader opened it; restart from "
                              f"a checkpoint (its {MANIFEST} {'is gone: a build is moving in' if now is None else 'changed'})")


_SHAPE = {"config": dict, "tokenizer": dict, "shards": list, "totals": dict}  # what every reader indexes


def _check_shape(manifest, file):
    if not isinstance(manifest, dict):
        raise ValueError(f"{fs.redact(file)}: a JSON {type(manifest).__name__}, not a packer manifest; rebuild the dataset")
    for key, kind in _SHAPE.items():
        if not isinstance(manifest.get(key), kind):
            raise ValueError(f"{fs.redact(file)}: {key!r} missing or not a JSON {'object' if kind is dict else 'list'} "
                             "(damaged, or not a packer manifest); rebuild the dataset")
    for key in ("context_length", "token_dtype"):
        if key not in manifest["config"]:
            raise ValueError(f"{fs.redact(file)}: config.{key} missing (damaged); rebuild the dataset")
    if not isinstance(manifest["tokenizer"].get("vocab_size"), int):
        raise ValueError(f"{fs.redact(file)}: tokenizer.vocab_size missing (damaged); rebuild the dataset")


def tokenizer_file(path, manifest: dict):
    """The dataset's tokenizer.json, checked to be the one it was built with (its sha256 is the
    manifest's tokenizer.sha256): decoding with another shows wrong text, silently. None for a
    manifest that records no sha256 (written by hand); ValueError if missing or different."""
    path, tokenizer = fs.location(path), manifest.get("tokenizer", {})
    if "sha256" not in tokenizer:
        return None
    file = path / TOKENIZER
    if not file.is_file():
        raise ValueError(f"{fs.redact(file)} missing: the dataset's copy of its tokenizer; copy the build's tokenizer "
                         f"({tokenizer.get('path')}, sha256 {tokenizer['sha256']}) there, or rebuild")
    if sha256_file(file) != tokenizer["sha256"]:
        raise ValueError(f"{fs.redact(file)}: sha256 does not match the manifest's tokenizer.sha256 (another tokenizer: "
                         "decoding with it shows wrong text); restore the build's tokenizer, or rebuild")
    return file
