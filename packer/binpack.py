"""First-fit-decreasing and best-fit-decreasing bin packing over an integer array of lengths.

    pack([5, 3, 4, 2], capacity=8)  ->  [0, 0, 1, 1]     bins: 5+3 | 4+2

Items are taken by length descending, ties in input order (stable sort). FFD puts each
item into the lowest-numbered open bin with room; BFD into the open bin with the least
room left that still fits it (ties to the lowest number). Bins are numbered in the
order they are opened. No I/O, no tokens: lengths in, bin index per item out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALGORITHMS = ("ffd", "bfd")


def _check(lengths, capacity: int) -> np.ndarray:
    lengths = np.asarray(lengths)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {lengths.shape}")
    if lengths.size and not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"lengths must be integers, got dtype {lengths.dtype}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    bad = np.flatnonzero((lengths < 1) | (lengths > capacity))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"lengths[{i}] = {int(lengths[i])} is outside [1, {capacity}]; "
            "split long documents before packing"
        )
    return lengths.astype(np.int64, copy=False)


def pack(lengths, capacity: int, algorithm: str = "ffd") -> np.ndarray:
    """Bin index (int64) for each item."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    lengths = _check(lengths, capacity)
    order = np.argsort(-lengths, kind="stable")
    bins = np.empty(len(lengths), dtype=np.int64)
    room = np.empty(max(len(lengths), 1), dtype=np.int64)
    n_bins = 0
    for i in order:
        size = lengths[i]
        fits = np.flatnonzero(room[:n_bins] >= size)
        if fits.size == 0:
            b = n_bins
            room[b] = capacity
            n_bins += 1
        elif algorithm == "ffd":
            b = int(fits[0])
        else:
            b = int(fits[np.argmin(room[fits])])
        room[b] -= size
        bins[i] = b
    return bins


def lower_bound(lengths, capacity: int) -> int:
    """ceil(sum / capacity): no packing can use fewer bins."""
    total = int(np.asarray(lengths, dtype=np.int64).sum())
    return -(-total // capacity)


@dataclass(frozen=True)
class PackSummary:
    n_bins: int
    n_tokens: int
    capacity: int
    lower_bound: int

    @property
    def fill_rate(self) -> float:
        return self.n_tokens / (self.n_bins * self.capacity) if self.n_bins else 1.0


def summarize(lengths, bins, capacity: int) -> PackSummary:
    lengths = np.asarray(lengths, dtype=np.int64)
    n_bins = int(bins.max()) + 1 if len(bins) else 0
    return PackSummary(n_bins, int(lengths.sum()), capacity, lower_bound(lengths, capacity))
