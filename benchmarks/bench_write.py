"""Write stage (unit files -> finished shards) against ndarray.tofile of the same bytes, and
random-access reads through open_dataset against raw np.memmap slices of the same data.

    python benchmarks/bench_write.py            # 30M tokens, ~1 minute
    python benchmarks/bench_write.py --tokens 200_000_000 --shard-size 100_000_000

Write: the per-shard call the pipeline makes (`writer.write_shard`: load plan, gather the
pieces from the memory-mapped unit files, build the rows, write under a temporary name
while hashing, rename) for every format, one process, best of --repeat. Baseline: the
finished token array of each shard written with `ndarray.tofile` (no gather, no index, no
hash); `HashedFile` alone, with its write and hash threads and without, writes the same
tokens. Read: random rows of a dataset, each row copied to a fresh array so both sides touch
the pages.

2026-11-29, shared 2-core box at load 4-10 (provisional), 30M tokens, CPU-seconds ratios:
tofile 1.00 | gather 0.24 | write_shard memmap 0.12, arrow 0.11 | sha256 off: 0.19, 0.15.
Reads: ds[i] 1.05x a raw np.memmap slice (memmap), 1.09x (arrow); get_many(64) 0.85x, 0.70x.
The 50% write target is out of reach on CPU time by arithmetic: sha256 (~1.4 GB/s here)
alone costs 2.8x the tofile of the same bytes (~4 GB/s into the page cache), and the gather,
a Python loop over pieces (~1 us each), another 4x. In wall time the write and hash threads
can hide behind the gather only with idle cores, which this box never had.
2026-12-01, load 6, after the format seam (packer/store/formats/), write_shard CPU seconds, best
of two runs each: arrow 0.100 (0.097 before), memmap 0.102 (0.102 before), megatron 0.106.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packer, not an installed one

from packer import __version__
from packer.io import atomic
from packer.io import hashed as hashed_module
from packer.io.hashed import HashedFile
from packer.preprocess import writer
from packer.preprocess.plan import plan_bins
from packer.store.dataset import open_dataset
from packer.store.formats import FORMATS, memmap
from packer.store.rows import Rows, little_endian, row_chunks

SEED = 0
CONTEXT_LENGTH = 2048
N_UNITS = 8


def _make_work(root: Path, n_tokens: int, shard_size: int, rng):
    """Unit files of lognormal-length documents (median ~300 tokens), and their plan."""
    units = root / "_work" / "units"
    units.mkdir(parents=True)
    lengths = np.maximum(rng.lognormal(5.7, 1.0, size=int(n_tokens / 450) + 1).astype(np.int64), 1)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), n_tokens)) + 1]
    unit_lengths = np.array_split(lengths, N_UNITS)
    for u, ls in enumerate(unit_lengths):
        np.save(units / f"unit-{u:06d}.tokens.npy", rng.integers(0, 50_000, int(ls.sum()), dtype=np.uint16))
    plan = plan_bins(unit_lengths, context_length=CONTEXT_LENGTH, seed=SEED, shard_size=shard_size)
    atomic.save_npz(root / "_work" / "plan.npz", **{k: getattr(plan, k) for k in plan.__dataclass_fields__})
    return plan


class _NoHash:
    def update(self, data):
        pass

    def hexdigest(self) -> str:
        return "0" * 64


def _best(fn, repeat: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads), each the best of `repeat`.
    On a shared machine the CPU figure is the steadier one."""
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus)


def _header(title: str, baseline: str):
    print(f"\n{title:<40}{'wall s':>8}{'Mtok/s':>8}{'vs ' + baseline:>12}{'cpu s':>8}{'cpu vs':>8}")


def _line(name: str, t: tuple[float, float], base: tuple[float, float], n_tokens: int):
    (wall, cpu), (bw, bc) = t, base
    print(f"{name:<40}{wall:>8.3f}{n_tokens / wall / 1e6:>8.0f}{bw / wall:>12.2f}{cpu:>8.3f}{bc / max(cpu, 1e-9):>8.2f}")


def _fresh(d: Path):
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)


def shard_rows(plan, shard: int, units_dir: Path, dtype) -> tuple[Rows, np.ndarray]:
    """The rows of one shard, tokens gathered as the writer gathers them, and each segment's doc_id."""
    layout, p0 = writer.shard_layout(plan, shard)
    tokens = writer._gather_tokens(plan, p0, p0 + len(layout.doc_ids), units_dir, dtype, {})
    return Rows(tokens, layout.token_starts, layout.offsets, layout.offset_starts), layout.doc_ids


def bench_write(root: Path, plan, repeat: int):
    work, out = root / "_work", root / "out"
    shards = [shard_rows(plan, k, work / "units", np.dtype(np.uint16))[0] for k in range(plan.n_shards)]
    n_tokens = sum(len(r.tokens) for r in shards)

    def tofile():
        _fresh(out)
        for k, r in enumerate(shards):
            r.tokens.tofile(out / f"raw-{k:05d}.bin")

    def gather_only():
        for k in range(plan.n_shards):
            shard_rows(plan, k, work / "units", np.dtype(np.uint16))

    def hashed(threads: bool):
        def run():  # the finished tokens through HashedFile in the writer's chunks: what its threads buy
            _fresh(out)
            for k, r in enumerate(shards):
                f = HashedFile(out / f"raw-{k:05d}.bin", threads=threads)
                for r0, r1 in row_chunks(len(r)):
                    f.write(little_endian(r.tokens[r.token_starts[r0] : r.token_starts[r1]]))
                f.close()
                atomic.publish(f.tmp, out / f"raw-{k:05d}.bin")

        return run

    def write(fmt):
        def run():
            _fresh(out)
            shutil.rmtree(work / "shards", ignore_errors=True)  # no "already done" shortcut
            for k in range(plan.n_shards):
                writer.write_shard(work / "plan.npz", k, work, out, "uint16", fmt)

        return run

    base = _best(tofile, repeat)
    _header("write stage", "tofile")
    _line("ndarray.tofile (baseline)", base, base, n_tokens)
    _line("gather only (no write)", _best(gather_only, repeat), base, n_tokens)
    _line("HashedFile, write+hash threads", _best(hashed(True), repeat), base, n_tokens)
    _line("HashedFile, one thread", _best(hashed(False), repeat), base, n_tokens)
    for fmt in FORMATS:
        _line(f"write_shard {fmt}", _best(write(fmt), repeat), base, n_tokens)
    real_hashlib = hashed_module.hashlib
    hashed_module.hashlib = types.SimpleNamespace(sha256=_NoHash)  # what the checksums cost
    try:
        for fmt in FORMATS:
            _line(f"write_shard {fmt}, sha256 off", _best(write(fmt), repeat), base, n_tokens)
    finally:
        hashed_module.hashlib = real_hashlib
    return out


def _totals(entries) -> dict:
    """The manifest totals a reader checks against the shards (packer/store/checks.py)."""
    pieces, tokens = sum(e["documents"] for e in entries), sum(e["tokens"] for e in entries)
    return {"sequences": sum(e["sequences"] for e in entries), "tokens_in": tokens, "tokens_out": tokens,
            "pieces": pieces, "docs_read": pieces, "docs_accepted": pieces, "docs_dropped_long": 0, "docs_skipped": {}}


def bench_read(root: Path, plan, n_reads: int, repeat: int):
    out = root / "ds"
    _fresh(out)
    entries = [writer.write_shard(root / "_work" / "plan.npz", k, root / "_work", out, "uint16", "memmap")
               for k in range(plan.n_shards)]
    manifest = {"format_version": 2, "config": {"format": "memmap", "context_length": CONTEXT_LENGTH, "token_dtype": "uint16"},
                "tokenizer": {"vocab_size": 50_000}, "shards": entries, "totals": _totals(entries)}
    (out / "manifest.json").write_text(json.dumps(manifest))
    ds = open_dataset(out)
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, len(ds), n_reads)
    # The raw baseline: one flat memmap per shard and precomputed row bounds, nothing else.
    raw, bounds = [], []
    for k, e in enumerate(entries):
        tokens, starts, *_ = memmap.open_shard(out / e["file"], out / e["index_file"])
        raw.append(np.memmap(out / e["file"], dtype=np.uint16, mode="r"))
        bounds += [(k, int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]
    where = [bounds[i] for i in picks]
    n_tokens = sum(b - a for _, a, b in where)

    def raw_slices():
        for k, a, b in where:
            np.array(raw[k][a:b])

    plain = [r.view(np.ndarray) for r in raw]

    def plain_slices():
        for k, a, b in where:
            np.array(plain[k][a:b])

    def getitem():
        for i in picks.tolist():
            tokens, offsets = ds[i]
            np.array(tokens), np.array(offsets)

    def get_many():
        for j in range(0, len(picks), 64):
            ds.get_many(picks[j : j + 64])

    _header(f"random reads, {n_reads} rows", "raw")
    base = _best(raw_slices, repeat)
    _line("np.memmap slice (baseline)", base, base, n_tokens)
    _line("np.memmap viewed as ndarray, slice", _best(plain_slices, repeat), base, n_tokens)
    for name, fn in (("open_dataset ds[i], memmap", getitem), ("ds.get_many(64 rows), memmap", get_many)):
        _line(name, _best(fn, repeat), base, n_tokens)
    for fmt in (f for f in FORMATS if f != "memmap"):
        other = root / f"ds_{fmt}"
        _fresh(other)
        shutil.rmtree(root / "_work" / "shards", ignore_errors=True)
        manifest["config"]["format"] = fmt
        manifest["shards"] = [writer.write_shard(root / "_work" / "plan.npz", k, root / "_work", other,
                                                 "uint16", fmt) for k in range(plan.n_shards)]
        manifest["totals"] = _totals(manifest["shards"])
        (other / "manifest.json").write_text(json.dumps(manifest))
        ds = open_dataset(other)
        _line(f"open_dataset ds[i], {fmt}", _best(getitem, repeat), base, n_tokens)
        _line(f"ds.get_many(64 rows), {fmt}", _best(get_many, repeat), base, n_tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=30_000_000)
    ap.add_argument("--shard-size", type=int, default=10_000_000)
    ap.add_argument("--reads", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="Scratch directory (default: a temporary one; use a real disk).")
    ap.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.tokens, args.shard_size, args.reads, args.repeat = 200_000, 100_000, 200, 1
    print(f"packer {__version__} | python {platform.python_version()} | numpy {np.__version__} | "
          f"pyarrow {pa.__version__} | {platform.machine()} {os.cpu_count()} cpus | load {os.getloadavg()[0]:.1f}")
    print(f"tokens {args.tokens:,} | shard size {args.shard_size:,} | context {CONTEXT_LENGTH} | seed {SEED}")
    root = Path(tempfile.mkdtemp(prefix="bench_write_", dir=args.dir))
    try:
        plan = _make_work(root, args.tokens, args.shard_size, np.random.default_rng(SEED))
        print(f"pieces {len(plan.piece_len):,} | sequences {plan.n_sequences:,} | shards {plan.n_shards}")
        bench_write(root, plan, args.repeat)
        bench_read(root, plan, args.reads, args.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
