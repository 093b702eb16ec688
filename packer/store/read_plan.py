"""A streaming reader's read plan: the blocks the loader will read, in order, and where it is in them, so
memory keeps the blocks used soonest and read-ahead never evicts a block reading on demand would keep.

The plan is told rows (StreamDataset.prefetch) and keeps their blocks as runs; each read call that
follows the plan moves the cursor. Rows 0-5 of blocks 3 3 1 3 0 0, a first call reading rows 0-2:

    runs    block  3 1 3 0      ends  2 3 4 6      (rows [0, 2) in block 3, row 2 in block 1, ...)
    cursor  read 0, next 3      (the call in progress holds rows [0, 3): still to be used)
    next use of block 3: row 0; block 0: row 4; block 7: never (NEVER)

The call after it (rows 3-5) sets read 3, next 6: block 3 is next used at row 3, block 1 never. A
call that reads what the plan does not say (ds[i]) leaves the cursor where it is; one that reads
the same rows again (data.py's loss masks) too. Told the rows of each call (`calls`), the plan
holds each call's blocks once, in the order the call reads them: the block the plan uses last
first, so that the blocks a call has done with are the first to go (call_runs).

Memory evicts the block next used last (Belady's rule; least recently read first among ties).
Read-ahead walks the plan's blocks in order and fetches the next one missing, used at row p, only
when every block Belady's rule would evict at p is free now and not needed before p; else it
waits for the loader. Nothing is read between now and p that is not held, so at p reading on
demand would evict those very blocks: read-ahead reads each block as often, earlier. (Never
evicting a block needed before p, Cao et al.'s "do no harm", is not enough: a block needed at
p - 1 and then not for long would have been the one to go at p.)

Cost: 24 B a run (a row at most; a block in stored order); a next-use query is one binary search
and looks at most HORIZON runs past the cursor (beyond, a block counts as NEVER and the walk ahead
stops, so the rule holds).
"""

from __future__ import annotations

import numpy as np

NEVER = np.iinfo(np.int64).max
HORIZON = 1 << 15  # runs a next-use query looks ahead: 256 KiB of plan, far past any memory budget's blocks


def runs_of(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(block of each run, rows in each run) of a per-row block array: [3 3 1 3] -> ([3 1 3], [2 1 1])."""
    if not blocks.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    firsts = np.flatnonzero(np.concatenate([[True], blocks[1:] != blocks[:-1]]))
    return blocks[firsts].astype(np.int64), np.diff(np.append(firsts, blocks.size)).astype(np.int64)


def call_runs(blocks: np.ndarray, calls) -> tuple[np.ndarray, np.ndarray]:
    """runs_of for rows read in calls (`calls`: rows per call): each call's blocks once, with their rows
    in the call, in the order the call reads them: the block next used last (in a later call) first,
    so those it has read are the first to go (ties: ascending). blocks [3 1 3 | 1 2], calls [3 2]:
    block 3 is not used again, 1 is -> ([3 1 1 2], [2 1 1 1])."""
    blocks, calls = np.asarray(blocks, np.int64), np.asarray(calls, np.int64)
    if not blocks.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    call = np.repeat(np.arange(len(calls)), calls)
    order = np.lexsort((blocks, call))
    b, c = blocks[order], call[order]
    firsts = np.flatnonzero(np.concatenate([[True], (b[1:] != b[:-1]) | (c[1:] != c[:-1])]))
    b, c, n = b[firsts], c[firsts], np.diff(np.append(firsts, b.size))
    by_block = np.lexsort((c, b))  # each block's calls in turn
    same = b[by_block][1:] == b[by_block][:-1]
    next_call = np.full(len(b), NEVER, np.int64)
    next_call[by_block[:-1][same]] = c[by_block[1:][same]]
    read = np.lexsort((b, -next_call, c))  # NEVER (-NEVER) first; it does not wrap
    return b[read], n[read]


def _same_blocks(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) == len(b) and np.array_equal(np.sort(a), np.sort(b))


class ReadPlan:
    """Runs of the rows told and not yet read past (module docstring); `at` is the walk ahead's next run."""

    def __init__(self):
        self.blocks = self.ends = self._keys = np.zeros(0, np.int64)
        self.read = self.next = self.at = 0

    def __len__(self) -> int:
        """Rows in the plan (those read past dropped at each extend)."""
        return int(self.ends[-1]) if self.ends.size else 0

    def extend(self, blocks: np.ndarray, reset: bool = False, calls=None):
        """Rows whose blocks are `blocks` come after those told (`reset`: instead of them); `calls`: the
        rows of each read call in turn, whose blocks the reader then reads once each, in call_runs' order."""
        new_blocks, counts = runs_of(np.asarray(blocks, np.int64)) if calls is None else call_runs(blocks, calls)
        if reset:
            self.__init__()
        first = self.first_run()  # runs before the call in progress are done: dropped, rows renumbered
        base = int(self.ends[first - 1]) if first else 0
        kept = self.ends[first:] - base
        self.read, self.next, self.at = self.read - base, self.next - base, max(0, self.at - first)
        self.blocks = np.concatenate([self.blocks[first:], new_blocks])
        self.ends = np.concatenate([kept, (kept[-1] if kept.size else 0) + np.cumsum(counts)])
        self._keys = np.sort(self.blocks * (len(self.blocks) + 1) + np.arange(len(self.blocks)))  # (block, run)

    def first_run(self) -> int:
        """The run holding row `read` (the first still to be used)."""
        return int(self.ends.searchsorted(self.read, side="right"))

    def rows_blocks(self, lo: int, hi: int) -> np.ndarray:
        """The block of each planned row in [lo, hi)."""
        r0, r1 = int(self.ends.searchsorted(lo, side="right")), int(self.ends.searchsorted(hi - 1, side="right")) + 1
        starts = np.concatenate([[0], self.ends[:-1]])[r0:r1]
        return np.repeat(self.blocks[r0:r1], np.clip(self.ends[r0:r1], lo, hi) - np.clip(starts, lo, hi))

    def follow(self, blocks: np.ndarray) -> bool:
        """A call reads rows whose blocks are `blocks`: when they are the plan's next rows (any order
        within the call; or its first ones, when the plan ends before the call does), the cursor
        moves onto them. False: not planned."""
        n = min(len(blocks), len(self) - self.next)
        if n <= 0 or not _same_blocks(self.rows_blocks(self.next, self.next + n), blocks[:n]):
            return self.next > self.read and _same_blocks(self.rows_blocks(self.read, self.next), blocks)
        self.read, self.next = self.next, self.next + n
        return True

    def next_uses(self, blocks, since: int | None = None) -> np.ndarray:
        """Row of each block's next use at or after row `since` (default: `read`); NEVER when it is
        not within HORIZON runs of there. One search in the runs sorted by (block, run)."""
        since = self.read if since is None else max(since, self.read)
        query = np.asarray(blocks, np.int64)
        out = np.full(len(query), NEVER, np.int64)
        if not self._keys.size or not query.size:
            return out
        width = len(self.blocks) + 1
        r0 = int(self.ends.searchsorted(since, side="right"))
        at = np.minimum(self._keys.searchsorted(query * width + r0), len(self._keys) - 1)
        key = self._keys[at]
        runs = key % width
        seen = (key // width == query) & (runs >= r0) & (runs < r0 + HORIZON)
        runs = runs[seen]
        out[seen] = np.maximum(np.where(runs > 0, self.ends[runs - 1], 0), since)
        return out

    def ahead(self, since: int):
        """(run, block, row of use) of the walk's next run at or after row `since`, or None past the plan
        or the horizon."""
        first = int(self.ends.searchsorted(max(since, self.read), side="right"))
        self.at = max(self.at, first)
        if self.at >= min(len(self.blocks), first + HORIZON):
            return None
        return self.at, int(self.blocks[self.at]), max(int(self.ends[self.at - 1]) if self.at else 0, since, self.read)

    def rewind(self, use: int):
        """A block next used at row `use` was evicted: the walk ahead goes back to fetch it again."""
        if use != NEVER:
            self.at = min(self.at, int(self.ends.searchsorted(use, side="right")))
