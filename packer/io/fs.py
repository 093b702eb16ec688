"""Places: where inputs, a build's work directory and output live: a local path, or any pyarrow.fs / fsspec URI.

    location("out/ds")              -> Path("out/ds")               local: renames, memory maps, flock
    location("file:///data/ds")     -> Path("/data/ds")             (any pyarrow LocalFileSystem URI)
    location("s3://bucket/ds")      -> RemotePath(S3FileSystem, "bucket/ds")
    location("memory://ds")         -> RemotePath(PyFileSystem(FSSpecHandler(memory)), "/ds")

A URI is resolved by `pyarrow.fs.FileSystem.from_uri` first; a scheme pyarrow does not know
goes to fsspec when fsspec has it (gcsfs, adlfs, memory, ...). `RemotePath` answers the few
pathlib calls packer makes (`/`, name, exists, is_dir, iterdir, mkdir, unlink, read/write).
A remote filesystem has no rename: files are written straight to their final names, and a
marker written after them (a unit's .json, a shard's _work/shards/*.json, the manifest) is what
says they are complete.

Inputs are read through the same two types: `open_stream` (plain or decompressed), `open_arrow`
(Parquet, Arrow IPC), `size`, `stamp`, and `list_dir` + `identity` to walk a directory.

Credentials a user puts in a URI are used to open it and nothing else: what packer writes
(manifest, stats, fingerprint, unit markers) and prints or raises goes through `redact`:

    redact("s3://AKIA:SECRET@bucket/ds?region=x")           -> "s3://***@bucket/ds?region=x"
    redact("abfs://acct.dfs.core.windows.net/c?sig=S&sv=1") -> "abfs://acct.dfs.core.windows.net/c?sig=***&sv=1"
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import stat as stat_module
import weakref
from pathlib import Path

from packer.io.redact import redact, redact_json, redact_text  # noqa: F401  (the names callers import from fs)

COPY_CHUNK = 8 * 2**20

def is_uri(loc) -> bool:
    return isinstance(loc, str) and "://" in loc


PYARROW_SCHEMES = ("file", "local", "mock", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")


def resolve(uri: str):
    """(filesystem, path) of a URI: pyarrow's own schemes, else an fsspec protocol. An S3 filesystem
    is made with the retry policy's per-try timeout (packer/io/retry.py), read now from the environment."""
    from packer.io import retry

    return _resolve(uri, retry.policy().timeout)


@functools.lru_cache(maxsize=64)
def _resolve(uri: str, timeout: float):
    from pyarrow import fs as pafs

    protocol = uri.split("://", 1)[0].lower()
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
        return _as_policy_says(filesystem, timeout), path
    except Exception as e:  # ArrowInvalid for a scheme pyarrow does not know, OSError for a bad host
        if protocol in PYARROW_SCHEMES:
            raise ValueError(f"cannot open {redact(uri)}: {redact_text(e)}") from None
        first = e
    try:
        import fsspec

        filesystem = fsspec.filesystem(protocol)
    except Exception:
        raise ValueError(
            f"cannot open {redact(uri)}: {redact_text(first)} (give a local path, a URI pyarrow.fs opens, "
            f"or one an installed fsspec implementation opens)"
        ) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem)), filesystem._strip_protocol(uri)


def _as_policy_says(filesystem, timeout: float):
    """An S3 filesystem made again with pyarrow's own retries off (one try per request) and the
    policy's timeout: packer's retry policy is the one that runs (packer/io/retry.py). Under it,
    pyarrow's 3 tries with their own waits made a persistent 503 take 39 s instead of 3; and the
    AWS SDK's own request timeout (3 s without a byte, curl's low-speed limit, on Linux too) failed
    every try of a store that answers in 5 s, whatever PACKER_REMOTE_TIMEOUT said. The connect
    timeout is the same (the SDK's is 1 s). Other filesystems as they are."""
    from pyarrow import fs as pafs

    if not isinstance(filesystem, pafs.S3FileSystem):
        return filesystem
    rebuild, (options,) = filesystem.__reduce__()
    options = {k: v for k, v in options.items() if v is not None}
    for key in ("request_timeout", "connect_timeout"):  # -1: not given in the URI
        if options.get(key, -1) < 0:
            options[key] = timeout
    return pafs.S3FileSystem(**options, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))


def location(loc):
    """A local path or URI -> a `Path` (local filesystems) or a `RemotePath` (all others)."""
    if isinstance(loc, (Path, RemotePath)):
        return loc
    loc = os.fspath(loc)
    if not is_uri(loc):
        return Path(loc)
    from pyarrow import fs as pafs

    filesystem, path = resolve(loc)
    if isinstance(filesystem, pafs.LocalFileSystem):
        return Path(path)
    return RemotePath(loc, filesystem, path)


def is_remote(loc) -> bool:
    return isinstance(location(loc), RemotePath)


def is_process_local(loc) -> bool:
    """True for fsspec's memory:// store, which worker processes do not share."""
    loc = location(loc)
    handler = getattr(getattr(loc, "fs", None), "handler", None)
    protocol = getattr(getattr(handler, "fs", None), "protocol", None)
    return protocol == "memory" or (isinstance(protocol, tuple) and "memory" in protocol)


class RemotePath:
    """A file or directory on a non-local pyarrow filesystem (`uri` as given, `path` inside `fs`)."""

    def __init__(self, uri: str, filesystem, path: str):
        self.uri, self.fs, self.path = uri, filesystem, path

    def __truediv__(self, name: str) -> "RemotePath":
        base, sep, query = self.uri.partition("?")  # s3://b/ds?region=x / "a" -> s3://b/ds/a?region=x
        return RemotePath(f"{base.rstrip('/')}/{name}{sep}{query}", self.fs, f"{self.path.rstrip('/')}/{name}")

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"RemotePath({redact(self.uri)!r})"  # str() keeps the credentials: it re-opens the path

    def __eq__(self, other) -> bool:
        return isinstance(other, RemotePath) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __lt__(self, other: "RemotePath") -> bool:
        return self.uri < other.uri

    def __reduce__(self):
        return location, (self.uri,)  # re-resolved where it is unpickled

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> "RemotePath":
        base, sep, query = self.uri.partition("?")
        return RemotePath(base.rstrip("/").rsplit("/", 1)[0] + sep + query, self.fs, self.path.rstrip("/").rsplit("/", 1)[0])

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix

    def _info(self):
        return _retried(lambda: self.fs.get_file_info(self.path), self)

    def exists(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type != FileType.NotFound

    def is_dir(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.Directory

    def is_file(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.File

    def size(self) -> int:
        return self._info().size

    def stamp(self) -> tuple:
        info = self._info()
        return info.size, info.mtime_ns

    def iterdir(self):
        from pyarrow.fs import FileSelector

        infos = self.fs.get_file_info(FileSelector(self.path, allow_not_found=True))
        return [self / i.base_name for i in sorted(infos, key=lambda i: i.base_name)]

    def mkdir(self, parents: bool = False, exist_ok: bool = False):
        if self.exists() and not exist_ok:
            raise FileExistsError(f"{redact(self.uri)} already exists")
        self.fs.create_dir(self.path, recursive=parents)

    def unlink(self, missing_ok: bool = False):
        if missing_ok and not self.exists():
            return
        self.fs.delete_file(self.path)

    def read_bytes(self) -> bytes:
        def read():
            with self.fs.open_input_stream(self.path, compression=None) as f:  # not 'detect': bytes as stored
                return f.read()

        return _retried(read, self)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data):
        with self.fs.open_output_stream(self.path, compression=None) as f:
            f.write(data)

    def write_text(self, text: str, encoding: str = "utf-8"):
        self.write_bytes(text.encode(encoding))

    def open_input(self):
        """A pyarrow RandomAccessFile: read_at(nbytes, offset), seek, read."""
        return self.fs.open_input_file(self.path)

    def open_output(self):
        """A pyarrow output stream; on object stores the object appears when it is closed."""
        return self.fs.open_output_stream(self.path, compression=None)  # a .gz name is not gzipped again

    def open(self, mode: str = "rb"):
        """`Path.open("rb")`'s twin, so readers open either place the same way: a pyarrow
        RandomAccessFile (seek, tell, read(n))."""
        if mode != "rb":
            raise ValueError(f"RemotePath.open reads only (mode 'rb'), got {mode!r}; write with open_output()")
        return self.open_input()


def _retried(call, where):
    """A remote read under the one retry policy (packer/io/retry.py); a missing object or a refused
    permission raised as it is."""
    from packer.io import retry

    return retry.retried(call, where, reword=False)


Place = Path | RemotePath  # what `location` gives: inner code takes a Place, never a string to resolve again


def rmtree(loc):
    loc = location(loc)
    if isinstance(loc, RemotePath):
        loc.fs.delete_dir(loc.path)
    else:
        shutil.rmtree(loc)


def upload(local_file, dst: RemotePath):
    """Copy a local file (a path, or a binary file object read from where it stands) to `dst`,
    streamed, not read whole."""
    with contextlib.ExitStack() as stack:
        src = local_file if hasattr(local_file, "read") else stack.enter_context(open(local_file, "rb"))
        out = stack.enter_context(dst.open_output())
        shutil.copyfileobj(src, out, COPY_CHUNK)


def move(src: Place, dst: Place):
    """Move a file within one filesystem: a rename locally, the store's copy and delete remotely
    (an object store has no rename)."""
    if isinstance(dst, RemotePath):
        dst.fs.move(src.path, dst.path)
    else:
        os.replace(src, dst)


def load_npy(loc):
    """A .npy file's array: memory-mapped read-only locally (pages read when touched), read whole
    from a remote filesystem (nothing remote can be mapped)."""
    import numpy as np

    loc = location(loc)
    if isinstance(loc, RemotePath):
        return np.load(io.BytesIO(loc.read_bytes()))
    return np.load(loc, mmap_mode="r")


def for_numpy(loc):
    """What np.load takes: the path itself locally, the file's bytes for a remote one."""
    loc = location(loc)
    return io.BytesIO(loc.read_bytes()) if isinstance(loc, RemotePath) else loc


_MAPPED: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()  # map_bytes: file version -> its mapping


def map_bytes(loc):
    """A file's bytes as a read-only uint8 array: memory-mapped locally (no page read until touched),
    read whole from a remote filesystem (nothing remote can be mapped). Plain ndarray views of one
    mapping: slicing a np.memmap subclass object costs more."""
    import numpy as np

    loc = location(loc)
    if isinstance(loc, RemotePath):
        return np.frombuffer(loc.read_bytes(), dtype=np.uint8)
    st = os.stat(loc)
    if st.st_size == 0:  # mmap cannot map an empty file
        return np.zeros(0, np.uint8)
    # One mapping per file version while anything holds it: a reader that checks a shard's bytes and
    # the format that reads rows from them touch (page-fault) the same pages once, not twice.
    key = (os.path.abspath(loc), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    mapped = _MAPPED.get(key)
    if mapped is None:
        mapped = _MAPPED[key] = np.memmap(loc, dtype=np.uint8, mode="r").view(np.ndarray)
    return mapped


def stamp(loc) -> tuple:
    """(size, mtime_ns), to tell one version of a file from the next."""
    loc = location(loc)
    if isinstance(loc, RemotePath):
        return loc.stamp()
    st = os.stat(loc)
    return st.st_size, st.st_mtime_ns


def open_arrow(loc, mapped: bool = True):
    """A pyarrow RandomAccessFile: a memory map locally (mapped=False: a plain file, whose reads are
    copies, freed with them), the remote file otherwise (read on demand)."""
    import pyarrow as pa

    loc = location(loc)
    if isinstance(loc, RemotePath):
        return loc.open_input()
    return pa.memory_map(str(loc), "r") if mapped else pa.OSFile(str(loc))


def size(loc) -> int:
    """A file's size in bytes; FileNotFoundError when it is not there (remote too)."""
    loc = location(loc)
    if isinstance(loc, RemotePath):
        n = loc.size()
        if n is None:
            raise FileNotFoundError(f"not found: {redact(loc)}")
        return n
    return os.path.getsize(loc)


def open_stream(loc, compression: str | None = None):
    """A binary stream with read(n), decompressed when `compression` ("gzip", "zstd") is given;
    uncompressed it is `loc.open("rb")`, seekable."""
    import pyarrow as pa

    loc = location(loc)
    if compression is None:
        return loc.open("rb")
    if isinstance(loc, RemotePath):
        raw = loc.fs.open_input_stream(loc.path, compression=None)  # not 'detect': the caller names it
    else:
        raw = pa.OSFile(str(loc))
    return pa.CompressedInputStream(raw, compression)


def list_dir(loc) -> list[tuple[str, bool, object]]:
    """(name, is_dir, identity) of each entry of a directory, in no set order, in one listing.
    Symlinks are followed; `identity` tells directories apart to catch a link loop: (device,
    inode) locally, the URI on a remote store (which has no links), None for a file. A dangling
    link is listed as a file: opening it fails with a clear error."""
    loc = location(loc)
    if isinstance(loc, RemotePath):
        from pyarrow.fs import FileSelector, FileType

        infos = loc.fs.get_file_info(FileSelector(loc.path, recursive=False))
        return [(i.base_name, i.type == FileType.Directory, (loc / i.base_name).uri if i.type == FileType.Directory
                 else None) for i in infos]
    out = []
    for entry in os.scandir(loc):
        try:
            st = os.stat(entry.path)  # follows symlinks
        except OSError:
            out.append((entry.name, False, None))
            continue
        is_dir = stat_module.S_ISDIR(st.st_mode)
        out.append((entry.name, is_dir, (st.st_dev, st.st_ino) if is_dir else None))
    return out


def identity(loc):
    """What tells one directory from another through links: (device, inode) locally, the URI on
    a remote store (which has no links). The `identity` of `list_dir`'s entries."""
    loc = location(loc)
    if isinstance(loc, RemotePath):
        return loc.uri
    st = os.stat(loc)
    return st.st_dev, st.st_ino


_KINDS = ((stat_module.S_ISDIR, "directory"), (stat_module.S_ISFIFO, "FIFO (named pipe)"),
          (stat_module.S_ISSOCK, "socket"), (stat_module.S_ISCHR, "character device"),
          (stat_module.S_ISBLK, "block device"))


def link_target(loc) -> str | None:
    """Where a local symbolic link points (os.readlink), else None: a file, a missing one, or any remote
    object (a store has no links, so it is not asked)."""
    loc = location(loc)
    if isinstance(loc, RemotePath) or not os.path.islink(loc):
        return None
    return os.readlink(loc)


def not_regular(loc) -> str | None:
    """What a local path is when it exists and is not a regular file ('FIFO (named pipe)',
    'socket', 'character device', 'block device', 'directory'; links followed), else None: a
    regular file, a missing one, or any remote object (a store has only files and directories,
    so it is not asked: one request saved per file)."""
    loc = location(loc)
    if isinstance(loc, RemotePath):
        return None
    try:
        mode = os.stat(loc).st_mode
    except OSError:
        return None
    return next((name for is_kind, name in _KINDS if is_kind(mode)), None)
