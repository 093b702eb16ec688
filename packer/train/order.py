"""Epoch orders: which stored row sits at each position of an epoch (full shuffle, block shuffle, none), and
how far an order is from a full shuffle.

Every order is a bijection of [0, n) computed on demand for any positions (no n-sized array):

    full    perm(p): a seeded Feistel permutation of [0, n)
    block   rows come in blocks of `block` consecutive stored rows (one ranged read each); the blocks are
            in a seeded order, and the rows of each `window` consecutive blocks are shuffled among
            themselves. n = 10, block = 2, window = 2: blocks [0 1][2 3][4 5][6 7][8 9] in the order
            3 0 | 4 1 | 2, so positions 0-3 hold rows {6 7 0 1} shuffled, 4-7 rows {8 9 2 3}, 8-9 rows {4 5}.
    none    p itself (storage order)

`spread` is the quality number (see its docstring): 1.0 for a full shuffle, about 1 - 1/window for the block
shuffle, about 0 for storage order.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

ORDERS = ("full", "block", "none")
_ROUNDS = 4  # Luby-Rackoff: 4 rounds of a strong round function give a strong pseudorandom permutation
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a fast, well-spread hash of uint64 values (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@functools.lru_cache(maxsize=256)
def _round_keys(seed: int, epoch) -> np.ndarray:
    """Round keys of one permutation; `epoch` is an int or a tuple of ints (epoch, source, pass, ...)."""
    words = [seed, *(epoch if isinstance(epoch, tuple) else (epoch,)), 0x5EED]
    return np.random.default_rng(words).integers(0, 2**63, size=_ROUNDS, dtype=np.uint64)


def _feistel(x: np.ndarray, half, keys, inverse: bool) -> np.ndarray:
    """The network over 2 * half bits; `half` and each key are one value, or one per element of x."""
    half = np.uint64(half) if isinstance(half, int) else half
    mask = (np.uint64(1) << half) - np.uint64(1)
    left, right = x >> half, x & mask
    if inverse:
        for key in keys[::-1]:
            left, right = right ^ (_mix(left ^ key) & mask), left
    else:
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
    return (left << half) | right


def permute(positions: np.ndarray, n: int, seed: int, epoch, *, inverse: bool = False) -> np.ndarray:
    """perm(positions) for a seeded bijection perm of [0, n): the epoch order, without an n-array.

    A balanced Feistel network over the smallest even bit width 2h with 2^(2h) >= n, and cycle
    walking: values that land outside [0, n) go through the network again until they fall
    inside, which keeps the map a bijection of [0, n) (at most 4x the domain, so few walks).
    `inverse=True` gives perm^-1 (the network backwards, walking the same cycles the other way).
    """
    half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    keys = _round_keys(seed, epoch)
    x = np.asarray(positions, dtype=np.uint64).copy()
    todo = np.arange(len(x))
    with np.errstate(over="ignore"):
        while len(todo):
            x[todo] = _feistel(x[todo], half, keys, inverse)
            todo = todo[x[todo] >= np.uint64(n)]
    return x.astype(np.int64)


def permute_groups(positions: np.ndarray, group: np.ndarray, sizes, seed: int, epochs) -> np.ndarray:
    """permute(positions[i], sizes[g], seed, epochs[g]) for g = group[i], every i in one vectorized pass
    (several permutations at once: a blend's sources and passes), the same numbers as one call per group.

        positions [3 0 1 2], group [0 1 1 0], sizes [5 9]: [perm_0(3) perm_1(0) perm_1(1) perm_0(2)]
    """
    if not len(positions):
        return np.zeros(0, np.int64)
    sizes = [int(n) for n in sizes]
    halves = np.array([max(1, (max(n - 1, 1).bit_length() + 1) // 2) for n in sizes], np.uint64)
    keys = np.stack([_round_keys(seed, e) for e in epochs], axis=1)  # [round, group]
    n = np.array(sizes, np.uint64)
    x = np.asarray(positions, dtype=np.uint64).copy()
    todo, g = np.arange(len(x)), np.asarray(group, np.int64)
    with np.errstate(over="ignore"):
        while len(todo):
            x[todo] = _feistel(x[todo], halves[g], keys[:, g], False)
            walk = x[todo] >= n[g]
            todo, g = todo[walk], g[walk]
    return x.astype(np.int64)


def block_order(positions: np.ndarray, n: int, block: int, window: int, seed: int, epoch) -> np.ndarray:
    """Rows at `positions` of the block-shuffled order of [0, n) (module docstring): a bijection of [0, n).

    Blocks are the stored rows [b * block, (b + 1) * block); the last one, `short` rows, may be shorter.
    Slots (the permuted block order) are grouped `window` at a time; positions run through the windows
    in turn, and inside a window through a seeded permutation of its rows.
    """
    positions = np.asarray(positions, np.int64)
    n_blocks = -(-n // block)
    deficit = n_blocks * block - n  # rows the short block lacks
    short_slot = int(permute(np.array([n_blocks - 1]), n_blocks, seed, (*_key(epoch), 1), inverse=True)[0])
    span = window * block

    def window_start(w):  # first position of window w (the short block before it shifts it back)
        return w * span - deficit * (short_slot < w * window)

    w = positions // span
    w += positions >= window_start(w + 1)
    w = np.minimum(w, (n_blocks - 1) // window)
    out = np.empty_like(positions)
    for win in np.unique(w).tolist():
        here = w == win
        first, end = win * window, min((win + 1) * window, n_blocks)
        size = (end - first) * block - deficit * (first <= short_slot < end)
        inner = permute(positions[here] - window_start(win), size, seed, (*_key(epoch), 2, win))
        if first <= short_slot < end:  # past the short block, offsets shift by what it lacks
            inner += deficit * (inner >= (short_slot - first) * block + block - deficit)
        slot, within = first + inner // block, inner % block
        out[here] = permute(slot, n_blocks, seed, (*_key(epoch), 1)) * block + within
    return out


def _key(epoch) -> tuple:
    return epoch if isinstance(epoch, tuple) else (epoch,)


def epoch_order(positions: np.ndarray, n: int, shuffle: str, seed: int, epoch, block: int = 64,
                window: int = 16) -> np.ndarray:
    """Rows at `positions` of an epoch of n rows in the order `shuffle` ("full", "block" or "none")."""
    if shuffle == "none":
        return np.asarray(positions, np.int64)
    if shuffle == "block":
        return block_order(positions, n, block, window, seed, epoch)
    return permute(positions, n, seed, epoch)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockShuffle:
    """The block order with its sizes: shuffle=BlockShuffle(block=64, window=16) (shuffle="block" is
    BlockShuffle()): blocks of `block` consecutive stored rows in a seeded order, the rows of each
    `window` consecutive blocks shuffled among themselves (the module docstring draws it)."""

    block: int = 64
    window: int = 16

    def __post_init__(self):
        if self.block < 1 or self.window < 1:
            raise ValueError(f"BlockShuffle(block={self.block}, window={self.window}): both must be at least 1")


def check_shuffle(shuffle) -> tuple[str, BlockShuffle]:
    """(the order's name, the block sizes) for a `shuffle` argument (True / False / a name / a
    BlockShuffle), or a ValueError saying what works."""
    if isinstance(shuffle, BlockShuffle):
        return "block", shuffle
    name = {True: "full", False: "none"}.get(shuffle, shuffle) if isinstance(shuffle, bool) else shuffle
    if name not in ORDERS:
        raise ValueError(f"shuffle={shuffle!r} is not an order; use True (full), False (none), one of {ORDERS} "
                         "or BlockShuffle(block=..., window=...)")
    return name, BlockShuffle()


def spread(rows: np.ndarray, n: int, batch: int) -> float:
    """How far apart in storage the rows of each batch are, as a share of a full shuffle's: 1.0 = as
    spread as a full shuffle, 0 = every batch from one place.

    rows: the stored row of each epoch position (an order of [0, n)); batches: `batch` consecutive
    positions. The number is the mean |row_i - row_j| over pairs in one batch, divided by (n + 1) / 3, its
    expectation under a uniform random permutation. Why this one: storage neighbours share what the build
    put next to each other (one input's documents, one source's rows), so a batch whose pairs sit close in
    storage holds correlated samples. Under the block shuffle two rows of one batch come from one block
    (distance < block) with probability about 1/window and are otherwise as far apart as in a full
    shuffle, so spread is about 1 - 1/window; under storage order it is about batch / n.
    """
    m = len(rows) // batch * batch
    if m == 0 or batch < 2:
        return float("nan")
    sorted_rows = np.sort(np.asarray(rows[:m], np.float64).reshape(-1, batch), axis=1)
    coeff = 2 * np.arange(batch) - batch + 1  # sum_{i<j} (x_j - x_i) = sum_k x_k (2k - batch + 1) when sorted
    mean_pair = (sorted_rows @ coeff).sum() / (m // batch * batch * (batch - 1) / 2)
    return float(mean_pair / ((n + 1) / 3))
