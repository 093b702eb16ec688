"""The byte-level rule's verdicts, kept on disk by the tokenizer.json's sha256, so that a build of a
tokenizer checked before skips (S) (byte_level.py: tokenizers run over every token, ~0.25 s per
50,000 tokens, a tenth of a 50 MB build's wall time on 2 cores). A verdict is a fact about the
file's bytes, the rule and the tokenizers release that (S) runs, so it is named by all three:

    ~/.cache/packer/engine-rule/<sha256 of the file>-rule<RULE>-tokenizers<version>.json
        {"refused": ""}                           the file passed: a fast engine encodes it exactly
        {"refused": "3 tokens are not ..."}       why it did not (the file runs on hf)
    ~/.cache/packer/engine-rule/<the same>.ranks.npz
        the passed file's ranks (byte_level.RankedVocab): a build then neither parses the file's JSON
        nor replays its merges (~0.2 s per 50,000 tokens, a twentieth of a 60 MB tiktoken build)

PACKER_RULE_CACHE=DIR keeps them in DIR instead ($XDG_CACHE_HOME is honoured), PACKER_RULE_CACHE=off
keeps none. A verdict (or a passed file's ranks: the archive's CRCs) that cannot be read back whole
is checked again, and one that cannot be written is not kept: the directory only ever saves time,
it never changes a choice.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

RULE = 1  # raise it when byte_level's rule or its ranks change: what the old one kept is then not read


def get(data: bytes) -> str | dict | None:
    """The kept verdict for a tokenizer.json's bytes: why it was refused, the ranks it passed with
    (byte_level.RankedVocab's fields), or None (none kept, or not whole)."""
    path = _path(data)
    if path is None:
        return None
    try:
        refused = json.loads(path.read_text(encoding="utf-8"))["refused"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(refused, str):
        return None
    return refused or _ranks(_ranks_path(path))


def put(data: bytes, found: str | dict):
    """Keep the verdict: why the file was refused, or the fields of the ranks it passed with; a
    directory that cannot be written keeps nothing."""
    path = _path(data)
    if path is None:
        return
    from packer.io import atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not isinstance(found, str):  # the ranks first: a passed verdict is read only with them
            atomic.write_bytes(_ranks_path(path), _ranks_npz(**found))
        atomic.write_bytes(path, json.dumps({"refused": found if isinstance(found, str) else ""}).encode("utf-8"))
    except OSError:
        pass  # a read-only home: the next build checks again


def _ranks_path(path: Path) -> Path:
    return path.with_name(path.stem + ".ranks.npz")


def _ranks_npz(ranks: dict, ids: np.ndarray, pattern: str, nfc: bool) -> bytes:
    import io

    tokens = sorted(ranks, key=ranks.get)  # ranks are 0..n-1: the tokens in rank order
    ends = np.cumsum(np.fromiter(map(len, tokens), np.int64, len(tokens)))
    out = io.BytesIO()
    np.savez(out, tokens=np.frombuffer(b"".join(tokens), np.uint8), ends=ends, ids=ids, pattern=np.array(pattern),
             nfc=np.array(nfc))
    return out.getvalue()


def _ranks(path: Path) -> dict | None:
    """The ranks kept at `path`, or None: missing, or failing the archive's CRCs or shape."""
    import zipfile

    try:
        with np.load(path, allow_pickle=False) as kept:
            blob, ends, ids = kept["tokens"].tobytes(), kept["ends"].tolist(), kept["ids"]
            pattern, nfc = str(kept["pattern"]), bool(kept["nfc"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
        return None
    if len(ends) != len(ids) or (ends and ends[-1] != len(blob)):
        return None
    starts = [0, *ends[:-1]]
    return {"ranks": {blob[s:e]: rank for rank, (s, e) in enumerate(zip(starts, ends))}, "ids": ids,
            "pattern": pattern, "nfc": nfc}


def _path(data: bytes) -> Path | None:
    where = os.environ.get("PACKER_RULE_CACHE", "")
    if where.lower() == "off":
        return None
    if not where:
        where = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "packer" / "engine-rule"
    import tokenizers

    name = f"{hashlib.sha256(data).hexdigest()}-rule{RULE}-tokenizers{tokenizers.__version__}.json"
    return Path(where) / name
