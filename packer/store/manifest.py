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

import functools
import hashlib
import json
from pathlib import Path

from packer.io import fs
from packer.store import checks

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


def require_regular(file):
    """Refuse a dataset file that is a symbolic link or not a regular file (a FIFO, a device, a
    socket, a directory), by lstat before anything opens it: opening a FIFO blocks forever, and a
    link reads bytes from outside the dataset's directory. A missing file passes (the caller says
    it is missing); a remote object is always a plain object."""
    file = fs.location(file)
    if (target := fs.link_target(file)) is not None:
        raise ValueError(f"{file}: a symbolic link (to {target}), not a file of the dataset: a dataset's "
                         "files are regular files inside its directory; put the file itself there, or rebuild")
    if (kind := fs.not_regular(file)) is not None:
        raise ValueError(f"{file}: a {kind}, not a regular file (reading it could "
                         "block forever); restore the dataset's file, or rebuild")


MAX_DEPTH = 32  # deeper than any file packer writes (stats.json: 5): a deeper one is damaged or hostile


def load_json(file, fix: str):
    """A JSON file packer wrote, parsed as one `ValueError` line naming `file` and `fix` when it is
    not: undecodable, non-finite numbers (NaN, Infinity: no count or figure is one), or nested
    deeper than MAX_DEPTH (checked before parsing, so a 100,000-deep file is refused, not recursed)."""
    require_regular(file)
    return parse_json(fs.location(file).read_bytes(), file, fix)


def parse_json(data: bytes, file, fix: str):
    """load_json of bytes already read (`file` names them in the error)."""
    depth = _max_depth(data)
    if depth > MAX_DEPTH:
        raise ValueError(f"{fs.redact(file)}: JSON nested {depth} levels deep (packer writes at most {MAX_DEPTH}): "
                         f"damaged; {fix}")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{fs.redact(file)}: not readable JSON ({type(e).__name__}: {str(e)[:80]}): damaged; "
                         f"{fix}") from None


def _refuse_constant(name: str):
    raise ValueError(f"non-finite number {name}")


def _max_depth(data: bytes) -> int:
    """How deep brackets nest in JSON text, strings skipped (a linear scan: no recursion)."""
    import re

    text = re.sub(rb'"[^"\\]*(?:\\.[^"\\]*)*"', b"", data)  # strings hold no structure
    depth = deepest = 0
    for ch in re.findall(rb"[\[\]{}]", text):
        depth += 1 if ch in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    return deepest


@functools.lru_cache(maxsize=None)
def _validator(name: str):
    import jsonschema

    schema = json.loads((Path(__file__).parent.parent / name).read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def schema_error(value, schema: str) -> str | None:
    """The first place `value` breaks `schema` (a path under packer/: "store/manifest_schema.json"),
    as 'config.context_length: 'x' is not of type 'integer'', or None."""
    error = next(iter(sorted(_validator(schema).iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))),
                 None)
    if error is None:
        return None
    where = ".".join(map(str, error.absolute_path)) or "the top level"
    return f"{where}: {error.message[:120]}"


def read_manifest(path) -> dict:
    return load_manifest(path)[0]


def load_manifest(path) -> tuple[dict, str]:
    """(the manifest of the dataset at `path` (a directory, or its manifest.json), its generation:
    the sha256 of the manifest's bytes), checked against manifest_schema.json and for ids inside the
    vocabulary: a wrong type, a non-finite or absurd value is one ValueError line naming the file and the key."""
    path = fs.location(path)
    file = path / MANIFEST if path.is_dir() else path
    require_regular(file)
    if not file.is_file():
        raise FileNotFoundError(
            f"no {MANIFEST} in {fs.redact(path)}: not a packer dataset, or its build did not finish "
            "(run the same `packer build` command again to resume it)"
        )
    fix = "restore it or rebuild the dataset"
    require_regular(file)
    raw = file.read_bytes()
    manifest = parse_json(raw, file, fix)
    problem = (schema_error(manifest, "store/manifest_schema.json") or _range_problem(manifest)
               or checks.manifest_problem(manifest))
    if problem is not None:
        raise ValueError(f"{fs.redact(file)}: {problem} (damaged or edited, or not a packer manifest); {fix}")
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


def read_stats(file) -> dict:
    """A dataset's stats.json, checked against packer/stats/stats_schema.json (one ValueError line)."""
    fix = "rebuild, or run `packer stats` on the dataset"
    stats = load_json(file, fix)
    problem = schema_error(stats, "stats/stats_schema.json")
    if problem is not None:
        raise ValueError(f"{fs.redact(file)}: {problem} (damaged or edited); {fix}")
    return stats


DTYPE_IDS = {"uint16": 2**16, "uint32": 2**32}  # how many token ids each token_dtype holds


def _range_problem(manifest: dict) -> str | None:
    """What a schema cannot say: the special ids below the vocabulary size, the vocabulary within the dtype."""
    config, vocab = manifest["config"], manifest["tokenizer"]["vocab_size"]
    if vocab > DTYPE_IDS[config["token_dtype"]]:
        return f"tokenizer.vocab_size {vocab} does not fit config.token_dtype {config['token_dtype']}"
    for key in ("eos_id", "bos_id", "pad_id"):
        if config.get(key) is not None and config[key] >= vocab:
            return f"config.{key} {config[key]} is outside the vocabulary (tokenizer.vocab_size {vocab})"
    return None


def tokenizer_file(path, manifest: dict):
    """The dataset's tokenizer.json, checked to be the one it was built with (its sha256 is the
    manifest's tokenizer.sha256): decoding with another shows wrong text, silently. None for a
    manifest that records no sha256 (written by hand); ValueError if missing or different."""
    path, tokenizer = fs.location(path), manifest.get("tokenizer", {})
    if "sha256" not in tokenizer:
        return None
    file = path / TOKENIZER
    require_regular(file)
    if not file.is_file():
        raise ValueError(f"{fs.redact(file)} missing: the dataset's copy of its tokenizer; copy the build's tokenizer "
                         f"({tokenizer.get('path')}, sha256 {tokenizer['sha256']}) there, or rebuild")
    if sha256_file(file) != tokenizer["sha256"]:
        raise ValueError(f"{fs.redact(file)}: sha256 does not match the manifest's tokenizer.sha256 (another tokenizer: "
                         "decoding with it shows wrong text); restore the build's tokenizer, or rebuild")
    return file
