"""What a build may do with the output directory it finds: resume it, skip it, or refuse.

    OUTPUT/_work/fingerprint.json   {"config": {...}, "tokenizer_sha256": "...",
                                     "inputs": [{"path", "bytes", "mtime_ns"}, ...]}

The fingerprint is written before any unit; a later run resumes `_work/` only when its
own fingerprint is equal, since unit files from another config or other inputs would mix
into the output. Worker count is not part of it: it does not change the bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from packer.io import atomic, fs
from packer.preprocess import owned
from packer.store import formats

FINGERPRINT = "fingerprint.json"


RUN_ONLY_KEYS = ("strict", "on_file_error", "max_skip_fraction", "encode_engine")


def _stamp(path) -> dict:
    """Size and modification time, to notice a changed input; None for a file that cannot be read."""
    try:
        size, mtime_ns = fs.stamp(path)
    except OSError:
        size = mtime_ns = None
    return {"bytes": size, "mtime_ns": mtime_ns}


def fingerprint(config, info, files) -> dict:
    # redacted: new credentials for the same data resume it, and none are written to disk
    inputs = [{"path": fs.redact(str(f)), **_stamp(f)} for f in files]
    # strict / on_file_error only decide whether a bad input stops the run; a failed unit leaves no
    # unit file, so resuming with the other choice (the usual fix for a corrupt file) is safe. Every
    # encode engine gives the same ids (packer/encode/engines): a resume may switch engines.
    settings = {k: v for k, v in config.to_dict().items() if k not in RUN_ONLY_KEYS}
    out = {"config": settings, "tokenizer_sha256": info.sha256, "inputs": inputs}
    if (template := _chat_template_sha256(config, info)) is not None:  # it decides the masks: another one is other work
        out["chat_template_sha256"] = template
    return out


def _chat_template_sha256(config, info) -> str | None:
    """sha256 of the chat template a chat (or auto) build would render with; None for other kinds, or
    when the tokenizer has none (an auto build of other records then never renders one)."""
    if getattr(config, "input_kind", "text") not in ("chat", "auto"):
        return None
    from packer.encode.chat_source import chat_template_of

    try:
        source, _ = chat_template_of(info.path, config.chat_template)
    except (ValueError, OSError):
        return None
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def _first_difference(old, new, where: str = ""):
    """(where, old, new) of the first difference between two JSON values, or None."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            found = _first_difference(old.get(key), new.get(key), f"{where}.{key}" if where else key)
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            found = _first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if old == new else (where, old, new)


def _short(value) -> str:
    text = fs.redact_text(repr(value))
    return text if len(text) <= 80 else text[:77] + "..."


def same_work(work, expected: dict) -> bool:
    """True when `work` holds a fingerprint equal to `expected`: this command's own unfinished work."""
    path = work / FINGERPRINT
    try:
        return _first_difference(json.loads(path.read_text(encoding="utf-8")), expected) is None
    except (OSError, ValueError):
        return False


def start_or_resume(work: Path, expected: dict):
    """Create `work` with its fingerprint, or check the one there; ValueError on a mismatch."""
    path = work / FINGERPRINT
    if path.exists():
        found = _first_difference(json.loads(path.read_text(encoding="utf-8")), expected)
        if found:
            where, old, new = found
            raise ValueError(
                f"{fs.redact(work)} belongs to an unfinished build with other settings or inputs ({where}: "
                f"{_short(old)} there, {_short(new)} now); rerun the original command to resume it, "
                f"or pass --overwrite to discard it and start over"
            )
        return
    if work.exists() and any(p.name != "units" or any(p.iterdir()) for p in work.iterdir()):
        raise ValueError(f"{fs.redact(work)} has no {FINGERPRINT}, so it cannot be resumed safely; pass --overwrite to start over")
    work.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, expected)


def require_same_dataset(manifest: dict, config, info, files, out: Path):
    """A complete dataset is only 'already complete' for the command that built it."""
    from packer.preprocess import readers

    settings = {k: v for k, v in config.to_dict().items() if k not in RUN_ONLY_KEYS}  # as in fingerprint()
    old = {
        "config": {k: manifest["config"].get(k) for k in settings},
        "tokenizer_sha256": manifest["tokenizer"]["sha256"],
        "inputs": manifest["inputs"],
    }
    new = {"config": settings, "tokenizer_sha256": info.sha256, "inputs": readers.input_descriptions(files)}
    found = _first_difference(old, new)
    if found:
        where, a, b = found
        raise ValueError(
            f"{fs.redact(out)} already holds a complete dataset built differently ({where}: {_short(a)} there, "
            f"{_short(b)} now); pass --overwrite to replace it, or choose another --output"
        )


def refuse_foreign(out: Path, record: dict | None = None):
    """Refuse an output directory holding files packer did not write (nothing is deleted): files
    its record (packer/preprocess/owned.py) does not list with their sha256, a _work/ it did not make."""
    found = owned.foreign(out, owned.load(out) if record is None else record)
    if found:
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise ValueError(
            f"{fs.redact(out)} holds files packer did not write ({shown}); packer never deletes or replaces them: "
            f"move them elsewhere, or choose a new or empty --output"
        )


def missing_files(out, manifest: dict) -> list[str]:
    """The files the complete dataset's manifest names that `out` no longer holds (`rm shard-00002.bin`),
    found by one listing of the directory: whether they are whole is `packer verify`'s question."""
    from packer.io import fs

    try:
        present = {name for name, _, _ in fs.list_dir(out)}
    except OSError:
        return []
    fmt = formats.manifest_format(manifest["config"])
    named = [name for files in formats.manifest_files(fmt, manifest["shards"]) for name, _ in files]
    return [name for name in named if name not in present]

