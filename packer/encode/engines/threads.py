"""The threads an engine encodes on, owned by one process.

A forked child (a DataLoader worker over online packing, after the parent encoded) inherits the
parent's encoder but not its threads: a ThreadPoolExecutor copied into it believes its threads are
there and idle, so work submitted in the child would wait forever. Each process gets its own pool.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor


class OwnThreads:
    """submit(fn, *args) on `n` threads of this process's own (made on first use, again after a fork)."""

    def __init__(self, n: int, name: str):
        self.n, self._name = n, name
        self._pool, self._pid = None, None

    def submit(self, fn, *args) -> Future:
        if self._pid != os.getpid():
            self._pool, self._pid = ThreadPoolExecutor(self.n, thread_name_prefix=self._name), os.getpid()
        return self._pool.submit(fn, *args)
