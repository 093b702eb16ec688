"""How far from a full shuffle is each epoch order, and what does computing it cost?

    python benchmarks/bench_shuffle.py                 # n = 1M rows, block 64, window 16
    python benchmarks/bench_shuffle.py --n 100000 --block 32 --window 8

For each order (full shuffle, block shuffle, storage order) it prints `spread` at a few batch sizes
(packer/train/order.py: the mean storage distance of two rows of one batch over a full shuffle's
expectation: 1.0 = a full shuffle, 0 = one place; the block shuffle's expectation is 1 - 1/window), the
distinct stored blocks an order reads per `block * window` positions (what a streaming reader fetches),
and the time to map the epoch's positions to rows, as a ratio to the full shuffle's.

Measured 2026-12-01 (2-core box, busy), n = 1M, block 64, window 16:
    order   spread@8  spread@64  spread@512  blocks/window  time(s)  ratio
    full    1.000     1.000      1.000       992            0.14     1.00
    block   0.938     0.938      0.938       16             0.64     4.73
    none    0.000     0.000      0.001       16             0.00     0.01
The block order spends more time (two permutations and a loop over windows) but stays ~0.6 us a row,
far below reading one (~50 us for a 4096-token row in bench_loader).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer.train.order import epoch_order, spread  # noqa: E402

SEED = 0
BATCHES = (8, 64, 512)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.n = 20_000
    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cpus; n={args.n}, "
          f"block={args.block}, window={args.window}, seed={SEED}")
    rows, times = {}, {}
    for order in ("full", "block", "none"):
        t = time.perf_counter()
        out = [epoch_order(np.arange(a, min(a + 8192, args.n)), args.n, order, SEED, 0, args.block, args.window)
               for a in range(0, args.n, 8192)]
        times[order] = time.perf_counter() - t
        rows[order] = np.concatenate(out)
        assert np.array_equal(np.sort(rows[order]), np.arange(args.n))
    span = args.block * args.window
    print(f"{'order':6} " + " ".join(f"spread@{b:<4}" for b in BATCHES) + f" {'blocks/window':>13} "
          f"{'time(s)':>8} {'ratio':>6}")
    for order, r in rows.items():
        m = len(r) // span * span
        per_window = np.mean([len(np.unique(w // args.block)) for w in r[:m].reshape(-1, span)[:64]])
        print(f"{order:6} " + " ".join(f"{spread(r, args.n, b):11.3f}" for b in BATCHES)
              + f" {per_window:13.0f} {times[order]:8.2f} {times[order] / times['full']:6.2f}")


if __name__ == "__main__":
    main()
