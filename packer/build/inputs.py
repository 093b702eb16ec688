"""Where input bytes come from: paths, globs, directories and pyarrow.fs URIs, expanded to files and opened.

    ["corpus/", "extra/*.jsonl.gz", "s3://bucket/web/"]
        -> ["corpus/a.jsonl", "corpus/sub/b.parquet", "extra/x.jsonl.gz", "s3://bucket/web/part-0.jsonl"]

Directories are walked in sorted order, hidden entries (a name starting with ".") are
skipped, symlinked directories are followed and a link that leads back to one of its own
ancestors is an error (a loop would list the same files forever). A directory written by
HF `datasets.save_to_disk` (it holds `state.json`) contributes only its `*.arrow` data files.
Anything with "://" is a URI and goes through `pyarrow.fs` (file://, s3://, gs://, hdfs://, ...),
or fsspec for a scheme pyarrow does not know (packer/io/fs.py).
"""

from __future__ import annotations

import glob
import json
import os
import stat

HF_METADATA = ("state.json", "dataset_info.json", "dataset_dict.json")


def is_uri(path: str) -> bool:
    return "://" in path


def _redact(path: str) -> str:
    from packer.io import fs

    return fs.redact(path)  # the URI without its credentials, for messages


def _filesystem(uri: str):
    from packer.io import fs

    return fs.resolve(uri)  # pyarrow.fs, else an fsspec protocol; ValueError naming the URI


def _join(parent: str, name: str) -> str:
    if not is_uri(parent):
        return os.path.join(parent, name)
    base, sep, query = parent.partition("?")  # s3://b/dir?region=x + a -> s3://b/dir/a?region=x
    return base.rstrip("/") + "/" + name + sep + query


def _list_local(path: str):
    """(name, is_dir, identity) of each entry; symlinks followed, identity = (device, inode)."""
    out = []
    for entry in os.scandir(path):
        try:
            st = os.stat(entry.path)  # follows symlinks
        except OSError:  # a dangling link is listed as a file; opening it fails with a clear error
            out.append((entry.name, False, None))
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        out.append((entry.name, is_dir, (st.st_dev, st.st_ino) if is_dir else None))
    return out


def _list_uri(uri: str):
    from pyarrow import fs

    filesystem, path = _filesystem(uri)
    infos = filesystem.get_file_info(fs.FileSelector(path, recursive=False))
    return [(i.base_name, i.type == fs.FileType.Directory, _join(uri, i.base_name)) for i in infos]


def _hf_data_files(directory: str, names: set[str]) -> list[str] | None:
    """The data files of a `save_to_disk` directory, or None when it is not one."""
    if "state.json" not in names:
        return None
    with open_random(_join(directory, "state.json")) as f:
        listed = [d["filename"] for d in json.loads(f.read()).get("_data_files", [])]
    return [_join(directory, n) for n in (listed or sorted(n for n in names if n.endswith(".arrow")))]


def _walk(directory: str, ancestors: dict, lister) -> list[str]:
    entries = sorted(lister(directory))
    names = {name for name, _, _ in entries}
    hf = _hf_data_files(directory, names)
    if hf is not None:
        return hf
    files = []
    for name, is_dir, identity in entries:
        if name.startswith(".") or name in HF_METADATA:
            continue
        child = _join(directory, name)
        if not is_dir:
            files.append(child)
            continue
        if identity in ancestors:
            raise ValueError(
                f"symlink loop: {_redact(child)} leads back to {_redact(ancestors[identity])} "
                "(remove the link, or list the inputs without it)"
            )
        files.extend(_walk(child, {**ancestors, identity: child}, lister))
    return files


def _expand_one(item: str) -> list[str]:
    if is_uri(item):
        from pyarrow import fs

        filesystem, path = _filesystem(item)
        info = filesystem.get_file_info(path)
        if info.type == fs.FileType.Directory:
            return sorted(_walk(item, {item: item}, _list_uri))
        if info.type == fs.FileType.File:
            return [item]
        raise FileNotFoundError(f"input not found: {_redact(item)}")
    if any(ch in item for ch in "*?["):
        matches = sorted(glob.glob(item, recursive=True))
        if not matches:
            raise FileNotFoundError(f"input pattern matched no files: {item}")
        return [f for m in matches for f in _expand_one(m)]
    if os.path.isdir(item):
        st = os.stat(item)
        return sorted(_walk(item, {(st.st_dev, st.st_ino): item}, _list_local))
    if os.path.isfile(item):
        return [item]
    raise FileNotFoundError(f"input not found: {item} (give a file, a directory, a glob or a URI)")


def expand_inputs(inputs) -> list[str]:
    """Files, directories, globs and URIs -> the list of input files, in build order."""
    files = [f for item in inputs for f in _expand_one(str(item))]
    if not files:
        raise FileNotFoundError(f"no input files found in {[_redact(str(i)) for i in inputs]}")
    return files


def file_size(path: str) -> int:
    if is_uri(path):
        filesystem, p = _filesystem(path)
        return filesystem.get_file_info(p).size
    return os.path.getsize(path)


def file_stamp(path: str) -> dict:
    """Size and modification time, to notice a changed input; None for a file that cannot be read."""
    try:
        if is_uri(path):
            filesystem, p = _filesystem(path)
            info = filesystem.get_file_info(p)
            return {"bytes": info.size, "mtime_ns": info.mtime_ns}
        st = os.stat(path)
        return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    except OSError:
        return {"bytes": None, "mtime_ns": None}


def open_random(path: str):
    """A seekable binary file with read(n): a plain file locally, a pyarrow RandomAccessFile for URIs."""
    if is_uri(path):
        filesystem, p = _filesystem(path)
        return filesystem.open_input_file(p)
    return open(path, "rb")


def open_arrow(path: str):
    """A pyarrow RandomAccessFile (for Parquet and Arrow IPC readers)."""
    import pyarrow as pa

    if is_uri(path):
        filesystem, p = _filesystem(path)
        return filesystem.open_input_file(p)
    return pa.memory_map(path)


def open_stream(path: str, compression: str | None = None):
    """A (possibly decompressing) binary stream with read(n)."""
    import pyarrow as pa

    if compression is None:
        return open_random(path)
    if is_uri(path):
        filesystem, p = _filesystem(path)
        raw = filesystem.open_input_stream(p, compression=None)  # not 'detect': we decompress
    else:
        raw = pa.OSFile(path)
    return pa.CompressedInputStream(raw, compression)
