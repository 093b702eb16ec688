"""The loader side of step balance: every row's cost, read once at open, and the balanced order of one
iteration, each window of its remaining order dealt to steps, ranks and micro-batches by
packer.balance.deal_window.

The balanced order is a bijection of the remaining order's indices [0, n) that maps each window
[w S, (w + 1) S) onto itself (S = window x world x rows_per_rank). PackedDataset reads index
sigma(i) where it read index i, so striping, exactly-once and resume are the ones of the plain order
(packer/train/partition.py). An elastic resume maps what a job consumed through the sigma of the job that
saved it (`consumed_ranges`): whole windows are a prefix, the window in progress some holes.
"""

from __future__ import annotations

import numpy as np

from packer.balance import Balance, deal_window, row_tokens_pairs
from packer.store.dataset import read_rows

COST_CHUNK = 1 << 16  # rows whose offsets are read per step when the costs are computed


def dataset_tokens_pairs(ds) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, pairs) of every row of an opened dataset, from its offsets (a read of every row, checked as
    any read is: for a local dataset its pages once, for a streamed one every block once)."""
    parts = [row_tokens_pairs(read_rows(ds, np.arange(a, min(a + COST_CHUNK, len(ds))))[1])
             for a in range(0, len(ds), COST_CHUNK)]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


class BalancedOrder:
    """sigma over the indices [0, n) of one iteration's remaining order, for `world` ranks reading units of
    `unit` rows; `rows_at(indices)` gives (dataset, row, source) of remaining-order indices and `costs` is
    the cost of every row (datasets' rows counted one after another from `row_base`)."""

    def __init__(self, balance: Balance, n: int, world: int, unit: int, rows_at, costs: np.ndarray,
                 row_base: np.ndarray):
        self.balance, self.n, self.world, self.unit = balance, n, world, unit
        self.size = balance.window * world * balance.rows_per_rank
        self._rows_at, self._costs, self._row_base = rows_at, costs, row_base
        self._cache: dict = {}

    def _windows(self, indices: np.ndarray):
        """(first index covered, sigma over the windows `indices` touch, their rows (dataset, row, source) in
        sigma's order), every window missing from the cache read in one _rows_at call (one vectorized pass of
        the order: a call per window costs its fixed overhead each time, ~1 ms for the full shuffle)."""
        size = self.size
        first, last = int(indices.min()) // size, int(indices.max()) // size
        for w in [w for w in self._cache if w < first]:  # windows are read in order: those before are done
            del self._cache[w]
        need = [w for w in range(first, last + 1) if w not in self._cache]
        if need:
            spans = [(w * size, min((w + 1) * size, self.n)) for w in need]
            datasets, rows, sources = self._rows_at(np.concatenate([np.arange(a, b) for a, b in spans]))
            costs = self._costs[self._row_base[datasets] + rows]
            at = 0
            for w, (a, b) in zip(need, spans):
                perm = at + deal_window(costs[at:at + b - a], self.world, self.balance.rows_per_rank, self.unit)
                self._cache[w] = (perm - at + a, datasets[perm], rows[perm], sources[perm])
                at += b - a
        parts = [self._cache[w] for w in range(first, last + 1)]
        return first * size, [np.concatenate([p[k] for p in parts]) for k in range(4)]

    def indices(self, indices) -> np.ndarray:
        """sigma(indices): the remaining-order index read at each of `indices`."""
        indices = np.asarray(indices, np.int64)
        if not len(indices):
            return indices
        start, got = self._windows(indices)
        return got[0][indices - start]

    def rows_at(self, indices):
        """(dataset, row, source) read at `indices`: those of sigma(indices)."""
        indices = np.asarray(indices, np.int64)
        if not len(indices):
            return indices, indices, indices
        start, got = self._windows(indices)
        return tuple(got[k][indices - start] for k in (1, 2, 3))

    def consumed_ranges(self, done: int, holes: list) -> tuple[int, list]:
        """(a prefix of whole windows, the index ranges sigma sends [that prefix, done) and `holes` to): what a
        job that read indices [0, done) and the ranges `holes` of this order consumed of the plain one."""
        prefix = done // self.size * self.size
        taken = [np.arange(prefix, done, dtype=np.int64)] + [np.arange(a, b, dtype=np.int64) for a, b in holes]
        mapped = np.unique(self.indices(np.concatenate(taken)))
        if not len(mapped):
            return prefix, []
        runs = np.split(mapped, np.flatnonzero(np.diff(mapped) != 1) + 1)
        return prefix, [(int(run[0]), int(run[-1]) + 1) for run in runs]
