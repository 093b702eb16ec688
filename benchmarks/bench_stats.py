"""How long padding statistics take, as a multiple of numpy.sort on the same lengths.

    python benchmarks/bench_stats.py            # 10M lengths (about a minute on a busy 2-core box)
    python benchmarks/bench_stats.py --quick    # 1M

Rows: numpy.sort (the baseline); corpus_stats without packing (length figures and the four
padding strategies, which need one sort); the length-only figures; and, on a smaller slice,
corpus_stats with FFD + BFD packing, whose time is binpack.pack's (reported for scale).
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

from packer.stats import figures as st  # noqa: E402

SEED = 0
CONTEXT = 2048
BATCH = 8
REPEATS = 3


def _best(fn, repeats=REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--pack-docs", type=int, default=20_000, help="documents in the packing row")
    ap.add_argument("--quick", action="store_true", help="1M documents")
    ap.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.docs, args.pack_docs = 20_000, 2_000
    n = 1_000_000 if args.quick else args.docs

    print(f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, numpy {np.__version__}")
    print(f"config: {n:,} document lengths ~ 1 + lognormal(5.5, 1.3) (median ~245), context {CONTEXT}, "
          f"batch {BATCH}, seed {SEED}, best of {REPEATS}")
    lengths = (np.random.default_rng(SEED).lognormal(5.5, 1.3, n)).astype(np.int64) + 1

    base = _best(lambda: np.sort(lengths))
    rows = [("numpy.sort (baseline)", n, base)]
    rows.append(("corpus_stats, no packing", n, _best(lambda: st.corpus_stats(lengths, CONTEXT, batch_size=BATCH, algorithms=()))))
    rows.append(("length_figures (sorted)", n, _best(lambda: st.length_figures(np.sort(lengths), CONTEXT))))
    small = lengths[: args.pack_docs]
    small_base = _best(lambda: np.sort(small))
    packed = _best(lambda: st.corpus_stats(small, CONTEXT, batch_size=BATCH), repeats=1)

    print(f"\n{'case':<28}{'lengths':>12}{'seconds':>10}{'M lengths/s':>13}{'x numpy.sort':>14}")
    for name, size, sec in rows:
        print(f"{name:<28}{size:>12,}{sec:>10.3f}{size / sec / 1e6:>13.1f}{sec / base:>14.2f}")
    print(f"{'corpus_stats, FFD + BFD':<28}{len(small):>12,}{packed:>10.3f}{len(small) / packed / 1e6:>13.3f}"
          f"{packed / small_base:>14.0f}")

    f = st.corpus_stats(lengths, CONTEXT, batch_size=BATCH, algorithms=())
    print("\npadding share of compute slots (same lengths):")
    for key, s in f["strategies"].items():
        print(f"  {key:<22}{s['padding_share']:>8.2%}  {s['sequences']:>12,} sequences")
    pf = st.corpus_stats(small, CONTEXT, batch_size=BATCH)["strategies"]
    print(f"  pack_ffd on the first {len(small):,}: {pf['pack_ffd']['padding_share']:.2%} padding, "
          f"{pf['pack_ffd']['sequences']:,} sequences vs lower bound {pf['pack_ffd']['lower_bound']:,}")


if __name__ == "__main__":
    main()
