"""The memory side of a streamed dataset: which blocks are held, which are read ahead by threads, which go.

A call (ds[i], views, get_many) reads its blocks in the plan's order (else ascending); read-ahead
fetches first the call's blocks, then the plan's next ones, each only when the blocks it evicts are
those reading on demand would evict when it is read (read_plan.py: Belady's rule over the plan),
so it never reads more bytes. Held bytes stay under memory_bytes but for one block asked for on
demand. HeldBlocks is a mixin of StreamDataset (packer/store/stream.py), which supplies `_fetch(b)`
(block b read and checked), `_blocks`, `_where`, `options` and the dataset's fields.
"""

from __future__ import annotations

import collections
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from packer.io import fs
from packer.store.read_plan import ReadPlan


class HeldBlocks:
    def _reset_threads(self):
        """Fresh locks, pool, held blocks and plan: at open, and in a forked child (whose copies of the
        parent's threads and futures would never run)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pool = None
        self._held = collections.OrderedDict()  # block -> (Rows, doc_ids), least recently read first
        self._ahead: dict[int, object] = {}  # block -> Future: fetched ahead, not read yet
        self._in_flight: set[int] = set()  # blocks whose fetch ahead has not finished
        self._call: list[int] = []  # blocks the call in progress has still to read, in its order
        self._in_call = False
        self._reading: set[int] = set()  # blocks a caller is reading or waiting for right now
        self._plan = ReadPlan()  # blocks the loader will read, in order, and where it is (read_plan.py)
        self.held_bytes = self.max_held_bytes = 0

    def _check_pid(self):
        if self._pid != os.getpid():
            self._reset_threads()

    def _count(self, nbytes: int):
        self.held_bytes += nbytes
        self.max_held_bytes = max(self.max_held_bytes, self.held_bytes)

    def _now(self) -> int:
        """The plan's first row still to be read: after the call in progress or the last one (but
        before the last one between calls of a dataset with loss masks: data.py reads them again)."""
        again = self.has_loss_mask or self.has_role_ids
        return self._plan.read if again and not self._in_call else self._plan.next

    def _room(self, nbytes: int, b: int, use: int | None = None, must: bool = False) -> bool:
        """Make room (lock held) for block b: `nbytes` more held, read by the call in progress (`use`
        None) or by the plan at row `use`, by evicting read blocks and blocks fetched ahead, the one
        the plan uses last first (least recently read first among ties). False, evicting nothing,
        when a block to go would be read before b; `must` (b read now, on demand): it goes anyway,
        the call's later blocks last, past memory_bytes when nothing is left to evict."""
        over = self.held_bytes + nbytes - int(self.options["memory_bytes"])
        if over <= 0:
            return True
        if use is not None and sum(self._nbytes[x] for x in self._held if x not in self._call) < over:
            return False  # a walk ahead lets go only blocks read and done with: too few (a quick no)
        now = self._now()
        held = [x for x in self._held if x not in self._reading]
        ahead = sorted(x for x, f in self._ahead.items() if not f.done() or f.exception() is None)  # failed: holds nothing
        candidates = held + ahead + sorted(self._reading)
        # a fetch in flight, or a block being read, counts where it ranks but cannot go yet
        free = [True] * len(held) + [self._ahead[x].done() for x in ahead] + [False] * len(self._reading)
        soon = self._plan.next_uses(candidates, now)
        later = soon if use is None else self._plan.next_uses(candidates, max(use, now))
        call = {x: k for k, x in enumerate(self._call)}  # in the order the call reads them
        after = call.get(b, -1)
        keys = [call[x] - len(call) if use is None and call.get(x, -1) > after else int(u)  # the call's last read last
                for x, u in zip(candidates, later)]
        before = [x in call or (use is not None and int(u) < use) for x, u in zip(candidates, soon)]
        order = sorted(range(len(candidates)), key=lambda i: -keys[i])  # stable: the least recently read first
        victims, freed = [], 0
        for i in order:  # the blocks reading on demand would let go, in turn, until b fits
            if freed >= over:
                break
            if (before[i] or not free[i]) and not must:
                return False  # one of them is read before b, or still in flight: b is fetched later
            if free[i]:
                victims.append(i)
                freed += self._nbytes[candidates[i]]
        if freed < over and not must:
            return False
        for i in victims:
            x = candidates[i]
            if self._held.pop(x, None) is None:
                del self._ahead[x]
            self.held_bytes -= self._nbytes[x]
            self._plan.rewind(int(soon[i]))
        return True

    def _block(self, b: int):
        """Block b's (Rows, doc_ids), held as most recently read: from memory, from a fetch ahead, or read now."""
        with self._lock:
            if b in self._held:
                self._held.move_to_end(b)
                return self._held[b]
            future = self._ahead.pop(b, None)
            if future is None:
                self._room(self._nbytes[b], b, must=True)
                self._count(self._nbytes[b])
            self._reading.add(b)  # read (or waited for) here, now: not fetched ahead again
        try:
            block = future.result() if future is not None else self._fetch_or_release(b)
        finally:
            with self._lock:
                self._reading.discard(b)
        with self._lock:
            self._held[b] = block
            self._pump()
        return block

    def _fetch_or_release(self, b: int):
        try:
            return self._fetch(b)
        except BaseException:
            with self._lock:
                self.held_bytes -= self._nbytes[b]
            raise

    def _blocks_of(self, idx: np.ndarray) -> np.ndarray:
        return self._block_starts.searchsorted(idx, side="right") - 1

    def prefetch(self, indices, reset: bool = False, calls=None):
        """Rows `indices` will be read next, in this order (after those given before; `reset`
        forgets those); `calls`: how many of them each read call (views, get_many, ...) takes, in
        turn (the plan then orders each call's blocks, and the call reads them in that order).
        Their blocks are fetched ahead in order by up to read_ahead threads, as far as memory
        allows without letting go a block reading on demand would keep, and memory keeps the
        blocks used soonest (read_plan.py). Without it, a read still fetches the blocks of one
        call together."""
        self._check_pid()
        idx = self._indices(indices)
        if calls is not None and (np.any(np.asarray(calls) < 0) or int(np.sum(calls)) != len(idx)):
            raise ValueError(f"prefetch: calls add up to {int(np.sum(calls))} rows, not the {len(idx)} indices given; "
                             "give each call's row count, or no calls")
        with self._lock:
            self._plan.extend(self._blocks_of(idx), reset, calls)
            self._pump()

    def _start_call(self, blocks: np.ndarray, wanted: list[int]) -> list[int]:
        """A call reads rows of `blocks` (one per row), from blocks `wanted` (ascending): the plan's
        cursor moves onto them when they are its next rows, and their fetches start. The order to
        read them in: the plan's (read_plan.py), else ascending."""
        with self._lock:
            if self._plan.follow(blocks):
                planned = list(dict.fromkeys(self._plan.rows_blocks(self._plan.read, self._plan.next).tolist()))
                wanted = [b for b in planned if b in set(wanted)] + sorted(set(wanted) - set(planned))
            self._call, self._in_call = list(wanted), True
            self._warn_if_call_too_big(wanted)
            self._pump()
            return list(wanted)

    def _warn_if_call_too_big(self, wanted: list[int]):
        """Once: a read call whose blocks do not fit in memory_bytes reads the rest one by one
        (docs/remote.md, Orders): say what to raise."""
        need, memory = sum(self._nbytes[b] for b in wanted), int(self.options["memory_bytes"])
        if need > memory and not self._warned_call:
            self._warned_call = True
            warnings.warn(f"streaming {fs.redact(str(self.path))}: one read of {len(wanted)} blocks needs "
                          f"{need / 2**20:.1f} MiB but memory_bytes is {memory / 2**20:.1f} MiB, so its blocks are "
                          f"read one at a time; raise memory_bytes (PACKER_STREAM_MEMORY_BYTES) above "
                          f"{need / 2**20:.0f} MiB, or read in an order of whole blocks", stacklevel=5)

    def _done_with(self, b: int):
        """The call in progress has read what it needed of block b: room for its other blocks."""
        with self._lock:
            if b in self._call:
                self._call.remove(b)
            self._pump()

    def _end_call(self):
        with self._lock:
            self._call, self._in_call = [], False

    def _pump(self):
        """Start fetches (lock held): the blocks the call in progress reads, in its order, then the
        plan's next blocks while read_ahead threads are free, each while _room allows; a block that
        must wait stops those after it."""
        n_threads = int(self.options["read_ahead"])
        if not n_threads:
            return
        for b in self._call:
            if b not in self._held and b not in self._ahead and b not in self._reading:
                if not self._room(self._nbytes[b], b):
                    return  # read on demand, or fetched once memory frees
                self._submit(b, n_threads)
        in_flight = len(self._in_flight)
        while in_flight < n_threads and (step := self._plan.ahead(self._now())) is not None:
            run, b, use = step
            if b not in self._held and b not in self._ahead and b not in self._reading:
                if not self._room(self._nbytes[b], b, use):
                    return  # memory holds only blocks needed sooner: wait for the loader to read some
                self._submit(b, n_threads)
                in_flight += 1
            self._plan.at = run + 1

    def _submit(self, b: int, n_threads: int):
        self._count(self._nbytes[b])
        if self._pool is None:
            self._pool = ThreadPoolExecutor(n_threads, thread_name_prefix="packer-stream")
        self._in_flight.add(b)
        future = self._pool.submit(self._fetch_or_release, b)
        future.add_done_callback(lambda _: self._landed(b))
        self._ahead[b] = future

    def _landed(self, b: int):
        """A fetch ahead finished (in its thread): one thread free, maybe room to fetch more."""
        self._in_flight.discard(b)  # one set operation: atomic, no lock needed
        if self._lock.acquire(blocking=False):  # else the holder pumps when it is done
            try:
                self._pump()
            finally:
                self._lock.release()

    # -- ShardDataset's interface --------------------------------------------------------
