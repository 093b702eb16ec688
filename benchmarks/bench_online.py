"""What online packing and bucketed batching cost against the offline build: padding, and loader speed.

    python benchmarks/bench_online.py            # ~2-3 min on 2 busy cores (offline FFD over 300k docs dominates)
    python benchmarks/bench_online.py --quick    # 60k docs per distribution

Part 1, from lengths alone (no tokens): web-like lengths (lognormal, median 300, mean 600) and
short documents (lognormal, median 60, mean 120), split at the context. Padding share of offline
FFD over the whole corpus, of online packing with 1k / 10k / 100k-document buffers
(packer.online_pack.online_fill_rate: the dataset's own buffer/pack/carry steps), of length-bucketed
batches under a token budget of BATCH_ROWS * CONTEXT, and of one document per row padded to the context.

Part 2, loader throughput on the bundled sample corpus: packer.data.PackedDataset over a dataset
built by packer.preprocess.pipeline.build (the real offline loader), against OnlinePackedDataset from texts
(tokenizing on the fly) and from pre-tokenized ids, and bucketed batches through collate_documents.

2026-11-29, 2 shared cores (provisional), 300k docs, padding share:
    web   offline FFD 0.0019%; online 1k 0.0462% (-0.044 pp fill), 10k 0.0053% (-0.003 pp), 100k 0.0019%;
          bucketed pow2 22.7%, 64 quantile buckets 2.5%; one doc per row padded 72.8%
    short offline and every online buffer 0.0039%; bucketed pow2 28.8%, 64 quantile 13.2%; padded 94.2%
    loaders: online from token ids 0.2-0.3x the offline loader (~2 M slots/s); from texts ~0.01x
(docs/loading.md, section "Offline, online or bucketed?", summarizes them.)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TQDM_DISABLE", "1")  # the build's progress bars would garble the tables

from packer.binpack import pack, split_documents  # noqa: E402
from packer.config import BuildConfig  # noqa: E402
from packer.online_pack import online_fill_rate  # noqa: E402
from packer.train.bucketing import BucketedBatchSampler, collate_documents  # noqa: E402
from packer.train.items import ItemFields  # noqa: E402
from packer.train.online import OnlinePackedDataset  # noqa: E402

SEED = 0
CONTEXT = 2048
N_DOCS, N_DOCS_QUICK = 300_000, 60_000
BUFFERS = (1_000, 10_000, 100_000)
BATCH_ROWS = 16  # bucketed token budget: BATCH_ROWS * CONTEXT padded slots per batch
SIGMA = float(np.sqrt(2 * np.log(2)))  # lognormal with mean = 2 * median
DISTRIBUTIONS = {"web": 300, "short": 60}  # name -> median length in tokens
THROUGHPUT_BUFFER = 1_000  # docs; the sample corpus has ~3.9k, so the stream spans several buffers
TARGET_PP = 0.5
REPEATS = 3  # loader timings: best of 3 (from texts: one run, it tokenizes)


def lengths_of(median: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(SEED)
    return np.maximum(rng.lognormal(np.log(median), SIGMA, n).astype(np.int64), 1)


def timed(fn, repeats: int = 1):
    """(result, best wall seconds of `repeats` runs)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best


def fill_table(name: str, lengths: np.ndarray):
    pieces = split_documents(lengths, CONTEXT)[2]
    n_tokens = int(pieces.sum())
    print(f"\n[{name}] {len(lengths):,} docs, median {np.median(lengths):.0f}, mean {lengths.mean():.0f}, "
          f"{n_tokens:,} tokens, context {CONTEXT}")
    print(f"{'method':<28}{'rows/batches':>13}{'padding %':>11}{'fill vs offline pp':>20}{'max carry':>16}{'s':>7}")
    bins, seconds = timed(lambda: pack(pieces, CONTEXT, "ffd"))
    offline_rows = int(bins.max()) + 1
    offline_fill = n_tokens / (offline_rows * CONTEXT)

    def row(method, n_rows, padding, fill, carry, s):
        delta = f"{(fill - offline_fill) * 100:+.4f}" if fill is not None else "-"
        print(f"{method:<28}{n_rows:>13,}{padding * 100:>11.4f}{delta:>20}{carry:>16}{s:>7.1f}")

    row("offline FFD (all docs)", offline_rows, 1 - offline_fill, offline_fill, "-", seconds)
    verdict = None
    for buffer_docs in BUFFERS:
        r, s = timed(lambda: online_fill_rate(lengths, CONTEXT, buffer_docs))
        carry = f"{r['max_carry_bins']} bins/{r['max_carry_tokens']:,}t"
        row(f"online, buffer {buffer_docs:,}", r["sequences"], r["padding_share"], r["fill_rate"], carry, s)
        if buffer_docs == 10_000:
            verdict = (offline_fill - r["fill_rate"]) * 100
    for buckets in ("pow2", 64):
        sampler, s = timed(lambda: BucketedBatchSampler(pieces, max_tokens=BATCH_ROWS * CONTEXT, buckets=buckets,
                                                        seed=SEED))
        share, s2 = timed(sampler.padding_share)
        label = "pow2 buckets" if buckets == "pow2" else f"{buckets} quantile buckets"
        row(f"bucketed, {label}", len(sampler), share, None, "-", s + s2)
    padded_rows = int((-(-np.asarray(lengths) // CONTEXT)).sum())  # one document per row, long ones over several
    row("one doc per row, padded", padded_rows, 1 - int(np.sum(lengths)) / (padded_rows * CONTEXT), None, "-", 0.0)
    ok = "PASS" if verdict <= TARGET_PP else "FAIL"
    print(f"target: online 10k buffer within {TARGET_PP} pp of offline FFD: {verdict:.4f} pp -> {ok}")


def sample_texts() -> list[str]:
    import json

    texts = []
    for path in (ROOT / "sample_data/prose.jsonl", ROOT / "sample_data/code.jsonl"):
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f)
    return texts


def drain(iterable) -> tuple[int, int]:
    n_items = n_tokens = 0
    for item in iterable:
        n_items += 1
        n_tokens += int(item["input_ids"].numel())
    return n_items, n_tokens


def throughput_table():
    from packer.config import Job
    from packer.data import PackedDataset
    from packer.encode.tokenizer import load_tokenizer
    from packer.preprocess.pipeline import build

    tokenizer = str(ROOT / "sample_data/tokenizer.json")
    texts = sample_texts()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(inputs=(str(ROOT / "sample_data/prose.jsonl"), str(ROOT / "sample_data/code.jsonl")),
                  tokenizer=tokenizer, output=str(Path(tmp) / "ds"), workers=1,
                  config=BuildConfig(context_length=CONTEXT))
        _, build_s = timed(lambda: build(job, keep_work=False))
        offline = PackedDataset(job.output, seed=SEED, fields=ItemFields(pad_to=CONTEXT))
        (n_off, t_off), s_off = timed(lambda: drain(offline), REPEATS)  # the first run warms the page cache
        online = OnlinePackedDataset(texts, tokenizer=tokenizer, config=BuildConfig(context_length=CONTEXT, seed=SEED),
                                     buffer_docs=THROUGHPUT_BUFFER, fields=ItemFields(pad_to=CONTEXT))
        (n_on, t_on), s_on = timed(lambda: drain(online))
        tok = load_tokenizer(tokenizer)
        eos = online.eos_id
        ids = [e.ids + [eos] for e in tok.encode_batch_fast(texts, add_special_tokens=False)]
        pre = OnlinePackedDataset(ids, config=BuildConfig(context_length=CONTEXT, seed=SEED, eos=False),
                                  buffer_docs=THROUGHPUT_BUFFER, fields=ItemFields(pad_to=CONTEXT, pad_id=eos))
        (n_pre, t_pre), s_pre = timed(lambda: drain(pre), REPEATS)
        pieces = [np.asarray(d[i : i + CONTEXT]) for d in ids for i in range(0, len(d), CONTEXT)]
        sampler = BucketedBatchSampler([len(p) for p in pieces], max_tokens=BATCH_ROWS * CONTEXT, seed=SEED)
        (n_b, t_b), s_b = timed(lambda: drain(collate_documents([pieces[i] for i in b], pad_id=eos) for b in sampler),
                                REPEATS)

    print(f"\n[throughput] sample corpus: {len(texts):,} docs; offline build (1 worker) took {build_s:.1f} s; "
          f"online buffer {THROUGHPUT_BUFFER:,} docs; items padded to {CONTEXT}")
    print("(slots = items x their padded length; bucketed batches pad to their longest document)")
    print(f"{'loader':<44}{'items':>7}{'slots':>11}{'s':>8}{'slots/s':>12}{'vs offline':>12}")
    base = t_off / s_off
    for name, n, t, s in (
        ("offline PackedDataset (built Arrow shards)", n_off, t_off, s_off),
        ("offline build + PackedDataset", n_off, t_off, build_s + s_off),
        ("online, from texts (tokenizes)", n_on, t_on, s_on),
        ("online, from token ids", n_pre, t_pre, s_pre),
        ("bucketed pow2 + collate_documents, token ids", n_b, t_b, s_b),
    ):
        print(f"{name:<44}{n:>7,}{t:>11,}{s:>8.2f}{t / s:>12,.0f}{t / s / base:>11.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{N_DOCS_QUICK:,} docs per distribution")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    import numpy
    import tokenizers

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "absent"
    n = 3_000 if args.smoke else N_DOCS_QUICK if args.quick else N_DOCS
    print(f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cpus; "
          f"python {platform.python_version()}; numpy {numpy.__version__}; torch {torch_version}; "
          f"tokenizers {tokenizers.__version__}")
    print(f"config: seed {SEED}, context {CONTEXT}, docs/distribution {n:,}, buffers {BUFFERS}, "
          f"bucket budget {BATCH_ROWS}x{CONTEXT} tokens; padding % = padding slots / all slots")
    for name, median in DISTRIBUTIONS.items():
        fill_table(name, lengths_of(median, n))
    if not args.skip_throughput:
        throughput_table()


if __name__ == "__main__":
    main()
