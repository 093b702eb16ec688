"""Is the loader ever the bottleneck? Tokens/s through a DataLoader against a raw np.memmap baseline.

    python benchmarks/bench_loader.py              # builds sample_data x8 at context 4096 into a temp dir
    python benchmarks/bench_loader.py --data DIR   # any built dataset
    python benchmarks/bench_loader.py --quick      # sample_data x4, fewer timings

Baseline (`raw memmap`): the same sequences, in the same shuffled order, sliced from one flat
np.memmap token file, converted to int64 and concatenated into batches of 8 — the least any
loader must do. Cases: PackedDataset through DataLoader(batch_size=8, collate_fn=collate_varlen)
with num_workers 0 and 2; with pad_to; with return_attention_mask (dense [L, L] masks, stacked by
collate_padded); `per-item make_item`, a loader doing per-item Python work; and `prebuilt
batches`, workers that only hand over ready tensors: the floor of any num_workers=2 loader here.
Every case delivers the same stored tokens, which is what tokens/s counts.

The default dataset is the sample corpus copied 8 times over (1479 sequences, 6M tokens, built
by packer's own build into a temp dir: a baseline pass takes ~6 ms, not ~1 ms), and the cases
are timed interleaved: each round times every case once, 25 rounds, the best of each kept, so a
slow spell of the box hits baseline and loaders alike. The slow cases (return_attention_mask,
per-item make_item) time a prefix of the epoch (--slow-batches); tokens/s is what they delivered.
`--only-varlen` times just the baseline and the two num_workers=0 cases (~10 s with --data).

`first full read` opens a fresh reader each time and reads every row once (the first-read checks and
checksums of every block, the page faults of a new mapping). Two raw baselines: `raw memmap` is the issue's (np.memmap slices, numpy-integer indices);
`raw, tight` reads the same map through a plain ndarray view with Python-int indices, ~2x faster
(np.memmap slicing builds a memmap subclass object per slice). Ratios are printed against both.

Measured 2026-11-29 on the 2-core box, quiet (load 0.7), ratio to raw memmap (6.5 ms a pass)
and to the tight read (3.2 ms):
    num_workers=0, PackedDataset(batch_size=8) batches        0.294   0.145
    num_workers=0, batch_size=8, pad_to=4096 (collate_padded) 0.265   0.131
    num_workers=0, items + collate_varlen                      0.212   0.105
    num_workers=0, items, pad_to=4096                          0.203   0.100
    per-item make_item (reference)                             0.023   0.011
    num_workers=2, items / batches                             0.009 / 0.010 (IPC floor 0.006)
    return_attention_mask                                      0.0004
Beside a helper's test runs (load ~1.4) the batch case gave 0.26 and items 0.20.

Block checksums (issue 28), measured 2026-12-03 on the same box under load 11-16 (other helpers' test
suites), so by CPU time (`--clock cpu`, `--only-varlen --rounds 30`), three runs each, alternated, the
sample x8 (Arrow, one shard): before = 7d9bf52 (no checksums), after = block checksums on:
    num_workers=0, batch_size=8 (batches)       before 0.234 / 0.250 / 0.275    after 0.255 / 0.267 / 0.296
    first full read (open + every row once)     before 5.1 / 4.6 / 5.0 ms       after 4.4 / 4.3 / 4.2 ms
The checks cost a block's first read only (one xxh3_64 pass, one bitmap test after), and the batch path
gained from items._write_tokens (one gather, two contiguous casts); the first read got faster as an Arrow
shard's record batches are read from their checksummed ranges (no stream parse) over one mapping. A
dataset of a packer before checksums pays a sha256 of every shard file at open: 14-15 ms (~3x). Where a batch-path pass goes (~21 ms, line profiler
shares): int64 input_ids and labels, gathered and widened by np.concatenate, 28%; position ids
(one cumsum) 21%; batch views and cu_seqlens 21%; block layout 13%; epoch permutation 5%. The
item path adds 4 tensor views, a dict and a generator step per item (~5 us) and DataLoader's
per-batch fetch and collate (~30 us a batch). Three int64 fields are 24 bytes written per token
where the raw read writes 8, which bounds any loader of this item format near 1/3 of it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer import __version__  # noqa: E402
from packer.config import BuildConfig, Job  # noqa: E402
from packer.data import Balance, ItemFields, PackedDataset, collate_padded, collate_varlen, make_item  # noqa: E402
from packer.preprocess.pipeline import build  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.train.data import permute  # noqa: E402

CONTEXT = 4096
BATCH = 8
SEED = 0
SAMPLE = ROOT / "sample_data"


def build_sample(out: Path, copies: int) -> Path:
    """Build `copies` copies of the sample corpus (one input file per copy) with packer's own build."""
    inputs = out.parent / "inputs"
    inputs.mkdir()
    for name in ("prose.jsonl", "code.jsonl"):
        for k in range(copies):
            shutil.copyfile(SAMPLE / name, inputs / f"{k:02d}-{name}")
    job = Job(inputs=(str(inputs),), tokenizer=str(SAMPLE / "tokenizer.json"),
              output=str(out), workers=2, config=BuildConfig(context_length=CONTEXT))
    build(job)
    return out


def flat_memmap(path: Path, scratch: Path):
    """The dataset's rows as one flat token file (np.memmap) plus row starts: the baseline's input."""
    ds = open_dataset(path)
    rows = [ds[i][0] for i in range(len(ds))]
    starts = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    file = scratch / "tokens.bin"
    np.concatenate(rows).tofile(file)
    return np.memmap(file, dtype=rows[0].dtype, mode="r"), starts


def raw_pass(tokens, starts, order) -> int:
    n = 0
    for b in range(0, len(order), BATCH):
        batch = np.concatenate([tokens[starts[i]:starts[i + 1]] for i in order[b:b + BATCH]]).astype(np.int64)
        n += len(batch)
    return n


def loader_pass(loader, max_batches=None) -> int:
    """Batches of one pass over `loader` (its first `max_batches` when given)."""
    n = 0
    for batch in loader:
        n += 1
        if n == max_batches:
            break
    return n


class PerItem(IterableDataset):
    """The loader without block building: read one row, build one item, yield it."""

    def __init__(self, path, order):
        self.path, self.order = path, order

    def __iter__(self):
        ds = open_dataset(self.path)
        for i in self.order.tolist():
            yield make_item(*ds[i])


class Prebuilt(IterableDataset):
    """Yields nothing but row numbers; its collate returns ready tensors of a batch's size: what
    moving batches from worker processes costs, whatever builds them."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def prebuilt_collate(rows, _tokens=torch.zeros(BATCH * CONTEXT, dtype=torch.int64)):
    return {"input_ids": _tokens.clone()[None], "labels": _tokens.clone()[None],
            "position_ids": _tokens.clone()[None], "cu_seqlens": torch.zeros(9 * len(rows), dtype=torch.int32)}


def interleaved(cases, rounds: int, passes: int, clock=time.perf_counter) -> dict:
    """Best seconds per pass of each case: `rounds` rounds, each timing every case in turn
    (`passes` passes, fewer for slow cases), so load on the shared box hits all cases alike.
    `clock`: wall time, or this process's CPU time (--clock cpu: what a busy box steals from wall
    time is not counted; torch's own threads are, so a loader's share reads lower, never higher)."""
    best = {name: float("inf") for name, _, _ in cases}
    for name, run, _ in cases:
        run()  # warm up: page cache, worker start, first allocations
    for _ in range(rounds):
        for name, run, slow in cases:
            n = 1 if slow else passes
            t0 = clock()
            for _ in range(n):
                run()
            best[name] = min(best[name], (clock() - t0) / n)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="a built dataset (default: build sample_data --copies times at context 4096)")
    parser.add_argument("--copies", type=int, default=8, help="copies of the sample corpus to build (default 8)")
    parser.add_argument("--passes", type=int, default=1, help="passes over the dataset per timing")
    parser.add_argument("--rounds", type=int, default=25, help="interleaved timings per case; the best is kept")
    parser.add_argument("--slow-batches", type=int, default=8, help="batches the slow cases time (a prefix)")
    parser.add_argument("--only-varlen", action="store_true", help="time only the baseline and num_workers=0 cases")
    parser.add_argument("--quick", action="store_true", help="4 copies, 2 passes, 3 rounds (noisier)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time passes by wall clock (default) or by this process's CPU time (a busy shared box)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    copies, passes, rounds = (1, 1, 1) if args.smoke else (4, 2, 3) if args.quick else (args.copies, args.passes, args.rounds)
    args.slow_batches = 2 if args.smoke else args.slow_batches

    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, {platform.platform()}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, packer {__version__}")
    scratch = Path(tempfile.mkdtemp(prefix="bench_loader-"))
    try:
        path = Path(args.data) if args.data else build_sample(scratch / "ds", copies)
        manifest = open_dataset(path).manifest
        n_seq, n_tok = manifest["totals"]["sequences"], manifest["totals"]["tokens_out"]
        context = manifest["config"]["context_length"]
        print(f"dataset: {path} ({n_seq} sequences, {n_tok} tokens, context {context}); batch {BATCH}, "
              f"seed {SEED}; {passes} passes per timing, best of {rounds} interleaved rounds, {args.clock} clock\n")
        tokens, starts = flat_memmap(path, scratch)
        order = permute(np.arange(n_seq), n_seq, SEED, 0)  # PackedDataset's epoch-0 order
        lengths = np.diff(starts)[order]

        def dataset(**kw):
            return PackedDataset(path, seed=SEED, **kw)

        def dl(ds, workers=0, collate=collate_varlen):
            return DataLoader(ds, batch_size=BATCH, collate_fn=collate, num_workers=workers,
                              persistent_workers=workers > 0)

        def case(name, loader, slow=False):
            """(name, one pass, slow, stored tokens a pass delivers)."""
            limit = args.slow_batches if slow else None
            items = n_seq if limit is None else min(n_seq, limit * BATCH)
            return name, lambda: loader_pass(loader, limit), slow, int(lengths[:items].sum())

        def batched(workers=0, **kw):  # the dataset yields batches: DataLoader(batch_size=None)
            return DataLoader(dataset(batch_size=BATCH, **kw), batch_size=None, num_workers=workers,
                              persistent_workers=workers > 0)

        def first_read():  # a fresh reader: open, then every row once (the first-read checks of every block)
            fresh = open_dataset(path)
            return np.concatenate(fresh.views(order)[0])

        plain, starts_list, order_list = tokens.view(np.ndarray), starts.tolist(), order.tolist()
        cases = [("raw memmap (baseline)", lambda: raw_pass(tokens, starts, order), False, n_tok),
                 ("raw, tight (ndarray view, int indices)", lambda: raw_pass(plain, starts_list, order_list), False, n_tok),
                 ("first full read (open + every row once)", first_read, False, n_tok),
                 case("num_workers=0, collate_varlen", dl(dataset())),
                 case(f"num_workers=0, pad_to={context}", dl(dataset(fields=ItemFields(pad_to=context)))),
                 case("num_workers=0, batch_size=8 (batches)", batched()),
                 case("num_workers=0, batch_size=8, balanced", batched(balance=Balance(rows_per_rank=BATCH))),
                 case(f"num_workers=0, batch_size=8, pad_to={context}",
                      batched(fields=ItemFields(pad_to=context), collate_fn=collate_padded))]
        if not args.only_varlen:
            cases += [
                case("num_workers=2, collate_varlen", dl(dataset(), 2)),
                case("num_workers=2, batch_size=8 (batches)", batched(2)),
                case("num_workers=0, return_attention_mask",
                     dl(dataset(fields=ItemFields(pad_to=context, attention_mask=True)), collate=collate_padded), slow=True),
                case("per-item make_item (reference)", dl(PerItem(path, order)), slow=True),
                case("num_workers=2, prebuilt batches (IPC floor)", dl(Prebuilt(n_seq), 2, prebuilt_collate)),
            ]
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        best = interleaved([(name, run, slow) for name, run, slow, _ in cases], rounds, passes, clock)
        print(f"{'case':46s} {'s/pass':>9s} {'Mtok/s':>9s} {'ratio':>7s} {'vs tight':>9s}")
        base, tight = (n_tok / best[cases[k][0]] for k in (0, 1))
        for name, _, _, delivered in cases:
            rate = delivered / best[name]
            print(f"{name:46s} {best[name]:9.4f} {rate / 1e6:9.1f} {rate / base:7.4f} {rate / tight:9.4f}", flush=True)
        plain_batches, balanced = (best[f"num_workers=0, batch_size=8{k}"] for k in (" (batches)", ", balanced"))
        print(f"balanced batches / plain batches (speed): {plain_batches / balanced:.3f} (issue 37: >= 0.9)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
