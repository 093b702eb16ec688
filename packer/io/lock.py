"""One build per output directory: an exclusive lock file that names its owner's pid.

    OUTPUT/.packer.lock     "4711 hostname\n"   (flock'ed by the running build)

The kernel holds the lock (fcntl.flock), not the file's existence, so a lock left by a
killed build is stale the moment its process dies: the next build locks the same file,
writes its own pid and goes on. A second live build fails at once, naming the owner.
A remote output (s3://, gs://, ...; packer/io/fs.py) cannot be flock'ed: there nothing stops a
second build, so one build at a time per output is the user's rule, and a warning says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import warnings
from pathlib import Path

from packer.io import fs

LOCK_NAME = ".packer.lock"


class UnlockedOutputWarning(UserWarning):
    """The output is on a filesystem without locks: concurrent builds into it are not refused."""


def _owner(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8").split()
    except OSError:
        return "unknown"
    return f"pid {text[0]} on {text[1]}" if len(text) >= 2 else "unknown"


def _acquire(directory: Path) -> int:
    path = directory / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(
                f"{directory} is being built by another packer process ({_owner(path)}); "
                f"wait for it to finish, or stop it and run again"
            ) from None
        # The owner may have unlinked the file between our open and our flock: then we
        # hold a lock on a dead inode, and must retry on the file now at that name.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            return fd
        os.close(fd)


@contextlib.contextmanager
def hold(directory):
    """Hold the build lock of `directory` (created if missing) for the `with` block."""
    directory = fs.location(directory)
    if isinstance(directory, fs.RemotePath):
        directory.mkdir(parents=True, exist_ok=True)
        warnings.warn(
            f"{fs.redact(directory)} is on a filesystem without locks: nothing stops a second build into it, "
            "so run one build at a time per output",
            UnlockedOutputWarning,
            stacklevel=3,
        )
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    fd = _acquire(directory)
    try:
        yield
    finally:
        (directory / LOCK_NAME).unlink(missing_ok=True)  # unlink before unlock: see _acquire
        os.close(fd)
