"""Step balance: what a packed row costs to train (tokens and squared document lengths, from its offsets), and a
dealing of rows to ranks and micro-batches that makes every rank's step cost about the same.

A leaf (numpy only) so that the loader (packer/train/balance.py) and the stats (packer/stats/) share it, and
with it the one flattening of rows' offsets into their document lengths (document_lengths, row_sums) that
Megatron's row check and PaddedDocuments use too.

Cost of a row = per_token * tokens + per_pair * pairs, where pairs is the sum of its documents'
squared lengths (the entries of each document's L x L score matrix). A row [a a a | b b]:

    offsets [0 3 5]   tokens 5   pairs 3^2 + 2^2 = 13

`CostModel.for_model(n_params, d_model, n_layers)` is the usual FLOP count: 6 a parameter a token
(forward + backward), and 6 * d_model * n_layers an entry of L^2: a causal kernel computes the
L (L + 1) / 2 (query, key) pairs at or below the diagonal, each 2 d_model for QK^T and 2 d_model
for AV a layer forward, x3 with backward: 12 d_model n_layers a causal pair = 6 d_model n_layers
an entry of L^2 (to within L / 2 entries).

Dealing (`deal_window`): a window of `steps` steps of `world * rows_per_rank` rows, given in their
shuffled order, is dealt again inside itself. Rows sorted by cost (heaviest first; rows within the tie
tolerance keep their shuffled order) are dealt in rounds to "bins" that each end with about the same
sum (round 0 one row to each bin in order, every later round its heaviest rows to the bins lightest so
far: LPT by rounds). The bins are the micro-batches of `unit` rows when unit > 1 (dealt in turn, whole,
to the ranks' steps), else each rank's step (its rows, heaviest first, are its one-row micro-batches).
The bins of one step are consecutive, and the steps are put in the order of their rows' mean shuffled
step, so a row moves about as little as the dealing lets it. steps 2, world 2, rows_per_rank 1:

    shuffled costs (steps 0 | 1)   [1 9 | 8 2]     sorted  9 8 2 1  -> bins [9] [8] [2] [1]
    steps of 2 bins                [9 8] mean shuffled step 0.5,  [2 1] mean 0.5 -> kept in that order
    dealt (step k's ranks turned by k)  [9 8 | 1 2]     slowest / mean per step 9/8.5, 2/1.5

Positions of a window: step s, micro-batch i, rank r, row j of the micro-batch sits at
s * world * rows_per_rank + i * unit * world + r * unit + j, the loader's batch-major striping
(packer/train/partition.py) with units of `unit` rows. A last part of fewer than one step stays as it is.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

TIE = 0.005  # costs within 0.5% of each other count as equal: such rows keep their shuffled order


@dataclasses.dataclass(frozen=True, kw_only=True)
class CostModel:
    """Seconds (or FLOPs: only ratios matter) a row costs: per_token * tokens + per_pair * pairs (+ per_row, a
    fixed cost a row that a fit finds; it moves every rank alike). The default is an 8B dense model (d_model
    4096, 32 layers): CostModel.for_model(n_params=8e9, d_model=4096, n_layers=32)."""

    per_token: float = 6 * 8e9
    per_pair: float = 6 * 4096 * 32
    per_row: float = 0.0
    r2: float | None = dataclasses.field(default=None, compare=False)  # of a fitted model

    def __post_init__(self):
        if not (self.per_token >= 0 and self.per_pair >= 0 and self.per_token + self.per_pair > 0):
            raise ValueError(f"CostModel(per_token={self.per_token}, per_pair={self.per_pair}): both must be >= 0 "
                             "and one > 0")

    @classmethod
    def for_model(cls, *, n_params: float, d_model: int, n_layers: int) -> CostModel:
        """6 n_params FLOPs a token, 6 d_model n_layers an entry of a document's L^2 (module docstring)."""
        return cls(per_token=6.0 * n_params, per_pair=6.0 * d_model * n_layers)

    @classmethod
    def fit(cls, tokens, pairs, seconds) -> CostModel:
        """Least squares seconds ~ per_row + per_token * tokens + per_pair * pairs over timed rows; r2 says
        how well."""
        x = np.column_stack([np.ones(len(tokens)), np.asarray(tokens, float), np.asarray(pairs, float)])
        y = np.asarray(seconds, float)
        if len(y) < 3:
            raise ValueError(f"CostModel.fit needs at least 3 timed rows, got {len(y)}")
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        residual = y - x @ coef
        r2 = 1 - float(residual @ residual) / max(float(((y - y.mean()) ** 2).sum()), 1e-300)
        return cls(per_token=max(float(coef[1]), 0.0), per_pair=max(float(coef[2]), 0.0) or 1e-30,
                   per_row=max(float(coef[0]), 0.0), r2=r2)

    def costs(self, tokens, pairs) -> np.ndarray:
        tokens, pairs = np.asarray(tokens, np.float64), np.asarray(pairs, np.float64)
        return self.per_row + self.per_token * tokens + self.per_pair * pairs

    def attention_share(self, *, rows: int, tokens: float, pairs: float) -> float:
        """The share of the cost of `rows` rows holding `tokens` tokens and `pairs` pairs in all that is attention:
        per_pair * pairs / (per_row * rows + per_token * tokens + per_pair * pairs), 0 when that costs nothing
        (the stats' `attention_share`; totals, so a sample of the rows can give them exact)."""
        whole = self.per_row * rows + self.per_token * tokens + self.per_pair * pairs
        return self.per_pair * pairs / whole if whole else 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Balance:
    """Deal each step's rows to ranks by cost: PackedDataset(path, balance=Balance(cost=CostModel(...),
    rows_per_rank=1, window=32)). rows_per_rank: rows a rank takes a step (a multiple of the loader's
    batch_size: micro-batches); window: steps whose rows are dealt together (a row moves less than
    `window` steps from its shuffled place, about window / 3 on average)."""

    cost: CostModel = CostModel()
    rows_per_rank: int = 1
    window: int = 32

    def __post_init__(self):
        if self.rows_per_rank < 1 or self.window < 1:
            raise ValueError(f"Balance(rows_per_rank={self.rows_per_rank}, window={self.window}): both must be at "
                             "least 1")
        if not isinstance(self.cost, CostModel):
            raise ValueError(f"Balance(cost={self.cost!r}): give a packer.data.CostModel")

    def key(self) -> str:
        cost = self.cost
        return f"{cost.per_token!r}:{cost.per_pair!r}:{cost.per_row!r}:{self.rows_per_rank}:{self.window}"


def document_lengths(offsets: np.ndarray, n_offsets: np.ndarray) -> np.ndarray:
    """Every row's document lengths back to back, int64, from the rows' offsets back to back (each row's 0 ... T)
    and how many offsets each row has. Offsets [0 3 5 | 0 4 | 0], n_offsets [3 2 1] -> [3 2 | 4 |]: row k's are
    the n_offsets[k] - 1 after the earlier rows' (row_sums adds them up a row)."""
    lengths = np.diff(np.asarray(offsets, np.int64))
    inside = np.ones(len(lengths), bool)
    inside[np.cumsum(n_offsets)[:-1] - 1] = False  # the step from one row's last offset to the next row's 0
    return lengths[inside]


def row_document_lengths(offsets: list) -> tuple[np.ndarray, np.ndarray]:
    """(document_lengths, n_docs) of rows given as a list of offsets arrays: [[0 3 5], [0 4]] -> ([3 2 4], [2 1])."""
    n_offsets = np.fromiter(map(len, offsets), np.int64, len(offsets))
    flat = np.concatenate(offsets, dtype=np.int64) if len(offsets) else np.zeros(0, np.int64)
    return document_lengths(flat, n_offsets), n_offsets - 1


def row_sums(values: np.ndarray, n_docs: np.ndarray) -> np.ndarray:
    """Each row's sum of its n_docs values (values back to back, as document_lengths gives them; a row of none
    sums to 0), in the values' dtype: row_sums([3 2 4], [2 0 1]) -> [5 0 4]."""
    values = np.asarray(values)
    starts = np.cumsum(n_docs) - n_docs
    if not len(values):
        return np.zeros(len(n_docs), values.dtype)
    sums = np.add.reduceat(np.append(values, values.dtype.type(0)), starts)  # one past the end for trailing empties
    sums[np.asarray(n_docs) == 0] = 0  # reduceat gives an empty range the value at its start
    return sums


def row_tokens_pairs(offsets: list) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, pairs: the sum of squared document lengths) of each row, int64 and float64, from each
    row's offsets (0 ... T)."""
    lengths, n_docs = row_document_lengths(offsets)
    return row_sums(lengths, n_docs), row_sums(lengths.astype(np.float64) ** 2, n_docs)


def deal_window(costs: np.ndarray, world: int, rows_per_rank: int, unit: int = 1) -> np.ndarray:
    """perm: slot t of the window takes the row at index perm[t] of `costs` (the window's rows in their
    shuffled order); a bijection of [0, len(costs)) (module docstring draws it)."""
    costs = np.asarray(costs, np.float64)
    n, rows = len(costs), rows_per_rank
    per_step = world * rows
    n_steps = n // per_step
    perm = np.arange(n, dtype=np.int64)
    if n_steps == 0:
        return perm
    used = n_steps * per_step
    shuffled_step = np.arange(used) // per_step
    order = np.lexsort((shuffled_step, -_tie_class(costs[:used])))  # heaviest first; ties in their shuffled order
    sorted_costs = costs[order]
    n_bins = n_steps * world  # a rank's step each
    if unit > 1:  # micro-batches first (each within the spread of one row), then whole ones to ranks, by rounds
        micro_bin, within = _deal_rounds(sorted_costs, used // unit)
        sums = np.bincount(micro_bin, weights=sorted_costs)
        by_sum = np.lexsort((np.arange(len(sums)), -_tie_class(sums)))
        bins, micro = np.empty(len(sums), np.int64), np.empty(len(sums), np.int64)
        bins[by_sum], micro[by_sum] = _deal_rounds(sums[by_sum], n_bins)
        bins, micro = bins[micro_bin], micro[micro_bin]
    else:  # a rank's rows are its one-row micro-batches, heaviest first
        (bins, micro), within = _deal_rounds(sorted_costs, n_bins), 0
    group = bins // world
    mean_step = np.bincount(group, weights=shuffled_step[order], minlength=n_steps)
    step = np.empty(n_steps, np.int64)
    step[np.argsort(mean_step, kind="stable")] = np.arange(n_steps)
    rank = (bins + group) % world  # turned by the step, so no rank always takes the heaviest
    slot = step[group] * per_step + micro * unit * world + rank * unit + within
    perm[slot] = order
    return perm


def _tie_class(costs: np.ndarray) -> np.ndarray:
    return np.floor(np.log(np.maximum(costs, 1e-300)) / math.log1p(TIE))


def _deal_rounds(values: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """(bin, round) of each of the values (heaviest first) dealt in rounds of n_bins: round 0 one to each bin in
    order, every later round its heaviest to the bin lightest so far (ties to the lower bin). A bin's sum stays
    within the spread of the values of its rows' rounds of every other's: pairing ascending sums with
    descending values spreads them no wider than the wider of the two. values [9 8 7 3 2 1], 3 bins:
    round 0 -> bins 0 1 2 (sums 9 8 7), round 1: 3 to bin 2, 2 to bin 1, 1 to bin 0 (sums 10 10 10)."""
    n = len(values)
    rnd = np.arange(n) // n_bins
    bins = np.empty(n, np.int64)
    sums = np.zeros(n_bins)
    for r in range(-(-n // n_bins)):
        a, b = r * n_bins, min((r + 1) * n_bins, n)
        lightest = np.argsort(sums, kind="stable")[: b - a]
        bins[a:b] = lightest
        sums[lightest] += values[a:b]
    return bins, rnd


def balanced_order(costs: np.ndarray, world: int, rows_per_rank: int, window: int, unit: int = 1) -> np.ndarray:
    """perm over a whole order of rows: every window of `window` steps dealt by deal_window."""
    costs = np.asarray(costs, np.float64)
    size = window * world * rows_per_rank
    out = np.arange(len(costs), dtype=np.int64)
    for start in range(0, len(costs), size):
        out[start:start + size] = start + deal_window(costs[start:start + size], world, rows_per_rank, unit)
    return out


def step_costs(costs: np.ndarray, world: int, rows_per_rank: int, unit: int = 1) -> np.ndarray:
    """[step, rank]: each rank's cost of each whole step, with rows striped as the loader does."""
    per_step = world * rows_per_rank
    n_steps = len(costs) // per_step
    c = np.asarray(costs[:n_steps * per_step], np.float64).reshape(n_steps, rows_per_rank // unit, world, unit)
    return c.sum(axis=(1, 3))


def balance_figures(costs: np.ndarray, world: int, rows_per_rank: int, unit: int = 1) -> dict:
    """slowest / mean (the mean over steps of each step's slowest rank over its mean rank) and busy
    fraction (sum over steps of the mean rank's cost / sum of the slowest's: the share of time working)."""
    per_rank = step_costs(costs, world, rows_per_rank, unit)
    if not len(per_rank):
        return {"slowest_over_mean": float("nan"), "busy_fraction": float("nan"), "steps": 0}
    slowest, mean = per_rank.max(axis=1), per_rank.mean(axis=1)
    return {"slowest_over_mean": float((slowest / np.maximum(mean, 1e-300)).mean()),
            "busy_fraction": float(mean.sum() / slowest.sum()), "steps": len(per_rank)}


def move_figures(perm: np.ndarray, costs: np.ndarray, world: int, rows_per_rank: int) -> dict:
    """What balancing costs in randomness: the mean number of steps a row moved from its shuffled step,
    and the correlation of a row's cost with its new step index (0 for the shuffled order itself)."""
    per_step = world * rows_per_rank
    used = len(perm) // per_step * per_step
    if used == 0:
        return {"mean_moved_steps": 0.0, "corr_cost_step": float("nan")}
    step = np.arange(used) // per_step
    moved = np.abs(step - perm[:used] // per_step)
    c = np.asarray(costs, np.float64)[perm[:used]]
    corr = float(np.corrcoef(c, step)[0, 1]) if c.std() > 0 and used > per_step else 0.0
    return {"mean_moved_steps": float(moved.mean()), "corr_cost_step": corr}
