"""Training straight from an object store: PackedDataset's tokens/s streaming from a simulated-latency store, against local memory maps.

    python benchmarks/bench_stream.py                    # memmap and arrow, 10 ms a request
    python benchmarks/bench_stream.py --formats memmap --latency-ms 30 --batches 200

The dataset: the sample corpus x2 built at context 4096 (shards of 1M tokens), its shards then
copied --copies times under new names (one manifest over all), so the data is several times the
reader's memory (--memory-mb) and streaming really evicts and reads again. "Remote" is that
directory behind benchmarks/bench_fs.py's `slowlocal://` fsspec filesystem, whose every read call
first sleeps --latency-ms (a request's round trip), reached through pyarrow's PyFileSystem.

Cases, each in three orders (stored order; shuffle="block": blocks of 64 stored rows in a seeded
order, rows shuffled within windows of BLOCK_WINDOW = 4 blocks, which fit the small memory; the full shuffle), each order's shuffle quality
printed first (packer/train/order.py `spread`), PackedDataset(batch_size=8)
iterated in this process (DataLoader(batch_size=None, num_workers=0) does the same), the first
--batches batches timed, from a fresh open (indexes read inside the timing):

    local memory maps         the baseline (ratio 1)
    no read-ahead             read_ahead=0: each block read on demand, in the loader's thread
    read-ahead (epoch order)  PackedDataset tells the stream each next chunk of its epoch's rows
                              and read calls (ds.prefetch, packer/train/data.py): blocks fetched in
                              the order the epoch reads them, by 16 threads, as far as memory
                              allows without letting go a block reading on demand would keep
    + warm cache              the same with a local cache directory a previous epoch filled

`store MB` is what the case read from the store, `x data` that over the bytes of the rows it
delivered (read amplification: a full shuffle over data larger than memory reads each block again
for nearly every row it takes). Read-ahead's bytes past no read-ahead's are blocks it fetched for
rows after the last timed batch (at most memory_bytes); over whole epochs it reads no more
(tests/store/test_stream_readahead.py).

2026-12-01, 2 shared CPUs (noisy), 50 MB of shards, memory a third of it; Mtok/s after the first
batch (first 500 batches; full shuffle from the store: 100), and x data; local memory maps
285-405 Mtok/s in the same run:
                                     no read-ahead        read-ahead (epoch order)   + warm cache
    stored order      memmap          40 Mtok/s  1.07x     188 Mtok/s  1.38x           203
                      arrow           56         1.06x     201         1.35x           214
    block order       memmap          25         1.76x      61         1.81x           104
                      arrow           27         2.62x      61         2.62x           150
    full shuffle      memmap         1.2        43.8x      2.2        43.8x             24
                      arrow          1.4        59.4x      2.0        59.6x             21
    memory twice the data            memmap 198 / 226 Mtok/s (stored / full shuffle), arrow 220 / 253
Before the read plan (82cc364, same hour), read-ahead evicted blocks the epoch's window still
needed: block order 32 / 14 Mtok/s at 5.07x / 12.08x the data (memmap / arrow) against 17 / 14
at 2.56x / 4.27x without read-ahead; full shuffle 5.6 / 4.9 Mtok/s at 74x / 89x. A full shuffle
whose read call needs more blocks than memory holds (a 64-row call touches ~28 of the 48 blocks;
16 fit) now waits rather than evict one the call still needs: slower than that, at 40% fewer bytes.
With --memory-mb 32 (memmap; a call's blocks fit): full shuffle 10.6 Mtok/s at 17.5x the data
with read-ahead, 3.7 at 17.5x without, against 9.5 at 71.8x and 0.7 at 67.9x before; block order
86 at 1.44x against 58 at 2.74x; stored order 172 against 210 (the plan's bookkeeping runs in the
loader's thread: at 16 MiB, stored order took 18% longer than before at 0 ms a request, 10% less
at 30 ms).
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
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fsspec  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402
from bench_fs import SlowLocal  # noqa: E402

from packer.config import BuildConfig, Job  # noqa: E402
from packer.preprocess.pipeline import build  # noqa: E402
from packer.store import stream  # noqa: E402
from packer.train.data import PackedDataset  # noqa: E402
from packer.train.order import BlockShuffle, spread  # noqa: E402

CONTEXT, BATCH, SEED = 4096, 8, 0
SAMPLE = ROOT / "sample_data"


def build_dataset(out: Path, fmt: str, copies: int) -> Path:
    """The sample corpus x2 at context 4096, its shards copied `copies` times (one manifest)."""
    inputs = out.parent / f"inputs-{fmt}"
    inputs.mkdir()
    for name in ("prose.jsonl", "code.jsonl"):
        for k in range(2):
            shutil.copyfile(SAMPLE / name, inputs / f"{k}-{name}")
    base = out.parent / f"base-{fmt}"
    build(Job(inputs=(str(inputs),), tokenizer=str(SAMPLE / "tokenizer.json"), output=str(base), workers=2,
              config=BuildConfig(context_length=CONTEXT, shard_size=1_000_000, format=fmt)))
    manifest = json.loads((base / "manifest.json").read_text())
    out.mkdir()
    shutil.copy(base / "tokenizer.json", out / "tokenizer.json")
    shards = []
    for c in range(copies):
        for entry in manifest["shards"]:
            new = dict(entry)
            for key in ("file", "index_file", "doc_ids_file", "checksums_file"):  # every file an entry names
                if key in entry:
                    new[key] = f"c{c:02d}-{entry[key]}"
                    os.link(base / entry[key], out / new[key])
            shards.append(new)
    manifest["shards"] = shards
    for key in ("sequences", "tokens_in", "tokens_out", "pieces", "docs_read", "docs_accepted"):  # as a corpus x copies
        manifest["totals"][key] *= copies
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def timed(make, batches: int) -> tuple[float, float, int, dict]:
    """(seconds to the first batch, seconds of the rest, stored tokens in the rest, the stream's
    stats) of the first `batches` batches of a fresh loader: the first batch pays for the open
    (manifest, indexes) and the first blocks' latency; the rest is the steady rate."""
    ds = make()
    t0, n_tokens = time.perf_counter(), 0
    for k, batch in enumerate(ds):
        if k == 0:
            t1 = time.perf_counter()
        else:
            n_tokens += int(batch["input_ids"].numel())
        if k + 1 == batches:
            break
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, n_tokens, dict(getattr(ds._open()[0], "stats", {}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="memmap,arrow")
    parser.add_argument("--copies", type=int, default=16, help="copies of the built shards (data size)")
    parser.add_argument("--latency-ms", type=float, default=10.0)
    parser.add_argument("--memory-mb", type=float, default=16.0, help="the stream's memory_bytes")
    parser.add_argument("--batches", type=int, default=500, help="batches timed per case (from the epoch's start)")
    parser.add_argument("--shuffled-batches", type=int, default=100,
                        help="batches timed per shuffled case with memory below the data (slow: each row reads a block)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timings per case; the best is kept")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (tests/test_benchmarks.py): memmap, "
                        "2 copies, 3 batches, 1 round, 1 ms a request")
    args = parser.parse_args()
    if args.smoke:
        args.formats, args.copies, args.batches, args.shuffled_batches, args.rounds = "memmap", 2, 3, 2, 1
        args.latency_ms = 1.0
    torch.set_num_threads(1)
    print(f"python {platform.python_version()}, numpy {np.__version__}, pyarrow {pa.__version__}, torch "
          f"{torch.__version__}, fsspec {fsspec.__version__}, {os.cpu_count()} CPUs, {platform.machine()}")
    fsspec.register_implementation("slowlocal", SlowLocal, clobber=True)
    SlowLocal.latency = args.latency_ms / 1000
    memory = int(args.memory_mb * 2**20)
    print(f"context {CONTEXT}, batch {BATCH}, seed {SEED}, {args.latency_ms:g} ms a request, memory_bytes "
          f"{args.memory_mb:g} MiB, block_bytes {stream.BLOCK_BYTES >> 10} KiB, read_ahead {stream.READ_AHEAD}, "
          f"first {args.batches} batches a case, best of {args.rounds} interleaved rounds")
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        tmp = Path(tmp)
        print(f"\n{'format':<7} {'order':<8} {'case':<26} {'first s':>7} {'rest s':>8} {'Mtok/s':>7} {'vs local':>9} "
              f"{'store MB':>9} {'x data':>7}")
        for fmt in args.formats.split(","):
            local = build_dataset(tmp / f"ds-{fmt}", fmt, args.copies)
            remote = f"slowlocal://{local}"
            data_mb = sum(p.stat().st_size for p in local.glob("c*")) / 1e6
            print(f"{fmt}: {data_mb:.0f} MB of shards, {json.loads((local / 'manifest.json').read_text())['totals']['sequences']} "
                  f"sequences; memory_bytes is {memory / 1e6 / data_mb:.2f} of the data")
            for shuffle in (False, "block", True):
                order = {False: "stored", "block": "block", True: "shuffled"}[shuffle]
                quality = _spread(local, shuffle)
                print(f"{fmt}: order {order}: spread {quality:.3f} (1 = a full shuffle's, 0 = storage order; "
                      "packer/train/order.py spread)")
                cache = tmp / f"cache-{fmt}-{order}"
                cases = [
                    ("local memory maps", local, PackedDataset, {}),
                    ("no read-ahead", remote, PackedDataset, {"read_ahead": 0}),
                    ("read-ahead (epoch order)", remote, PackedDataset, {}),
                    ("  + warm cache", remote, PackedDataset, {"cache_dir": str(cache)}),
                    ("  memory 2x the data", remote, PackedDataset, {"memory_bytes": 2 * int(data_mb * 1e6)}),
                ]
                best = {}
                for _ in range(args.rounds):  # interleaved: a slow spell of the box hits every case alike
                    for name, path, kind, opts in cases:
                        batches = args.shuffled_batches if shuffle is True and path == remote and "memory_bytes" not in opts \
                            else args.batches
                        result = run_case(path, kind, opts, shuffle, memory, batches)
                        if name not in best or result[1] < best[name][1]:
                            best[name] = result
                base = None
                for name, *_ in cases:
                    first, seconds, n_tokens, stats = best[name]
                    rate = n_tokens / seconds
                    base = base or rate
                    read_mb = stats.get("store bytes", 0) / 1e6
                    print(f"{fmt:<7} {order:<8} {name:<26} {first:>7.3f} {seconds:>8.3f} {rate / 1e6:>7.1f} "
                          f"{rate / base:>8.2f}x {read_mb:>9.1f} {read_mb / (n_tokens * 2 / 1e6):>7.2f}")


BLOCK_WINDOW = 4  # blocks of 64 rows per shuffle window: 256 rows of 4096 tokens = 2 MiB, well within --memory-mb 16
# (the default window of 16 blocks, 8 MiB, is for the default 256 MiB of stream memory)


def _order_options(shuffle) -> dict:
    return {"shuffle": BlockShuffle(window=BLOCK_WINDOW)} if shuffle == "block" else {"shuffle": shuffle}


def _spread(path, shuffle) -> float:
    """The shuffle-quality number of an order (packer/train/order.py spread) over the batches of BATCH."""
    ds = PackedDataset(path, seed=SEED, **_order_options(shuffle))
    return spread(ds.epoch_rows(ds.split()), ds.n_sequences, BATCH)


def run_case(path, kind, opts: dict, shuffle, memory: int, batches: int):
    """timed() of one case, its stream options set in the environment (as a DataLoader worker
    would get them) for the while; a cache case fills its cache first when it is empty."""
    env = {"PACKER_STREAM_MEMORY_BYTES": str(memory), **{stream.ENV[k]: str(v) for k, v in opts.items()}}
    saved = {k: os.environ.get(k) for k in stream.ENV.values()}
    os.environ.update(env)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make = lambda: kind(path, seed=SEED, batch_size=BATCH, **_order_options(shuffle))  # noqa: E731
            if "cache_dir" in opts and not Path(opts["cache_dir"]).exists():
                timed(make, batches)
            return timed(make, batches)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

if __name__ == "__main__":
    main()
