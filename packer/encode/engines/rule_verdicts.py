"""The byte-level rule's verdicts, kept on disk by the tokenizer.json's sha256, so that a build of a
tokenizer checked before skips (S) (byte_level.py: tokenizers run over every token, ~0.25 s per
50,000 tokens, a tenth of a 50 MB build's wall time on 2 cores). A verdict is a fact about the
file's bytes, the rule and the tokenizers release that (S) runs, so it is named by all three:

    ~/.cache/packer/engine-rule/<sha256 of the file>-rule<RULE>-tokenizers<version>.json
        {"refused": ""}                           the file passed: a fast engine encodes it exactly
        {"refused": "3 tokens are not ..."}       why it did not (the file runs on hf)

PACKER_RULE_CACHE=DIR keeps them in DIR instead ($XDG_CACHE_HOME is honoured), PACKER_RULE_CACHE=off
keeps none. A verdict that cannot be read back whole is checked again, and one that cannot be
written is not kept: the directory only ever saves time, it never changes a choice.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

RULE = 1  # raise it when byte_level's rule changes: verdicts of the old rule are then not read


def get(data: bytes) -> str | None:
    """The kept verdict for a tokenizer.json's bytes: "" (passed), why it was refused, or None (none kept)."""
    path = _path(data)
    if path is None:
        return None
    try:
        refused = json.loads(path.read_text(encoding="utf-8"))["refused"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return refused if isinstance(refused, str) else None


def put(data: bytes, refused: str):
    """Keep the verdict ("" for passed); a directory that cannot be written keeps nothing."""
    path = _path(data)
    if path is None:
        return
    from packer.io import atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(path, json.dumps({"refused": refused}).encode("utf-8"))
    except OSError:
        pass  # a read-only home: the next build checks again


def _path(data: bytes) -> Path | None:
    where = os.environ.get("PACKER_RULE_CACHE", "")
    if where.lower() == "off":
        return None
    if not where:
        where = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "packer" / "engine-rule"
    import tokenizers

    name = f"{hashlib.sha256(data).hexdigest()}-rule{RULE}-tokenizers{tokenizers.__version__}.json"
    return Path(where) / name
