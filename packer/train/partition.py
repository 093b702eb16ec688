"""Where this process stands among the readers of a dataset, and which positions of the global order it reads.

    Split(rank=1, world_size=2, worker=0, num_workers=2)    rank 1 of 2, in its worker 0 of 2

rank / world_size come from the caller when given, else from torch.distributed when it is
initialised, else 0 / 1; worker / num_workers from the worker info the caller passes (torch's
get_worker_info(): None in the main process, then 0 / 1).

PackedDataset's global order is striped batch-major. With units of B positions (B = batch_size, or 1 for
items) and W ranks, global batch j holds positions [j B W, (j + 1) B W); rank r's unit j is its r-th
slice of B; DataLoader worker w of K reads the rank's units w, w + K, w + 2K, ... (torch's DataLoader takes
them from its workers round-robin). B = 2, W = 2, K = 2:

    positions   0 1 | 2 3 | 4 5 | 6 7 | 8 9 | ...
    rank        0 0   1 1   0 0   1 1   0 0
    unit j      0     0     1     1     2
    worker      0     0     1     1     0

So after k units on every rank the job has read exactly positions [0, k B W): the same prefix whatever
W and K. A short last global batch (n - j B W < B W positions) is shared out as evenly as it goes, the
first ranks one more. OnlinePackedDataset keeps its own rule: partition rank * num_workers + worker.

`Progress` is what a resumed epoch has already consumed (a prefix and some holes); see `job_progress`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Split:
    rank: int
    world_size: int
    worker: int
    num_workers: int


def check_rank(rank: int | None, world_size: int | None):
    """Reject a rank without a world size (or the reverse) and a rank outside [0, world_size)."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"pass rank and world_size together (got rank={rank}, world_size={world_size})")
    if world_size is not None and not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")


def rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size): the given ones, else torch.distributed's when initialised, else (0, 1)."""
    if world_size is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def current_split(rank: int | None, world_size: int | None, worker_info) -> Split:
    """The split of the calling process; `worker_info` is its torch get_worker_info()."""
    worker, num_workers = (worker_info.id, worker_info.num_workers) if worker_info else (0, 1)
    return Split(*rank_world(rank, world_size), worker, num_workers)


# -- batch-major striping --------------------------------------------------------------------


def rank_units(n: int, unit: int, world: int, rank: int) -> int:
    """Units (batches of `unit` positions, the last shorter) rank `rank` of `world` reads of n positions."""
    n_global = -(-n // (unit * world))
    if n_global == 0:
        return 0
    last = n - (n_global - 1) * unit * world
    return n_global - (rank >= last)  # a last batch smaller than the world leaves the last ranks none


def rank_items(n: int, unit: int, world: int, rank: int) -> int:
    """Positions rank `rank` of `world` reads of n."""
    n_global = -(-n // (unit * world))
    if n_global == 0:
        return 0
    q, m = divmod(n - (n_global - 1) * unit * world, world)
    return (n_global - 1) * unit + q + (rank < m)


def unit_positions(units: np.ndarray, n: int, unit: int, world: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions of the units, in order; each unit's size): rank `rank`'s slices of global batches `units`."""
    units = np.asarray(units, np.int64)
    span = unit * world
    start, size = units * span + rank * unit, np.full(len(units), unit, np.int64)
    last = units * span + span > n  # the short last global batch, shared out evenly
    if last.any():
        q, m = divmod(n - int(units[last][0]) * span, world)
        start[last] = units[last] * span + rank * q + min(rank, m)
        size[last] = q + (rank < m)
    ends = np.cumsum(size)
    positions = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
    positions += np.repeat(start - (ends - size), size)
    return positions, size


# -- what a resumed epoch has consumed ---------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """Positions of an epoch's global order already consumed: all of [0, done), and the ranges `holes`
    (sorted, disjoint, past `done`). The rest, in order, is what the job reads next, striped as above.

    n = 10, done = 3, holes = ((5, 7),): the rest is positions 3 4 7 8 9, indices 0..4 of the remaining order.
    """

    n: int
    done: int = 0
    holes: tuple = ()

    def __len__(self) -> int:
        return self.n - self.done - sum(b - a for a, b in self.holes)

    def _segments(self):
        """(g start, index start) of each run of remaining positions."""
        g_starts = [self.done] + [b for _, b in self.holes]
        g_ends = [a for a, _ in self.holes] + [self.n]
        lengths = np.subtract(g_ends, g_starts)
        return np.array(g_starts, np.int64), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def position(self, indices: np.ndarray) -> np.ndarray:
        """Global positions of remaining-order indices (vectorized)."""
        indices = np.asarray(indices, np.int64)
        if not self.holes:
            return indices + self.done
        g_starts, i_starts = self._segments()
        seg = np.searchsorted(i_starts[1:], indices, side="right")
        return g_starts[seg] + indices - i_starts[seg]

    def position_end(self, index: int) -> int:
        return int(self.position(np.array([index]))[0]) if index < len(self) else self.n

    def ranges(self, a: int, b: int) -> list:
        """The global ranges remaining-order indices [a, b) cover."""
        if a >= b:
            return []
        g_starts, i_starts = self._segments()
        out = []
        for s in range(len(g_starts)):
            lo, hi = max(a, i_starts[s]), min(b, i_starts[s + 1])
            if lo < hi:
                out.append((int(g_starts[s] + lo - i_starts[s]), int(g_starts[s] + hi - i_starts[s])))
        return out

    def after(self, done: int, holes: list) -> Progress:
        """This progress after the remaining order's indices [0, done) and the index ranges `holes` were consumed."""
        new_done = self.position_end(done)
        ranges = [h for h in self.holes if h[0] >= new_done]
        for a, b in holes:
            ranges += self.ranges(a, b)
        return Progress(self.n, new_done, ()).with_holes(ranges)

    def with_holes(self, ranges) -> Progress:
        merged, done = [], self.done
        for a, b in sorted(ranges):
            if a <= done:
                done = max(done, b)
            elif merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        while merged and merged[0][0] <= done:
            done = max(done, merged.pop(0)[1])
        return Progress(self.n, done, tuple((a, b) for a, b in merged))


def job_progress(states: list[dict]) -> Progress:
    """What the whole job consumed, from the states of every worker of one rank (one state without workers)
    (`job_consumed` says how)."""
    base, done, holes = job_consumed(states)
    return base.after(done, holes)


def job_consumed(states: list[dict]) -> tuple[Progress, int, list]:
    """(the progress the saved iteration began from, the indices [0, done) of its remaining order and the
    index ranges `holes` it consumed), from the states of every worker of one rank.

    Every rank has taken the same units from its worker w (synchronous training), so unit j of the
    epoch was consumed by all ranks exactly when worker j % K of this rank had yielded more than j // K
    units: the global batches [0, k) with k = min over w of (w + K u_w), and a few past it (items read
    into a DataLoader batch by one worker before the others) as holes.
    """
    first = states[0]
    n_workers, unit, world = first["num_workers"], first["unit"], first["world_size"]
    by_worker = {s["worker"]: int(s["units"]) for s in states}
    if sorted(by_worker) != list(range(n_workers)):
        raise ValueError(f"elastic resume needs the state of every DataLoader worker of one rank: got workers "
                         f"{sorted(by_worker)} of num_workers={n_workers}; pass the StatefulDataLoader's "
                         "state_dict(), not one worker's")
    base = Progress(first["progress"][0], first["progress"][1], tuple(map(tuple, first["progress"][2])))
    n = first["order_length"]  # the remaining order's length this job striped (after drop_last)
    span = unit * world
    k = min(w + n_workers * u for w, u in by_worker.items())
    holes = [(j * span, min((j + 1) * span, n)) for w, u in by_worker.items()
             for j in range(w + n_workers * max(0, -(-(k - w) // n_workers)), w + n_workers * u, n_workers)]
    return base, min(k * span, n), [h for h in holes if h[0] < h[1]]
