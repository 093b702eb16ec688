"""Does planning stay in bounded memory at corpus scale? The plan and write stages on synthetic unit files.

    python benchmarks/bench_scale.py --docs 10_000_000
    python benchmarks/bench_scale.py --docs 1_000_000_000 --workers 2 --pack-group 2_000_000   # ~50 GB of plan files

Unit files of web-like document lengths (lognormal, median ~400 tokens, 1% over the context of
4096), 1M documents a unit; their token files are sparse (a .npy header, then a hole: zero cost,
zeros when read). The plan stage (packer/preprocess/plan_groups.py: group tasks, bucket tasks, one plan
file per shard) runs on them with --pack-group, then the write stage writes the first
--write-shards shards (memmap). Printed: driver peak RSS (this process: with --workers 1 the tasks
run in it, so that is a group task's peak; with more, the workers' peak is printed too), bytes per
document, plan time per document, plan bytes each write task reads, and fill rate against the
lower bound for each group size (packed directly on the first 10M documents, no files).

2026-12-01, shared 2-core box (24 GB), context 4096 (docs/scale.md):
    plan: 10,000,000 docs, driver peak RSS 190 MB, 19.9 bytes/doc, 86 s      (--workers 1, load 12-17)
    plan: 100,000,000 docs, driver peak RSS 190 MB, 2.0 bytes/doc, 1088 s    (--workers 1, load 12-17; 51 s of CPU)
    plan: 1,000,000,000 docs, driver peak RSS 87 MB, 0.1 bytes/doc, 273 s    (--workers 2 --pack-group 2M, load 1-3;
                                                                             each worker 316 MB = 120 B/doc of a group)
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packer, not an installed one

from packer import __version__
from packer.binpack import lower_bound, pack, split_documents
from packer.config import BuildConfig
from packer.preprocess import writer
from packer.preprocess.executors import make_executor
from packer.preprocess.plan_groups import GROUP_BYTES_PER_DOC, PLAN_DIR, plan_streamed

SEED = 0
CONTEXT_LENGTH = 4096
DOCS_PER_UNIT = 1_000_000
FILL_DOCS = 10_000_000  # documents the fill-rate table packs
FILL_GROUPS = (10_000, 100_000, 1_000_000, None)


def _rss_mb(who=resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # KiB on Linux


def _workers_peak_mb(executor) -> float:
    """Peak RSS (VmHWM) of the pool's worker processes, read before they are stopped."""
    peak = 0.0
    for pid in list(getattr(getattr(executor, "_pool", None), "_processes", None) or {}):
        try:
            with open(f"/proc/{pid}/status") as f:
                peak = max(peak, *(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM")))
        except OSError:
            pass
    return peak


def _lengths(u: int) -> np.ndarray:
    rng = np.random.default_rng([SEED, u])
    return np.maximum(rng.lognormal(6.0, 1.0, DOCS_PER_UNIT), 1).astype(np.int32)


def _make_units(units_dir: Path, n_docs: int) -> int:
    """Lengths files (int32, as a reader would take any integer dtype) and sparse uint16 token files."""
    units_dir.mkdir(parents=True)
    n_units = -(-n_docs // DOCS_PER_UNIT)
    for u in range(n_units):
        x = _lengths(u)[: n_docs - u * DOCS_PER_UNIT]
        np.save(units_dir / f"unit-{u:06d}.lengths.npy", x)
        n_tokens = int(x.sum(dtype=np.int64))
        with open(units_dir / f"unit-{u:06d}.tokens.npy", "wb") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<u2", "fortran_order": False, "shape": (n_tokens,)})
            f.truncate(f.tell() + 2 * n_tokens)
    return n_units


def fill_table(n_docs: int):
    lengths = np.concatenate([_lengths(u) for u in range(-(-min(n_docs, FILL_DOCS) // DOCS_PER_UNIT))])[:FILL_DOCS]
    lengths = lengths[: min(n_docs, FILL_DOCS)]
    piece_doc, _, piece_len = split_documents(lengths, CONTEXT_LENGTH)
    bound = lower_bound(piece_len, CONTEXT_LENGTH)
    print(f"\nfill rate per group size ({len(lengths):,} documents, {len(piece_len):,} pieces, FFD, context {CONTEXT_LENGTH})")
    print(f"{'group':>10} {'sequences':>12} {'lower bound':>12} {'over bound':>10} {'fill':>8}")
    for group in FILL_GROUPS:
        if group is not None and group >= len(lengths):
            continue
        cuts = np.searchsorted(piece_doc, np.arange(0, len(lengths) + (group or len(lengths)), group or len(lengths)))
        n = sum(int(pack(piece_len[a:b], CONTEXT_LENGTH).max()) + 1 for a, b in zip(cuts[:-1], cuts[1:]) if b > a)
        print(f"{group or 'all':>10} {n:>12,} {bound:>12,} {n / bound - 1:>10.4%} {piece_len.sum() / (n * CONTEXT_LENGTH):>8.4%}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--pack-group", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=1, help="1: tasks run in this process (its RSS is a task's peak)")
    ap.add_argument("--shard-size", type=int, default=100_000_000)
    ap.add_argument("--write-shards", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where the unit and plan files go (default: a temporary directory)")
    ap.add_argument("--no-fill", action="store_true", help="skip the fill-rate table")
    ap.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    a = ap.parse_args()
    if a.smoke:
        a.docs, a.pack_group, a.no_fill = 20_000, 5_000, True
    print(f"packer {__version__}, numpy {np.__version__}, python {platform.python_version()}, {os.cpu_count()} cores, "
          f"docs {a.docs:,}, pack_group {a.pack_group:,}, workers {a.workers}, context {CONTEXT_LENGTH}, "
          f"shard_size {a.shard_size:,}")
    root = Path(tempfile.mkdtemp(prefix="packer-scale-", dir=a.dir))
    try:
        t = time.perf_counter()
        n_units = _make_units(root / "work" / "units", a.docs)
        made = time.perf_counter() - t
        base = _rss_mb()
        print(f"{n_units} synthetic units in {made:.1f} s; RSS before planning {base:.0f} MB")
        config = BuildConfig(context_length=CONTEXT_LENGTH, shard_size=a.shard_size, pack_group=a.pack_group, seed=SEED)
        unit_docs = [min(DOCS_PER_UNIT, a.docs - u * DOCS_PER_UNIT) for u in range(n_units)]
        executor = make_executor(a.workers)
        t, cpu = time.perf_counter(), time.process_time()
        try:
            index = plan_streamed(unit_docs, config, root / "work", executor)
            workers_peak = _workers_peak_mb(executor)
        finally:
            executor.close()
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        peak = _rss_mb()
        plan_dir = root / "work" / PLAN_DIR
        sizes = np.array([index.shard_path(plan_dir, k).stat().st_size for k in range(index.n_shards)])
        slots = index.n_sequences * CONTEXT_LENGTH
        print(f"plan: {seconds:.1f} s ({seconds / a.docs * 1e9:.0f} ns/doc; this process's CPU {cpu:.1f} s, "
              f"{cpu / a.docs * 1e9:.0f} ns/doc; load {os.getloadavg()[0]:.1f}), {index.n_shards} shards, "
              f"{index.n_sequences:,} sequences, fill {index.n_tokens / slots:.4%}, lower bound "
              f"{-(-index.n_tokens // CONTEXT_LENGTH):,}")
        task_peak = workers_peak if a.workers > 1 else peak
        print(f"driver peak RSS {peak:.0f} MB ({peak * 2**20 / a.docs:.1f} bytes/doc of the corpus); task peak "
              f"{task_peak:.0f} MB = {(task_peak - base) * 2**20 / min(a.pack_group, a.docs):.0f} bytes/doc of a group over "
              f"the {base:.0f} MB start (GROUP_BYTES_PER_DOC = {GROUP_BYTES_PER_DOC})")
        print(f"plan bytes read per write task: mean {sizes.mean() / 2**20:.2f} MB, max {sizes.max() / 2**20:.2f} MB "
              f"({sizes.mean() / max(index.shard_tokens.mean(), 1):.3f} bytes/token of its shard; the whole plan "
              f"{sizes.sum() / 2**30:.2f} GB)")
        out = root / "out"
        out.mkdir()
        (root / "work" / "shards").mkdir()
        t = time.perf_counter()
        for k in range(min(a.write_shards, index.n_shards)):
            writer.write_shard(index.shard_path(plan_dir, k), k, root / "work", out, "uint16", "memmap")
        if a.write_shards:
            w = time.perf_counter() - t
            n = int(index.shard_tokens[: a.write_shards].sum())
            print(f"write: {min(a.write_shards, index.n_shards)} shards, {n:,} tokens in {w:.1f} s ({n / w / 1e6:.0f}M tok/s)")
        if not a.no_fill:
            fill_table(a.docs)
        print(f"plan: {a.docs:,} docs, driver peak RSS {peak:.0f} MB, {peak * 2**20 / a.docs:.1f} bytes/doc, {seconds:.0f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
