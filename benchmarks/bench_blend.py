"""Does blending cost loading speed? Blended tokens/s as a ratio of single-dataset loading, timed in one run.

    python benchmarks/bench_blend.py            # builds sample_data x8 at context 4096 twice (seeds 0, 1)
    python benchmarks/bench_blend.py --data DIR --data2 DIR2

Cases, all PackedDataset(batch_size=8) through DataLoader(batch_size=None, num_workers=0), one epoch:
`single` (baseline: dataset A alone), `blend A+B` (two datasets by path, weights 0.7 / 0.3, the same
number of sequences as A), `blend A+B tokens` (mix_by="tokens"), `sources of A` (A's rows named as two
sources, weights 0.5 / 0.5: the same rows as `single`, reached through the blend), `blend + source_ids`.
Rounds interleave the cases (rotating their order); each case reports medians over the rounds, its ratio
the median of its per-round ratios to `single` (so a slow spell of the box hits both alike). Also timed:
the blend's pattern (Megatron's greedy over one period, once per weights) and the position -> row map.

Measured 2026-12-01 (2-core box, beside other helpers' tests), context 4096, batch 8, 1479 rows a pass,
median ratio to `single` over 31 rounds, three runs each, before / after the blend speed-ups (a blend's
rows put back by place instead of an argsort, the full-shuffle map of all sources and passes in one
vectorized pass, source ids filled over zipped row bounds):
                          before            after
    single                1.00              1.00    (200-330 M tokens/s)
    blend A+B             0.94 0.94 0.94    0.98 0.97 0.99
    blend A+B tokens      0.95 0.95 0.95    0.99 0.99 1.01
    sources of A          1.01 0.98 0.99    1.02 0.97 0.99
    blend + source_ids    0.74 0.76 0.73    0.76 0.73 0.74  (a fourth int64 field per token: writing its
                                                            8 bytes a token is the cost, ~110 us a block
                                                            of 64 rows against ~85 us for a bare fill)
    pattern (once)        0.15-0.3 s for 2-3 sources, 0.3-0.6 s for 8; position -> row 0.11-0.17 us
(An earlier best-of-15 version of this benchmark gave 0.86-0.87 for blend A+B and 0.65-0.73 with source
ids on a busier box.)
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
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer import __version__  # noqa: E402
from packer.config import BuildConfig, Job  # noqa: E402
from packer.data import ItemFields, PackedDataset  # noqa: E402
from packer.preprocess.pipeline import build  # noqa: E402
from packer.train import blend as blend_module  # noqa: E402

CONTEXT = 4096
BATCH = 8
ROUNDS = 31
SAMPLE = ROOT / "sample_data"


def build_copies(out: Path, copies: int, seed: int) -> Path:
    inputs = out.parent / f"inputs-{seed}"
    inputs.mkdir(parents=True)
    for name in ("prose.jsonl", "code.jsonl"):
        for k in range(copies):
            shutil.copyfile(SAMPLE / name, inputs / f"{k:02d}-{name}")
    job = Job(inputs=(str(inputs),), tokenizer=str(SAMPLE / "tokenizer.json"), output=str(out), workers=2,
              config=BuildConfig(context_length=CONTEXT, seed=seed))
    build(job)
    return out


def with_sources(path: Path, out: Path) -> Path:
    """A copy of `path` whose manifest names its rows as two sources (what a build with sources records)."""
    shutil.copytree(path, out)
    manifest = json.loads((out / "manifest.json").read_text())
    n = manifest["totals"]["sequences"]
    manifest["sources"] = [{"name": "first", "sequences": [0, n // 3]}, {"name": "rest", "sequences": [n // 3, n]}]
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def epoch_tokens(ds) -> int:
    n = 0
    for batch in DataLoader(ds, batch_size=None, num_workers=0):
        n += batch["input_ids"].numel()
    return n


def report(n: int, tokens: dict, seconds: dict):
    """Per case: median seconds and tokens/s over the rounds, and the median (quartiles) over rounds of its
    ratio to `single` timed in the same round."""
    print(f"{n} sequences a pass; medians over {len(seconds['single'])} rounds")
    print(f"{'case':22} {'tokens':>10} {'seconds':>8} {'tokens/s':>12} {'ratio':>6}  {'(quartiles)':>11}")
    base = tokens["single"] / np.array(seconds["single"])
    for k in tokens:
        rate = tokens[k] / np.array(seconds[k])
        q1, q2, q3 = np.percentile(rate / base, [25, 50, 75])
        print(f"{k:22} {tokens[k]:10d} {np.median(seconds[k]):8.4f} {np.median(rate):12.0f} {q2:6.2f}  "
              f"({q1:.2f}-{q3:.2f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--data2", type=Path)
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.copies, args.rounds = 1, 1
    positions = 65_536 if args.smoke else 1_000_000
    torch.set_num_threads(1)
    print(f"packer {__version__}, torch {torch.__version__}, numpy {np.__version__}, python "
          f"{platform.python_version()}, {os.cpu_count()} cpus; context {CONTEXT}, batch {BATCH}, rounds {args.rounds}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        a = args.data or build_copies(tmp / "a" / "ds", args.copies, 0)
        b = args.data2 or build_copies(tmp / "b" / "ds", args.copies, 1)
        named = with_sources(a, tmp / "named")
        n = PackedDataset(a).n_sequences
        cases = {
            "single": lambda: PackedDataset(a, batch_size=BATCH),
            "blend A+B": lambda: PackedDataset({"a": a, "b": b}, weights={"a": 0.7, "b": 0.3}, num_samples=n,
                                               batch_size=BATCH),
            "blend A+B tokens": lambda: PackedDataset({"a": a, "b": b}, weights={"a": 0.7, "b": 0.3},
                                                      num_samples=n, mix_by="tokens", batch_size=BATCH),
            "sources of A": lambda: PackedDataset(named, weights={"first": 0.5, "rest": 0.5}, batch_size=BATCH),
            "blend + source_ids": lambda: PackedDataset({"a": a, "b": b}, weights={"a": 0.7, "b": 0.3}, num_samples=n,
                                                        batch_size=BATCH, fields=ItemFields(source_ids=True)),
        }
        seconds, tokens = {k: [] for k in cases}, {}
        datasets = {k: make() for k, make in cases.items()}
        for k, ds in datasets.items():
            epoch_tokens(ds)  # warm the page cache and the reader
        for r in range(args.rounds):
            for k in list(datasets)[r % len(datasets):] + list(datasets)[:r % len(datasets)]:  # rotate the order
                ds = datasets[k]
                t = time.perf_counter()
                tokens[k] = epoch_tokens(ds)
                seconds[k].append(time.perf_counter() - t)
        report(n, tokens, seconds)
    blend_module.greedy_pattern.cache_clear()
    for weights in ([0.7, 0.3], [0.5, 0.3, 0.2], list(np.full(8, 1 / 8))):
        t = time.perf_counter()
        blend_module.greedy_pattern(tuple(blend_module.apportion(np.array(weights), blend_module.PERIOD).tolist()))
        pattern_s = time.perf_counter() - t
        sources = [blend_module.Source(str(s), 0, s * 1000, (s + 1) * 1000) for s in range(len(weights))]
        blend = blend_module.Blend(sources, weights, 10_000_000)
        t = time.perf_counter()
        for g in range(0, positions, 8192):
            blend.rows(np.arange(g, g + 8192), "full", 0, 0, 64, 16)
        map_us = (time.perf_counter() - t) / positions * 1e6
        print(f"{len(weights)} sources: pattern of {blend_module.PERIOD} positions {pattern_s:.2f} s (once); "
              f"position -> row {map_us:.2f} us a position")


if __name__ == "__main__":
    main()
