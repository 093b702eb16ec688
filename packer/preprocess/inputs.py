"""Inputs as the user names them (paths, globs, directories, URIs) -> the input files, in build order.

    ["corpus/", "extra/*.jsonl.gz", "s3://bucket/web/"]
        -> ["corpus/a.jsonl", "corpus/sub/b.parquet", "extra/x.jsonl.gz", "s3://bucket/web/part-0.jsonl"]

Each file keeps the name it was reached by (a URI stays a URI, credentials and query included:
it re-opens the file in a worker); every listing, stat and read goes through the place
`fs.location` resolves it to, once per input. Directories are walked in sorted order, hidden
entries (a name starting with ".") are skipped, symlinks (to files or directories) that stay
inside the directory are followed, a link that leads out of it is listed as itself (an
`OutsideLink`) and never followed, and a link that leads back to one of its own ancestors (a
loop would list the same files forever) is listed as itself, not walked. Every other entry is listed whatever it is (a FIFO, a README):
planning (readers.plan_units) refuses what cannot be read, before opening it, and that is
where `on_file_error` decides between failing and skipping. A directory written by HF
`datasets.save_to_disk` (it holds `state.json`) contributes only its `*.arrow` data files.

A glob is confined the same way, its root being its literal directory (the path before the first
component with `*?[`: "in" for `in/*.jsonl` and `in/**/x.jsonl`, "." for `*.jsonl`): a match that
resolves outside the root (a link to /elsewhere/private.jsonl, or reached through a linked
directory) is an `OutsideLink`, refused or skipped as in a directory; a matched directory is
walked with the glob's root.
"""

from __future__ import annotations

import errno
import glob
import json
import os

from packer.io import fs

HF_METADATA = ("state.json", "dataset_info.json", "dataset_dict.json")


def _join(parent: str, name: str) -> str:
    if not fs.is_uri(parent):
        return os.path.join(parent, name)
    base, sep, query = parent.partition("?")  # s3://b/dir?region=x + a -> s3://b/dir/a?region=x
    return base.rstrip("/") + "/" + name + sep + query


def _hf_data_files(directory: str, place, names: set[str]) -> list[str] | None:
    """The data files of a `save_to_disk` directory, or None when it is not one."""
    if "state.json" not in names:
        return None
    listed = [d["filename"] for d in json.loads((place / "state.json").read_bytes()).get("_data_files", [])]
    return [_join(directory, n) for n in (listed or sorted(n for n in names if n.endswith(".arrow")))]


class OutsideLink(str):
    """A listed name that is a symbolic link leading out of the input directory it was found in:
    never followed nor opened (a link to a private file would be tokenized into the shards, one to
    / would walk the filesystem); planning refuses it, or skips it under on_file_error=skip."""

    def __new__(cls, name: str, target: str, root: str):
        link = super().__new__(cls, name)
        link.target, link.root = target, root
        return link

    def __reduce__(self):
        return OutsideLink, (str(self), self.target, self.root)


def _realpath(path: str) -> str | None:
    """os.path.realpath, or None for a chain of links it cannot follow (it recurses once per link: a
    100,000-deep chain raised RecursionError); planning then names the link (link_problem)."""
    try:
        return os.path.realpath(path)
    except (RecursionError, OSError):
        return None


def _inside(real: str, root_real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def _outside(child: str, root_real: str | None) -> str | None:
    """The target of `child` when it is a local symlink resolving outside `root_real`, else None."""
    if root_real is None or not os.path.islink(child):
        return None
    target = _realpath(child)
    if target is None:
        return None  # listed as itself: planning names the chain (link_problem)
    return None if _inside(target, root_real) else target


def _walk(directory: str, place, ancestors: dict, root_real: str | None = None) -> list[str]:
    """Files under `directory` (its name) / `place` (where it is); `ancestors`: identity -> name;
    `root_real`: the input directory's real path (None remote: a store has no links)."""
    entries = sorted(fs.list_dir(place), key=lambda e: e[0])
    names = {name for name, _, _ in entries}
    hf = _hf_data_files(directory, place, names)
    if hf is not None:
        return hf
    files = []
    for name, is_dir, identity in entries:
        if name.startswith(".") or name in HF_METADATA:
            continue
        child = _join(directory, name)
        target = _outside(child, root_real)
        if target is not None:  # listed as itself, never followed: planning names it (or skips it)
            files.append(OutsideLink(child, target, root_real))
            continue
        if not is_dir:
            files.append(child)
            continue
        if identity in ancestors:  # a loop: planning names it (or skips it) like any bad file
            files.append(child)
            continue
        files.extend(_walk(child, place / name, {**ancestors, identity: child}, root_real))
    return files


def _glob_root(pattern: str) -> str:
    """The literal directory a glob starts from: "in" for in/*.jsonl, "." for *.jsonl, "/" for /*.jsonl."""
    head, parts = pattern, []
    while glob.has_magic(head):
        head, tail = os.path.split(head)
        parts.append(tail)
        if not head:
            return "."
    return head or os.sep


def link_problem(path: str) -> str | None:
    """Why a local name that is a symbolic link leads to no file, or None: a loop or a chain deeper than
    the system follows (40 links on Linux: ELOOP), or a link to nothing."""
    if fs.is_uri(path) or not os.path.islink(path):
        return None
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return (f"a symbolic link loop, or a chain of links deeper than the system follows ({path} -> "
                    f"{os.readlink(path)} -> ...): point the link at the file itself")
        if e.errno == errno.ENOENT:
            return f"a symbolic link to {os.readlink(path)}, which does not exist: fix or remove the link"
    return None


def _expand_one(item: str, root_real: str | None = None) -> list[str]:
    """The files `item` names; `root_real`: the real path of the glob it matched (its confinement)."""
    if root_real is None and not fs.is_uri(item) and glob.has_magic(item):
        matches = sorted(glob.glob(item, recursive=True))
        if not matches:
            raise FileNotFoundError(f"input pattern matched no files: {item}")
        root_real = os.path.realpath(_glob_root(item))
        files = []
        for match in matches:
            target = _realpath(match)
            if target is None:
                files.append(match)  # a chain too deep to follow: planning names it (link_problem)
            elif _inside(target, root_real):
                files.extend(_expand_one(match, root_real))
            else:  # listed as itself, never followed: planning names it (or skips it), as in a directory
                files.append(OutsideLink(match, target, root_real))
        return files
    place = fs.location(item)
    if item and place.is_dir():  # Path("") is the current directory: not an input
        if root_real is None:
            root_real = None if fs.is_uri(item) else os.path.realpath(item)
        return sorted(_walk(item, place, {fs.identity(place): item}, root_real))
    if place.is_file() or fs.not_regular(place):  # a FIFO named here is refused when planned, like one in a directory
        return [item]
    if root_real is not None and os.path.islink(item):
        return [item]  # a glob's match: planning names it (or skips it), as in a directory
    if (why := link_problem(item)) is not None:
        raise FileNotFoundError(f"input {item}: {why}")
    if fs.is_uri(item):
        raise FileNotFoundError(f"input not found: {fs.redact(item)}")
    raise FileNotFoundError(f"input not found: {item} (give a file, a directory, a glob or a URI)")


def expand_inputs(inputs) -> list[str]:
    """Files, directories, globs and URIs -> the list of input files, in build order."""
    files = [f for item in inputs for f in _expand_one(str(item))]
    if not files:
        raise FileNotFoundError(f"no input files found in {[fs.redact(str(i)) for i in inputs]}")
    return files
