"""The byte-level rule's verdicts, kept on disk by the tokenizer.json's sha256, so that a build of a
tokenizer checked before skips (S) (byte_level.py: tokenizers run over every token, ~0.25 s per
50,000 tokens, a tenth of a 50 MB build's wall time on 2 cores). A verdict is a fact about the
file's bytes, the rule and the tokenizers release that (S) runs, so it is named by all three:

    ~/.cache/packer/engine-rule/<sha256 of the file>-rule<RULE>-tokenizers<version>.json
        {"refused": ""}                           the file passed (S): a fast engine encodes it exactly
        {"refused": "3 tokens are not ..."}       why it did not (the file runs on hf)

PACKER_RULE_CACHE=DIR keeps them in DIR instead ($XDG_CACHE_HOME is honoured), PACKER_RULE_CACHE=off
keeps none. A verdict that cannot be read back whole is checked again, and one that cannot be
written is not kept: the directory only ever saves time, it never changes a token.

Only the verdict is kept, never what an engine encodes with. Rule 1 also kept a passed file's ranks
(`.ranks.npz`, to spare the merges' replay, ~0.2 s per 50,000 tokens); rewritten with valid CRCs (ids
swapped or shifted, the split regex replaced) they changed every later build's ids. Kept ranks can be
checked against the loaded tokenizer's vocabulary (every id), but not their order without the file's
merges, and two merged tokens swapped with their ids (which binds to the vocabulary) changed sample
ids unseen by the probe; reading the merges is most of what making the ranks costs (2026-12-05,
sample tokenizer, 16,384 tokens: parse 9 ms, ranks made 20 ms in all, a vocabulary check alone 12
ms). So the ranks are made from the tokenizer.json on every build (byte_level.ranked_vocab_at) and
a verdict binds to the file by its name, the sha256.

A verdict is read only from a directory and a file of this user's alone: owned by this uid, no group
or other write bit, not a link (another user's, or one others may write, is absent: neither read nor
written; `chmod go-w DIR` or remove it). What a verdict of "passed" could still hide (a file that
breaks (S), said to pass by this user's own hand) the probe sees where it matters: before a build uses
a fast engine, every process encodes a probe text with it and with `tokenizers`
(engines/__init__.py probe_difference); unequal, the verdict is dropped and the file checked again.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

RULE = 2  # raise it when byte_level's rule changes: what the old one kept is then not read (2: no ranks kept)


def get(data: bytes) -> str | None:
    """The kept verdict for a tokenizer.json's bytes: why it was refused ("" for passed), or None
    (none kept, not whole, or not this user's alone)."""
    path = _path(data)
    if path is None or not _trusted(path.parent):
        return None
    try:
        refused = json.loads(_read_own(path).decode("utf-8"))["refused"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return refused if isinstance(refused, str) else None


def put(data: bytes, refused: str):
    """Keep the verdict (why the file was refused, "" for passed); a directory that cannot be written,
    or that is not this user's alone, keeps nothing."""
    path = _path(data)
    if path is None:
        return
    try:
        if not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.parent.chmod(0o700)  # this user's alone, whatever the umask
        if not _trusted(path.parent):
            return  # another user's, or one others may write: never read, never written
        from packer.io import atomic

        atomic.write_bytes(path, json.dumps({"refused": refused}).encode("utf-8"))
        path.chmod(0o600)  # a umask of 002 would leave it group-writable: then never read back
    except OSError:
        pass  # a read-only home: the next build checks again


def drop(data: bytes):
    """Forget the verdict kept for these bytes (the probe found other ids): the next look checks the file."""
    path = _path(data)
    if path is not None and _trusted(path.parent):
        try:
            path.unlink()
        except OSError:
            pass


def _own(st: os.stat_result) -> bool:
    """Owned by this user, and no one else may write it."""
    mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return mine and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _trusted(directory: Path) -> bool:
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and _own(st)


def _read_own(path: Path) -> bytes:
    """The bytes of `path`, a regular file of this user's alone (else OSError): opened without following
    a link or waiting on a FIFO, then checked on the open file itself."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not (stat.S_ISREG(st.st_mode) and _own(st)) or st.st_size > 1 << 20:
            raise OSError(f"{path}: not a small file of this user's alone")
        return f.read()


def _path(data: bytes) -> Path | None:
    where = os.environ.get("PACKER_RULE_CACHE", "")
    if where.lower() == "off":
        return None
    if not where:
        where = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "packer" / "engine-rule"
    import tokenizers

    name = f"{hashlib.sha256(data).hexdigest()}-rule{RULE}-tokenizers{tokenizers.__version__}.json"
    return Path(where) / name
