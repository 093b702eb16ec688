"""Step balance of a dataset's own rows, before training: how much slower each data-parallel step's slowest
rank is than its mean rank, rows dealt as they come in a seeded shuffle (tokens) or by cost (balanced: what
PackedDataset(balance=Balance(...)) does, packer/balance.py).

    ranks 64, rows/rank 1: tokens slowest/mean 2.04 busy 0.49 | balanced 1.02 busy 0.98, rows moved 9.3 steps

The shuffle is numpy's seeded permutation, not the loader's Feistel order (stats/ does not import train/):
the same figures in distribution, not row for row.
"""

from __future__ import annotations

import numpy as np

from packer.balance import Balance, CostModel, balance_figures, balanced_order, move_figures

CASES = ((8, 1), (64, 1), (64, 4), (512, 1))  # (ranks, rows per rank)


def step_balance(tokens: np.ndarray, pairs: np.ndarray, *, seed: int = 0, balance: Balance = Balance(),
                 cases=CASES) -> dict:
    """The step-balance figures of rows with these tokens and pairs (packer.balance.row_tokens_pairs): one case
    per (ranks, rows per rank) with at least one whole step."""
    cost: CostModel = balance.cost
    costs = cost.costs(tokens, pairs)[np.random.default_rng(seed).permutation(len(tokens))]
    out = {"cost": {"per_token": cost.per_token, "per_pair": cost.per_pair}, "window": balance.window,
           "attention_share": cost.attention_share(tokens, pairs), "cases": []}
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
    return (f"step balance: cost {s['cost']['per_token']:.3g} a token + {s['cost']['per_pair']:.3g} an L^2 entry "
            f"(attention {s['attention_share']:.1%}), window {s['window']} steps")
