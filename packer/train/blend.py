"""A blend: weighted sources interleaved so that every prefix of the epoch holds each source in proportion.

A source is a range of rows of one dataset (a dataset with named sources stores each one's rows as one
contiguous range: manifest["sources"][i]["sequences"] = [first_row, end_row]). The blend picks, for each
epoch position g, a source, and that source's next sample:

    weights web 0.5, code 0.3, books 0.2 (period Q = 10, counts a = 5 3 2):
    position   0 1 2 3 4 5 6 7 8 9 | 10 ...
    source     w c b w w c w b c w |  w ...      greedy: the largest deficit a_s (i + 1) - Q c_s
    sample k   0 0 0 1 2 1 3 1 2 4 |  5 ...      (k-th pick of that source)

Sample k of a source of n_s rows is pass k // n_s, row k % n_s of that pass's seeded order (a fresh order
each pass: an upsampled source repeats only across passes). The pattern of Q = min(length, 2^18) positions
is computed once (Megatron's greedy, a Python loop: 0.3 s for 2^18 positions and 3 sources, measured
2026-12-01) and tiled, so any position maps to its source and sample in O(1), vectorized: no per-epoch
loop over the epoch; with the full shuffle a chunk's positions go through all their (source, pass)
permutations in one vectorized pass (order.permute_groups). Over every prefix of a period each source is within one sample of a_s / Q of it
(the greedy's quota property, tested over whole periods); a_s / Q is the weight rounded to 1 / Q, the
blend's effective weight (`Blend.weights`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from packer.train.order import epoch_order, permute_groups

PERIOD = 2**18  # positions of the tiled pattern: weights are kept to 1 / PERIOD


@dataclass(frozen=True)
class Source:
    name: str
    dataset: int  # index into the blend's datasets
    start: int  # first row in that dataset
    end: int


def apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer counts summing to `total` in proportion to `weights` (largest remainder), each positive weight
    at least 1."""
    ideal = np.asarray(weights, np.float64) / np.sum(weights) * total
    counts = np.floor(ideal).astype(np.int64)
    rest = total - int(counts.sum())
    counts[np.argsort(-(ideal - counts), kind="stable")[:rest]] += 1
    return counts


@functools.lru_cache(maxsize=8)
def greedy_pattern(counts: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(source of each position, occurrence number of that source) over one period of sum(counts) positions:
    Megatron's blended index in integers (deficit a_s (i + 1) - Q c_s; ties to the lower source). The
    counts come out exact at the period's end, so the pattern tiles."""
    q, n_sources = sum(counts), len(counts)
    taken = [0] * n_sources
    picks, occurrence = bytearray(q) if n_sources < 256 else [0] * q, [0] * q
    sources = range(n_sources)
    for i in range(q):
        t = i + 1
        best = max(sources, key=lambda s: counts[s] * t - q * taken[s])
        occurrence[i] = taken[best]
        taken[best] += 1
        picks[i] = best
    assert taken == list(counts)
    return np.asarray(picks, np.int64), np.asarray(occurrence, np.int64)


class Blend:
    """Sources with weights over an epoch of `length` positions; `rows(g, ...)` is its order."""

    def __init__(self, sources: list[Source], weights, length: int):
        weights = np.asarray(weights, np.float64)
        if len(weights) != len(sources) or (weights < 0).any() or not weights.sum() > 0:
            raise ValueError(f"weights {weights.tolist()} must be one non-negative number per source "
                             f"({len(sources)}), not all 0")
        if length < 1:
            raise ValueError(f"num_samples={length} must be at least 1")
        self.sources, self.length = sources, length
        period = min(length, PERIOD)
        self.counts = apportion(weights, period)
        small = [s.name for s, c, w in zip(sources, self.counts, weights) if w > 0 and c == 0]
        if small:
            raise ValueError(f"sources {small} have weights below 1 / {period} of the blend: they would never "
                             "be read; raise their weight or num_samples, or drop them")
        self.weights = self.counts / period  # effective, rounded to 1 / period
        self.sizes = np.array([s.end - s.start for s in sources], np.int64)
        empty = [s.name for s, n, c in zip(sources, self.sizes, self.counts) if c and n == 0]
        if empty:
            raise ValueError(f"sources {empty} have no rows but a weight; give them weight 0 or drop them")
        self.pattern, self.occurrence = greedy_pattern(tuple(self.counts.tolist()))

    def fingerprint(self) -> str:
        return f"{self.length}:" + ",".join(f"{s.name}={c}" for s, c in zip(self.sources, self.counts))

    def samples(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, sample number k within that source) of each epoch position."""
        positions = np.asarray(positions, np.int64)
        period = len(self.pattern)
        phase = positions % period
        source = self.pattern[phase]
        return source, positions // period * self.counts[source] + self.occurrence[phase]

    def rows(self, positions, shuffle: str, seed: int, epoch: int, block: int, window: int):
        """(dataset of each position, row in that dataset, source of it): sample k of source s is pass
        p = k // n_s, row k % n_s of pass p's order (`shuffle`, keyed by epoch, source and pass)."""
        source, k = self.samples(positions)
        n = self.sizes[source]
        passes, within = k // n, k % n
        stride = int(passes.max(initial=0)) + 1
        keys, group = np.unique(source * stride + passes, return_inverse=True)  # one group per (source, pass)
        pairs = [divmod(key, stride) for key in keys.tolist()]
        if shuffle == "full":  # every (source, pass) permutation in one vectorized pass
            local = permute_groups(within, group, [self.sizes[s] for s, _ in pairs], seed,
                                   [(epoch, s, p) for s, p in pairs])
        else:
            local = np.empty_like(within)
            for g, (s, p) in enumerate(pairs):
                here = group == g
                local[here] = epoch_order(within[here], int(self.sizes[s]), shuffle, seed, (epoch, s, p), block,
                                          window)
        starts = np.array([s.start for s in self.sources], np.int64)
        datasets = np.array([s.dataset for s in self.sources], np.int64)
        return datasets[source], starts[source] + local, source
