"""Does exact FFD/BFD cost no more than sorting the lengths, and what does --pack-group cost?

    python benchmarks/bench_binpack.py            # N = 10M pieces, about 2 minutes on a quiet box
    python benchmarks/bench_binpack.py --quick    # N = 1M, textbook at 5k: a smoke run

Prints, per distribution and capacity: pack time and its ratio to numpy.argsort(kind="stable")
and numpy.bincount on the same int64 array (timed in turns in the same run, best of REPEATS), fill rate
and n_bins / lower bound; the speed-up over the textbook O(N x bins) FFD/BFD (and that both give
the same bins); peak extra memory of pack in bytes per item (tracemalloc); TRL / OLMo-core rows
when importable; and the fill-rate cost of packing in groups of documents.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer.binpack import (  # noqa: E402
    lower_bound,
    pack,
    split_documents,  # noqa: E402
)
from packer.preprocess.plan import pack_groups  # noqa: E402

SEED = 0
N = 10_000_000  # pieces (documents split at the capacity), int64
N_TEXTBOOK = 20_000
N_PEERS = 1_000_000  # documents for the TRL / OLMo-core rows (capacity 4096)
CAPACITIES = (2048, 4096, 8192)
GROUPS = (10_000, 100_000, 1_000_000)
REPEATS = 3
SIGMA = float(np.sqrt(2 * np.log(2)))  # lognormal: mean = 2 x median
DISTRIBUTIONS = {"web": 300, "short": 60}  # median document length in tokens
TAIL = 100_000  # documents are cut here, then split at the capacity


def documents(median: int, n_docs: int, seed: int = SEED) -> np.ndarray:
    rng = np.random.default_rng(seed)
    docs = np.rint(rng.lognormal(np.log(median), SIGMA, size=n_docs)).astype(np.int64)
    return np.clip(docs, 1, TAIL)


def pieces(median: int, capacity: int, n: int):
    """The first n pieces of lognormal documents split at the capacity, and each piece's document."""
    mean_pieces = 1 + 2 * median / capacity  # generous: split documents give extra pieces
    docs = documents(median, int(n / mean_pieces) + 1000)
    while True:
        piece_doc, _, piece_len = split_documents(docs, capacity)
        if len(piece_len) >= n:
            return piece_len[:n].copy(), piece_doc[:n].copy()
        docs = np.concatenate([docs, documents(median, len(docs), seed=len(docs))])


def best_time(fn, repeats=REPEATS):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def race(fns: dict, repeats=REPEATS) -> dict:
    """Best time of each function, the functions taking turns so they see the same machine load."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


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


def fill(lengths, bins, capacity):
    s = summarize(lengths, bins, capacity)
    return f"{s.fill_rate:.5f}  {s.n_bins:>9,}/{s.lower_bound:,} (+{s.n_bins - s.lower_bound})"


def textbook(lengths, capacity, algorithm):
    """The O(N x bins) reference of tests/test_binpack.py."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    room, bins = [], [None] * len(lengths)
    for i in order:
        fits = [b for b, r in enumerate(room) if r >= lengths[i]]
        if not fits:
            room.append(capacity)
            b = len(room) - 1
        elif algorithm == "ffd":
            b = fits[0]
        else:
            b = min(fits, key=lambda b: (room[b], b))
        room[b] -= lengths[i]
        bins[i] = b
    return bins


def speed_table(n):
    print(f"\n## pack vs numpy at N = {n:,} int64 pieces (best of {REPEATS}); ratio < 1 = faster than the sort")
    print(f"{'dist':<6}{'cap':>6}{'algo':>6}{'seconds':>9}{'/argsort':>10}{'/bincount':>11}"
          f"{'argsort s':>11}{'fill rate':>11}  n_bins/lower bound")
    for dist, median in DISTRIBUTIONS.items():
        for capacity in CAPACITIES:
            lengths, _ = pieces(median, capacity, n)
            times = race({"argsort": lambda: np.argsort(lengths, kind="stable"),
                          "bincount": lambda: np.bincount(lengths),
                          "ffd": lambda: pack(lengths, capacity, "ffd"),
                          "bfd": lambda: pack(lengths, capacity, "bfd")})
            t_sort, t_count = times["argsort"], times["bincount"]
            for algorithm in ("ffd", "bfd"):
                t, bins = times[algorithm], pack(lengths, capacity, algorithm)
                print(f"{dist:<6}{capacity:>6}{algorithm:>6}{t:>9.3f}{t / t_sort:>9.2f}x{t / t_count:>10.1f}x"
                      f"{t_sort:>11.3f}  {fill(lengths, bins, capacity)}")


def textbook_table(n, capacity=4096):
    print(f"\n## pack vs the textbook O(N x bins) loop at N = {n:,} web pieces, capacity {capacity}")
    lengths, _ = pieces(DISTRIBUTIONS["web"], capacity, n)
    as_list = lengths.tolist()
    for algorithm in ("ffd", "bfd"):
        t_ref, ref = best_time(lambda: textbook(as_list, capacity, algorithm), repeats=1)
        t, bins = best_time(lambda: pack(lengths, capacity, algorithm))
        same = "same bins" if bins.tolist() == ref else "DIFFERENT BINS"
        print(f"{algorithm}: textbook {t_ref:.2f} s, pack {t * 1e3:.2f} ms, speed-up {t_ref / t:,.0f}x, {same}")


def memory_table(n, capacity=4096):
    print(f"\n## peak extra memory of pack (tracemalloc) at N = {n:,}, capacity {capacity}; input not counted")
    lengths, _ = pieces(DISTRIBUTIONS["web"], capacity, n)
    for algorithm in ("ffd", "bfd"):
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        pack(lengths, capacity, algorithm)
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        print(f"{algorithm}: {peak / n:.1f} bytes/item, output (8 bytes/item) included")


def peers_table(n_docs, capacity=4096):
    print(f"\n## peers at {n_docs:,} web documents, capacity {capacity}")
    lengths, _ = pieces(DISTRIBUTIONS["web"], capacity, n_docs)
    times = race({"argsort": lambda: np.argsort(lengths, kind="stable"), "bfd": lambda: pack(lengths, capacity, "bfd")})
    t_sort, t, bins = times["argsort"], times["bfd"], pack(lengths, capacity, "bfd")
    print(f"{'numpy argsort stable':<28}{t_sort:>9.3f} s")
    print(f"{'packer bfd':<28}{t:>9.3f} s   {fill(lengths, bins, capacity)}")
    try:
        from datasets import Dataset
        from trl import pack_dataset
    except ImportError as e:
        print(f"{'TRL pack_dataset':<28}   skipped: not importable ({e.name}); measured elsewhere at 1M: ~26 s")
    else:
        ds = Dataset.from_dict({"input_ids": [np.zeros(n, np.int32) for n in lengths.tolist()]})
        t_trl, packed = best_time(lambda: pack_dataset(ds, seq_length=capacity, strategy="bfd"), repeats=1)
        print(f"{'TRL pack_dataset (bfd)':<28}{t_trl:>9.3f} s   {len(packed):,} rows, {t_trl / t:,.0f}x packer")
    try:
        import olmo_core  # noqa: F401
    except ImportError as e:
        print(f"{'OLMo-core best-fit packer':<28}   skipped: not importable ({e.name}); measured elsewhere at 1M: ~6.5 s")
    else:
        print(f"{'OLMo-core best-fit packer':<28}   skipped: importable, but no row written for its packer API yet")


def group_table(n, capacity=4096):
    print(f"\n## --pack-group: fill-rate cost against one global FFD, N = {n:,} web pieces, capacity {capacity}")
    lengths, piece_doc = pieces(DISTRIBUTIONS["web"], capacity, n)
    n_docs = int(piece_doc[-1]) + 1
    print(f"{'group (docs)':>14}{'groups':>9}{'seconds':>9}{'fill rate':>11}  {'n_bins/lower bound':<28}{'extra bins':>11}")
    whole = None
    for group in (None, *GROUPS):
        if group is not None and group >= n_docs:
            continue
        t, bins = best_time(lambda: pack_groups(lengths, piece_doc, capacity, "ffd", group), repeats=1)
        s = summarize(lengths, bins, capacity)
        whole = whole or s
        label = "global" if group is None else f"{group:,}"
        n_groups = 1 if group is None else -(-n_docs // group)
        print(f"{label:>14}{n_groups:>9,}{t:>9.3f}{s.fill_rate:>11.5f}  {s.n_bins:>12,}/{s.lower_bound:<15,}"
              f"{(s.n_bins - whole.n_bins) / whole.n_bins:>10.4%}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1M and textbook at 5k (a smoke run)")
    parser.add_argument("--n", type=int, default=None, help="pieces per row (default 10M, 1M with --quick)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.n = 20_000
    n = args.n or (1_000_000 if args.quick else N)
    n_textbook = 300 if args.smoke else 5_000 if args.quick else N_TEXTBOOK
    print(f"# bench_binpack  {time.strftime('%Y-%m-%d %H:%M')}  python {platform.python_version()}  numpy {np.__version__}")
    print(f"# {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}  "
          f"seed={SEED} lognormal sigma={SIGMA:.3f} tail={TAIL:,} medians={DISTRIBUTIONS}")
    speed_table(n)
    textbook_table(n_textbook)
    memory_table(n)
    peers_table(min(N_PEERS, n))
    group_table(n)


if __name__ == "__main__":
    main()
