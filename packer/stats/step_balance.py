"""Step balance of a dataset's own rows, before training: how much slower each data-parallel step's slowest
rank is than its mean rank, rows dealt as they come in a seeded shuffle (tokens) or by cost (balanced: what
PackedDataset(balance=Balance(...)) does, packer/balance.py).

    ranks 64, rows/rank 1: tokens slowest/mean 2.04 busy 0.49 | balanced 1.02 busy 0.98, rows moved 9.3 steps

The shuffle is numpy's seeded permutation, not the loader's Feistel order (stats/ does not import train/):
the same figures in distribution, not row for row. Above SAMPLE_ROWS rows the table deals a seeded uniform
sample of that many (sampled_rows), so it costs the same bounded time and memory at any size. A dataset's
rows (`packer stats DIR`, from its stored offsets) and a build's plan (report.html at finalize, from each
sequence's seq_tokens and seq_sq, bucket by bucket) give the same rows in the same order, so the same table.
"""

from __future__ import annotations

import math

import numpy as np

from packer.balance import Balance, CostModel, balance_figures, balanced_order, move_figures

CASES = ((8, 1), (64, 1), (64, 4), (512, 1))  # (ranks, rows per rank)
# Rows dealt at most: above this a seeded uniform sample of this many. 2026-12-05, the team's 2-core machine:
# 1M rows 1.4 s for the four cases; 5M rows given in 10 parts 1.5 s, 118 MB peak (tracemalloc); busy fractions
# of 100K and 1M lognormal rows agree within 0.02.
SAMPLE_ROWS = 1 << 20
_SAMPLE = 0x73616D70  # a tag that keeps the sample's rng stream apart


def sampled_rows(n_rows: int, seed: int) -> np.ndarray:
    """The rows step_balance deals, in the order it deals them: all of them in numpy's seeded permutation, or
    above SAMPLE_ROWS a seeded uniform sample of SAMPLE_ROWS rows in a uniformly random order, drawn in
    O(sample) memory (distinct draws until enough, then a random subset of them: whatever n_rows is)."""
    if n_rows <= SAMPLE_ROWS:
        return np.random.default_rng(seed).permutation(n_rows)
    rng, got = np.random.default_rng([seed, _SAMPLE]), np.zeros(0, np.int64)
    while len(got) < SAMPLE_ROWS:
        got = np.sort(np.concatenate([got, rng.integers(n_rows, size=SAMPLE_ROWS - len(got) + SAMPLE_ROWS // 16)]))
        got = got[np.concatenate([[True], got[1:] != got[:-1]])]  # distinct (np.unique: 10x slower, numpy 2.4)
    return rng.permutation(got)[:SAMPLE_ROWS]


class RowSample:
    """The sampled rows' tokens and pairs (sampled_rows), and exact totals over all rows, from the rows' values
    given a part at a time in row order (`add(tokens, pairs)`: a dataset's rows at once, or a plan bucket by
    bucket). Holds O(sample), not O(rows)."""

    def __init__(self, n_rows: int, seed: int):
        self.n, self.seen, self.total_tokens, self.total_pairs = n_rows, 0, 0, 0
        self.rows = sampled_rows(n_rows, seed)
        self._order = np.argsort(self.rows, kind="stable")
        self._sorted = self.rows[self._order]
        self.tokens, self.pairs = np.zeros(len(self.rows), np.float64), np.zeros(len(self.rows), np.float64)

    def add(self, tokens, pairs) -> RowSample:
        tokens, pairs = np.asarray(tokens), np.asarray(pairs)
        a, b = np.searchsorted(self._sorted, [self.seen, self.seen + len(tokens)])
        at, local = self._order[a:b], self._sorted[a:b] - self.seen
        self.tokens[at], self.pairs[at] = tokens[local], pairs[local]
        self.total_tokens += _exact_sum(tokens)
        self.total_pairs += _exact_sum(pairs)
        self.seen += len(tokens)
        return self

    def figures(self, balance: Balance = Balance(), cases=CASES) -> dict:
        """step_balance's dict of the rows added (every row, in order)."""
        assert self.seen == self.n, f"{self.seen} rows added, {self.n} expected"
        cost: CostModel = balance.cost
        costs = cost.costs(self.tokens, self.pairs)
        share = cost.attention_share(rows=self.n, tokens=float(self.total_tokens), pairs=float(self.total_pairs))
        out = {"cost": {"per_token": cost.per_token, "per_pair": cost.per_pair}, "window": balance.window,
               "attention_share": share,
               "rows": len(costs), "rows_in_dataset": self.n, "cases": []}
        for ranks, rows in cases:
            if len(costs) < ranks * rows:
                continue
            perm = balanced_order(costs, ranks, rows, balance.window)
            plain, dealt = balance_figures(costs, ranks, rows), balance_figures(costs[perm], ranks, rows)
            out["cases"].append({
                "ranks": ranks, "rows_per_rank": rows, "steps": plain["steps"],
                "tokens": {k: plain[k] for k in ("slowest_over_mean", "busy_fraction")},
                "balanced": {**{k: dealt[k] for k in ("slowest_over_mean", "busy_fraction")},
                             **move_figures(perm, costs, ranks, rows)},
            })
        return out


def _exact_sum(x: np.ndarray) -> int:
    """The sum of integer values (tokens, or squared lengths as int64 or float64) as a Python int: int64 sums
    of 2**16 values at a time (each at most L^2 < 2**46 for a context L below 2**23), added without overflow."""
    x = x.astype(np.int64, copy=False)
    return sum(int(v) for v in np.add.reduceat(x, np.arange(0, len(x), 1 << 16))) if len(x) else 0


def step_balance(tokens: np.ndarray, pairs: np.ndarray, *, seed: int = 0, balance: Balance = Balance(),
                 cases=CASES) -> dict:
    """The step-balance figures of rows with these tokens and pairs (packer.balance.row_tokens_pairs, or a
    plan's seq_tokens and seq_sq): one case per (ranks, rows per rank) with at least one whole step, over the
    rows of sampled_rows(len(tokens), seed)."""
    return RowSample(len(tokens), seed).add(tokens, pairs).figures(balance, cases)


def step_balance_rows(f: dict) -> list[tuple[str, ...]]:
    """(ranks, rows/rank, steps, tokens, balanced, rows moved) per case: slowest/mean and busy fraction."""
    rows = []
    for c in (f.get("step_balance") or {}).get("cases", ()):
        t, b = c["tokens"], c["balanced"]
        rows.append((str(c["ranks"]), str(c["rows_per_rank"]), f"{c['steps']:,}",
                     f"{t['slowest_over_mean']:.3f} / {t['busy_fraction']:.3f}",
                     f"{b['slowest_over_mean']:.3f} / {b['busy_fraction']:.3f}", f"{b['mean_moved_steps']:.1f}"))
    return rows


STEP_BALANCE_HEAD = ("ranks", "rows/rank", "steps", "tokens: slowest/mean / busy", "balanced: slowest/mean / busy",
                     "rows moved (steps)")


def step_balance_title(f: dict) -> str:
    s = f["step_balance"]
    default = CostModel()
    model = (" (the default: an 8B dense model; packer stats DIR --cost or --model-* for yours)"
             if (s["cost"]["per_token"], s["cost"]["per_pair"]) == (default.per_token, default.per_pair) else "")
    sample = (f", a seeded sample of {s['rows']:,} of its {s['rows_in_dataset']:,} rows"
              if s.get("rows", 0) < s.get("rows_in_dataset", 0) else "")
    return (f"step balance: cost {s['cost']['per_token']:.3g} a token + {s['cost']['per_pair']:.3g} an L^2 entry{model} "
            f"(attention {s['attention_share']:.1%}), window {s['window']} steps{sample}")


def cost_model(*, cost: str | None = None, n_params: float | None = None, d_model: int | None = None,
               n_layers: int | None = None) -> CostModel | None:
    """The cost model `packer stats` options name: --cost PER_TOKEN,PER_PAIR, or all three of --model-params,
    --model-d, --model-layers (CostModel.for_model); None when none is given (the default)."""
    model = (n_params, d_model, n_layers)
    if cost is not None and any(x is not None for x in model):
        raise ValueError(f"--cost {cost} and --model-* both name the cost model; give one of them")
    if cost is not None:
        try:
            per_token, per_pair = (float(x) for x in cost.split(","))
        except ValueError:
            raise ValueError(f"--cost {cost!r}: give PER_TOKEN,PER_PAIR, two numbers (e.g. 4.8e10,786432)") from None
        if not (math.isfinite(per_token) and math.isfinite(per_pair)):
            raise ValueError(f"--cost {cost!r}: both numbers must be finite")
        return CostModel(per_token=per_token, per_pair=per_pair)
    if all(x is None for x in model):
        return None
    if any(x is None for x in model):
        raise ValueError("--model-params, --model-d and --model-layers go together: give all three "
                         "(e.g. 8e9, 4096, 32) or none")
    if not (n_params > 0 and d_model > 0 and n_layers > 0):
        raise ValueError(f"--model-params {n_params}, --model-d {d_model}, --model-layers {n_layers}: each must be > 0")
    return CostModel.for_model(n_params=n_params, d_model=d_model, n_layers=n_layers)
