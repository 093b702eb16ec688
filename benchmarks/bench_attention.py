"""How much faster is exact varlen attention than dense block-causal-masked SDPA on packed rows?

    python benchmarks/bench_attention.py            # contexts 4096 and 8192, CPU fp32 (~4 min busy, 2 cores)
    python benchmarks/bench_attention.py --quick    # context 4096 only, no flex
    python benchmarks/bench_attention.py --device cuda --dtype bf16   # GPU (gpu_check.sh)

On CUDA the rows of a context go through one call (dense: one SDPA over [B, H, L, D] with a
[B, 1, L, L] mask; varlen: one call over all rows, cu_seqlens merged), 128K tokens a context,
best of 10 rounds of every case: GPU kernels take microseconds, so per-row Python calls and a
single round would time the launch overhead and the first-call autotuning instead.

Rows are packed (FFD, then shuffled as the pipeline does) from web-like document lengths:
lognormal, median 300, mean 600, split at the context. 8 heads x 64 dims. For each backend:
forward time, forward+backward time (where it can train), peak memory growth, and each as a
ratio to scaled_dot_product_attention with a dense [T, T] block-causal mask on the same rows.
`flop ratio` is L^2 / sum(l_i^2): the most skipping masked blocks can win (a causal kernel
skips half of each document's square on top, so a ratio above it is possible).

Measured 2026-11-29, busy 2-core CPU, --threads 1, context 4096 (3 rows, flop ratio 2.9x):
bucketed fwd 8.0x, fwd+bwd 5.0x, peak memory 6.7x lower; flex fwd 6.1x (no CPU backward);
sdpa per document fwd+bwd 3.7x. Context 8192 (1 row, flop ratio 14.8x): bucketed fwd+bwd 56x.

Measured 2026-11-29 on an NVIDIA H200 (benchmarks/gpu_check.sh: torch 2.11.0+cu130, bf16, no
flash-attn), fwd+bwd against one batched dense-mask SDPA call: context 4096 (32 rows, flop ratio
2.5x) torch_varlen 3.10x (peak memory 2.1x lower), flex 1.63x, bucketed 0.20x, sdpa 0.07x;
context 8192 (16 rows, 4.4x) torch_varlen 5.71x, flex 2.99x, bucketed 0.43x, sdpa 0.19x.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer import masks  # noqa: E402
from packer.attention import available_backends, varlen_attention  # noqa: E402
from packer.binpack import pack  # noqa: E402

SEED = 0
HEADS, HEAD_DIM = 8, 64
TOKENS = 12_288  # packed rows timed per context: 3 at 4096, 1 at 8192 (summed), so no one odd row decides
REPEATS = 2  # best of, after one warm-up call that also measures peak memory (see measure)


def web_like_lengths(n: int, context: int, seed: int = SEED) -> np.ndarray:
    """Lognormal token lengths (median 300, mean 600, like web text), split into pieces of at most `context`."""
    rng = np.random.default_rng(seed)
    raw = np.minimum(rng.lognormal(np.log(300), np.sqrt(2 * np.log(2)), n), 100_000).astype(np.int64) + 1
    n_full = raw // context
    out = np.repeat(raw, n_full + 1)  # each document: its full pieces, then the remainder, in document order
    first = np.repeat(np.cumsum(n_full + 1) - (n_full + 1), n_full + 1)
    out = np.where(np.arange(len(out)) - first < np.repeat(n_full, n_full + 1), context, out % context)
    return out[out > 0]


def packed_rows(context: int, n_rows: int, seed: int = SEED) -> list[list[int]]:
    """Document lengths of `n_rows` FFD-packed rows, taken after a seeded shuffle of the bins."""
    lengths = web_like_lengths(40 * context // 600 + 200, context, seed)
    bins = pack(lengths, context)
    order = np.random.default_rng(seed).permutation(bins.max() + 1)
    rows = [lengths[bins == b].tolist() for b in order]
    rows = [r for r in rows if sum(r) > 0.95 * context]  # full rows: the steady state of a packed corpus
    return rows[:n_rows]


class PeakMemory:
    """Peak memory allocated over a block: torch.cuda.max_memory_allocated on CUDA; on CPU, from the
    profiler's allocation and free events replayed in time order (RSS misses reused heap memory)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
            self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self.start
            return
        self.prof.__exit__(*exc)
        events = sorted((e.time_range.start, e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
                        for e in self.prof.events())
        now = self.bytes = 0
        for _, change in events:
            now += change
            self.bytes = max(self.bytes, now)


def measure(cases: dict, device, repeats: int = REPEATS) -> dict:
    """{name: fn} -> {name: (best seconds, peak bytes)}. "X bwd" runs once under the memory probe
    (also its warm-up), then the cases take turns, REPEATS rounds, so load drift on a shared machine
    hits all of them alike. The dense baseline, slowest by far, runs once per case: its
    fwd+bwd time is that of the memory pass (a handful of large ops: the probe costs ~nothing)."""
    def wall(fn):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    out = {}
    for name, fn in cases.items():
        out[name] = [float("inf"), 0]
        if name.endswith(" fwd") and name[:-4] + " bwd" in cases:
            continue  # memory is reported for fwd+bwd
        with PeakMemory(device) as mem:
            seconds = wall(fn)
        out[name] = [seconds if name.startswith("dense") else float("inf"), mem.bytes]
    for rnd in range(repeats):
        for name, fn in cases.items():
            if not name.startswith("dense") or (name == "dense fwd" and rnd == 0) or device == "cuda":
                out[name][0] = min(out[name][0], wall(fn))
    return {name: tuple(v) for name, v in out.items()}


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
    return (f"# {platform.node()} {cpu}, {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}, {gpu}; "
            f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}")


def inputs(rows, device, dtype):
    lengths = [n for row in rows for n in row]
    T = sum(lengths)
    g = torch.Generator().manual_seed(SEED)
    q, k, v, grad = (torch.randn(T, HEADS, HEAD_DIM, generator=g).to(device, dtype) for _ in range(4))
    return lengths, q, k, v, grad


def dense_case(rows, device, dtype):
    """The baseline: each row through SDPA with its dense [L, L] block-causal mask."""
    lengths, q, k, v, grad = inputs(rows, device, dtype)
    starts = np.cumsum([0] + [sum(r) for r in rows])
    mask_of = [torch.from_numpy(masks.block_causal_mask(np.concatenate([[0], np.cumsum(r)]))).to(device)
               for r in rows]

    def run(backward):
        for t in (q, k, v):
            t.requires_grad_(backward)
        if batched:  # equal rows: one [B, H, L, D] call with a [B, 1, L, L] mask
            qb, kb, vb = (t.view(len(rows), -1, HEADS, HEAD_DIM).transpose(1, 2) for t in (q, k, v))
            o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=stacked)
            if backward:
                o.backward(grad.view(len(rows), -1, HEADS, HEAD_DIM).transpose(1, 2))
            return
        for (a, b), mask in zip(zip(starts[:-1], starts[1:]), mask_of):
            o = F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)), attn_mask=mask)
            if backward:
                o.backward(grad[a:b].transpose(0, 1))
    batched = torch.device(device).type == "cuda" and len({sum(r) for r in rows}) == 1
    stacked = torch.stack(mask_of)[:, None] if batched else None
    return run


def varlen_case(rows, backend, device, dtype):
    """One call per row, as a training step over these rows would make."""
    lengths, q, k, v, grad = inputs(rows, device, dtype)
    starts = np.cumsum([0] + [sum(r) for r in rows])
    cus = [torch.tensor(np.concatenate([[0], np.cumsum(r)]), dtype=torch.int32, device=device) for r in rows]

    if torch.device(device).type == "cuda":  # one call over all rows, as a step over a flattened batch
        starts, cus, rows = starts[[0, -1]], [torch.tensor(np.concatenate([[0], np.cumsum(lengths)]),
                                                          dtype=torch.int32, device=device)], [lengths]

    def run(backward):
        for t in (q, k, v):
            t.requires_grad_(backward)
        for (a, b), cu, row in zip(zip(starts[:-1], starts[1:]), cus, rows):
            with torch.set_grad_enabled(backward):
                o = varlen_attention(q[a:b], k[a:b], v[a:b], cu, max(row), backend=backend)
            if backward:
                o.backward(grad[a:b])
    return run


def bench_context(context, args):
    rows = packed_rows(context, max(1, args.tokens // context))
    if args.device == "cuda":  # equal rows, so the dense baseline is one batched call: pad each to the context
        rows = [r + [context - sum(r)] if sum(r) < context else r for r in rows]
    lengths = [n for r in rows for n in r]
    flop_ratio = len(rows) * context ** 2 / sum(n * n for n in lengths)
    print(f"\ncontext {context}: {len(rows)} rows, {len(lengths)} documents, fill "
          f"{sum(lengths) / (len(rows) * context):.3f}, longest {max(lengths)}, flop ratio L^2/sum(l^2) {flop_ratio:.1f}x")
    print(f"{'backend':<12} {'fwd ms':>9} {'fwd x':>7} {'fwd+bwd ms':>11} {'fwd+bwd x':>10} {'peak MB':>8} {'mem x':>6}")
    dense = dense_case(rows, args.device, args.dtype)
    cases = {"dense fwd": lambda: dense(False), "dense bwd": lambda: dense(True)}
    backends = {}
    for name, info in available_backends(args.device).items():
        if (name == "flex" and args.no_flex) or (name in ("flash_attn", "torch_varlen") and args.dtype == torch.float32):
            continue
        run = backends[name] = varlen_case(rows, name, args.device, args.dtype)
        if name == "flex":
            run(False)  # compile outside the timing and the memory figure
        cases[f"{name} fwd"] = functools.partial(run, False)
        if info["backward"]:
            cases[f"{name} bwd"] = functools.partial(run, True)
    m = measure(cases, args.device, args.repeats)
    (base_f, _), (base_b, base_mem) = m["dense fwd"], m["dense bwd"]
    results = {}
    for name in ["dense"] + list(backends):
        f, mem = m[f"{name} fwd"]
        if f"{name} bwd" in m:
            b, mem = m[f"{name} bwd"]
            bcol, bx = f"{b * 1e3:11.3f}", f"{base_b / b:10.2f}"
            results[name] = base_b / b
        else:
            bcol, bx = f"{'-':>11}", f"{'no bwd':>10}"
        label = "dense mask" if name == "dense" else name
        print(f"{label:<12} {f * 1e3:9.3f} {base_f / f:7.2f} {bcol} {bx} {mem / 2**20:8.0f} {base_mem / max(mem, 1):6.2f}")
    results.pop("dense")
    best = max(results, key=results.get)
    print(f"best trainable: {best}, {results[best]:.2f}x dense (flop ratio {flop_ratio:.1f}x)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--quick", action="store_true", help="context 4096 only, no flex")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared 2-core machine 2 threads oversubscribe and run ~3x slower)")
    parser.add_argument("--tokens", type=int, help=f"tokens a context (default {TOKENS}; 131072 on CUDA)")
    parser.add_argument("--repeats", type=int, help=f"timed rounds, best kept (default {REPEATS}; 10 on CUDA)")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its CPU compile takes ~30 s a shape)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.contexts, args.tokens, args.repeats, args.no_flex = [512], 1024, 1, True
    args.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.contexts, args.no_flex = [4096], True
    cuda = args.device == "cuda"
    args.tokens = args.tokens or (131_072 if cuda else TOKENS)
    args.repeats = args.repeats or (10 if cuda else REPEATS)
    print(machine_line())
    print(f"# heads {HEADS} x head_dim {HEAD_DIM}, {args.dtype}, {args.device}, seed {SEED}, {args.tokens} tokens a "
          f"context, best of {args.repeats}; lengths lognormal median 300 mean 600")
    for context in args.contexts:
        bench_context(context, args)


if __name__ == "__main__":
    main()
