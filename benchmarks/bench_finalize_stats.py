"""Does finalize's stats.json stay in bounded memory? Both paths of packer/stats/streamed.finalize_stats on the same files.

    python benchmarks/bench_finalize_stats.py --docs 100_000_000
    python benchmarks/bench_finalize_stats.py --docs 1_000_000_000 --only summaries   # 8 GB of lengths files

Synthetic unit files as the tokenize stage writes them (int64 lengths.npy, web-like: lognormal,
median ~400 tokens, 1% over the context of 4096; 1M documents a unit) and per-bucket sequence
summaries as the plan stage writes them (bucket-*.stats.npz, int32 seq_tokens / seq_docs /
seq_split, one bucket per 1M documents: what --pack-group 1M gives), then finalize_stats on them
twice, each in a fresh process: from whole arrays (the path up to STREAM_ABOVE) and from summaries
(forced). Printed: time, peak RSS and the RSS the stats added over the process at start, the ratio
streamed / arrays, and how far the two stats.json apart are (integers must be equal; floats from
sums within 1e-12 relative).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packer, not an installed one

SEED = 0
CONTEXT_LENGTH = 4096
DOCS_PER_UNIT = 1_000_000
MEAN_DOCS = 7.6  # documents a sequence at 4096 for these lengths (mean ~660 tokens incl. split pieces)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _now_rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


def _make(d: Path, n_docs: int):
    """Unit lengths files, bucket stats files and the plan index; returns (n_sequences, n_tokens)."""
    (d / "units").mkdir(parents=True)
    (d / "plan").mkdir()
    n_units = -(-n_docs // DOCS_PER_UNIT)
    seqs, tokens_out = [], 0
    for u in range(n_units):
        rng = np.random.default_rng([SEED, u])
        x = np.maximum(rng.lognormal(6.0, 1.0, min(DOCS_PER_UNIT, n_docs - u * DOCS_PER_UNIT)), 1).astype(np.int64)
        np.save(d / "units" / f"unit-{u:06d}.lengths.npy", x)
        n = max(int(x.sum()) // CONTEXT_LENGTH, 1)  # sequences nearly full, as FFD leaves them
        t = CONTEXT_LENGTH - np.minimum(rng.geometric(0.02, n) - 1, CONTEXT_LENGTH - 1)
        docs = np.maximum(rng.poisson(MEAN_DOCS, n), 1)
        split = (rng.random(n) < 0.03) * np.minimum(docs, 2)
        np.savez(d / "plan" / f"bucket-{u:06d}.stats.npz", seq_tokens=t.astype(np.int32), seq_docs=docs.astype(np.int32),
                 seq_split=split.astype(np.int32))
        seqs.append(n)
        tokens_out += int(t.sum())
    from packer.preprocess.plan_groups import PlanIndex

    k = np.arange(n_units, dtype=np.int64)
    PlanIndex(shard_bucket=k, shard_local=np.zeros(n_units, np.int64), shard_sequences=np.array(seqs, np.int64),
              shard_tokens=np.full(n_units, tokens_out // n_units, np.int64), shard_pieces=np.array(seqs, np.int64) * 8,
              source_sequences=np.array([0, sum(seqs)], np.int64), source_shards=np.array([0, n_units], np.int64),
              n_buckets=n_units, n_truncated_tokens=0, n_dropped_docs=0, piece_sq_sum=0).save(d / "plan.npz")
    return sum(seqs), n_units


def _child(d: Path, path: str, n_docs: int):
    """One finalize_stats in this process; prints {"seconds", "peak_mb", "start_mb"} and writes the stats."""
    from packer.preprocess.plan_groups import PlanIndex
    from packer.stats import streamed

    plan = PlanIndex.load(d / "plan.npz")
    files = sorted((d / "units").glob("unit-*.lengths.npy"))
    streamed.STREAM_ABOVE = 0 if path == "summaries" else 10**18
    start_mb = _now_rss_mb()
    t0 = time.perf_counter()
    out = streamed.finalize_stats(lambda: (np.load(p) for p in files), plan, d / "plan", CONTEXT_LENGTH,
                                  algorithm="ffd", seed=SEED, n_documents=n_docs)
    seconds = time.perf_counter() - t0
    (d / f"stats-{path}.json").write_text(json.dumps(out))
    print(json.dumps({"seconds": seconds, "peak_mb": _rss_mb(), "start_mb": start_mb}))


def _leaves(x, path="$"):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, x


def _compare(a: dict, b: dict) -> tuple[int, int, float, str]:
    """(leaves, integer leaves that differ, largest relative float difference, where)."""
    la, lb = dict(_leaves(a)), dict(_leaves(b))
    assert la.keys() == lb.keys(), "the two stats.json differ in shape"
    bad_ints, worst, where = 0, 0.0, "-"
    for k, x in la.items():
        y = lb[k]
        if isinstance(x, float) or isinstance(y, float):
            rel = abs(x - y) / max(abs(x), abs(y)) if x != y else 0.0
            if rel > worst:
                worst, where = rel, k
        elif x != y:
            bad_ints += 1
    return len(la), bad_ints, worst, where


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=100_000_000)
    ap.add_argument("--dir", help="make the temporary directory in this one")
    ap.add_argument("--only", choices=["summaries"], help="run the summaries path only (a corpus whose arrays do not fit)")
    ap.add_argument("--child", choices=["arrays", "summaries"], help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.docs = 50_000
    if args.child:
        return _child(Path(args.dir), args.child, args.docs)
    import packer

    print(f"python {platform.python_version()}, numpy {np.__version__}, packer {packer.__version__}, "
          f"{os.cpu_count()} cpus, {platform.machine()}; docs {args.docs:,}, context {CONTEXT_LENGTH}, seed {SEED}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        t0 = time.perf_counter()
        n_seq, n_units = _make(d, args.docs)
        print(f"made {n_units} units, {n_seq:,} sequences in {n_units} buckets in {time.perf_counter() - t0:.0f} s")
        rows = {}
        for path in ("summaries",) if args.only else ("arrays", "summaries"):
            r = subprocess.run([sys.executable, __file__, "--child", path, "--dir", str(d), "--docs", str(args.docs)],
                               check=True, capture_output=True, text=True)
            rows[path] = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{'path':<11}{'seconds':>9}{'peak RSS MB':>13}{'added MB':>10}{'B/doc added':>13}")
        for path, r in rows.items():
            added = r["peak_mb"] - r["start_mb"]
            print(f"{path:<11}{r['seconds']:>9.1f}{r['peak_mb']:>13.0f}{added:>10.0f}{added * 2**20 / args.docs:>13.2f}")
        if args.only:
            return
        a, s = rows["arrays"], rows["summaries"]
        print(f"summaries / arrays: time {s['seconds'] / a['seconds']:.2f}x, peak RSS {s['peak_mb'] / a['peak_mb']:.3f}x, "
              f"added RSS {(s['peak_mb'] - s['start_mb']) / max(a['peak_mb'] - a['start_mb'], 1e-9):.4f}x")
        stats = [json.loads((d / f"stats-{p}.json").read_text()) for p in ("arrays", "summaries")]
        n, bad, worst, where = _compare(*stats)
        print(f"stats.json: {n} leaves, {bad} integers differ, largest float difference {worst:.2e} relative ({where})"
              + ("" if bad == 0 and worst <= 1e-12 else "  <-- MISMATCH"))
        if not math.isfinite(worst) or bad:
            sys.exit(1)


if __name__ == "__main__":
    main()
