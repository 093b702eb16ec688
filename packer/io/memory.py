"""Big buffers handed back to the system when freed: glibc's mmap threshold fixed at 1 MiB once a huge document arrives.

glibc serves a malloc under its mmap threshold from the heap, and raises that threshold (up to
32 MiB) each time a mapped block is freed: after one huge document's buffers come and go, the
MB-sized windows, pieces and id arrays that follow live in the heap, where freed space is
kept, not returned, and the process's RSS holds the sum of them. Fixed at 1 MiB (which also
stops the raising), every such buffer is its own mapping, returned to the system by free().
Not glibc (musl, macOS): nothing is done.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
_state: list = []  # [whether the threshold is set], once tried


def return_large_buffers() -> bool:
    """Set glibc's mmap threshold to MMAP_THRESHOLD_BYTES, once per process; whether it is set."""
    if not _state:
        _state.append(_set_threshold())
    return _state[0]


def _set_threshold() -> bool:
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (ValueError, OSError, AttributeError):  # no such confstr name, no glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
