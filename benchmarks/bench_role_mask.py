"""What does a role policy cost on the exact CPU path, against dense masked SDPA at context 4096?

    python benchmarks/bench_role_mask.py            # CPU fp32, 1 thread, 3 rows of 4096 (~1 min busy, 2 cores)
    python benchmarks/bench_role_mask.py --device cuda --dtype bf16   # adds flex; 32 rows in one call, best of 10

Rows are FFD-packed chat conversations (lognormal, median 500, mean 800 tokens, cut at the
context), each a system prompt (~8%), then alternating user / assistant turns. The policy is the
articles' hybrid mask: system global, user keys through a 64-token window, the rest causal:
RolePolicy(role_windows={"user": 64}, global_roles={"system"}). 8 heads x 64 dims, no HF.

The baseline is scaled_dot_product_attention of each row with its dense [L, L] hybrid mask
(packer.masks.hybrid_mask, cross-document pairs masked). Cases: bucketed and sdpa with the policy
(varlen_attention(..., role_ids, policy)), and bucketed without one (document-causal) for what the
policy itself adds. Each prints forward and forward+backward time, best of REPEATS, and its ratio
to the baseline timed in the same run.

Measured 2026-12-03, shared 2-core CPU, 1 thread, 3 rows of 4096 (9 conversations, flop ratio 2.9x),
against the dense hybrid mask: bucketed + policy forward 7.6x, forward+backward 6.6x faster (sdpa +
policy 3.9x / 4.3x; bucketed without a policy 10.4x / 7.6x); a second run at load 7.7: 5.8x / 4.9x
(sdpa 2.4x / 2.7x; no policy 5.6x / 6.8x).

Measured 2026-12-04 on an NVIDIA H200 (torch 2.11.0+cu130, bf16), every row in one call as a GPU step
runs them (dense: one batched SDPA with [B, 1, L, L] masks), best of 10: 32 rows (flop ratio 4.1x)
flex + policy forward 0.60x, forward+backward 1.22x of the dense hybrid mask; bucketed + policy 0.34x /
0.22x, sdpa + policy 0.09x / 0.09x. 8 rows: flex 0.34x / 0.84x, bucketed 0.37x / 0.22x. One call a row
(3 rows, the CPU layout): flex 0.77x / 0.97x, bucketed 2.82x / 1.69x. flex, auto's pick on CUDA, is
the fastest exact policy backend for training steps of many rows; forward alone, dense masks win.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer.attention import varlen_attention  # noqa: E402
from packer.binpack import pack  # noqa: E402
from packer.masks import DEFAULT_ROLES, RolePolicy, hybrid_mask  # noqa: E402

SEED = 0
CONTEXT = 4096
N_ROWS = 3
HEADS, HEAD_DIM = 8, 64
REPEATS = 2
POLICY = RolePolicy(role_windows={"user": 64}, global_roles={"system"})


def conversations(n: int, rng) -> list[np.ndarray]:
    """Role ids of n conversations: a system prompt, then user / assistant turns (lognormal lengths)."""
    out = []
    for total in np.minimum(rng.lognormal(np.log(500), 0.8, n), CONTEXT - 8).astype(int) + 8:
        system = max(1, int(0.08 * total))
        turns = [np.full(system, DEFAULT_ROLES["system"])]
        left, k = total - system, 0
        while left > 0:
            n_turn = min(left, int(rng.integers(8, 160)))
            turns.append(np.full(n_turn, DEFAULT_ROLES["user" if k % 2 == 0 else "assistant"]))
            left, k = left - n_turn, k + 1
        out.append(np.concatenate(turns).astype(np.uint8))
    return out


def packed_rows(rng, n_rows: int) -> list[list[np.ndarray]]:
    """n_rows full rows of FFD-packed conversations, in a seeded order."""
    convs = conversations(60 * n_rows, rng)
    bins = pack(np.array([len(c) for c in convs]), CONTEXT)
    rows = [[c for c, b in zip(convs, bins) if b == k] for k in rng.permutation(bins.max() + 1)]
    return [r for r in rows if sum(map(len, r)) > 0.95 * CONTEXT][:n_rows]


def _padded(t: torch.Tensor, n: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, 0, 0, 0, 0, n - len(t)))


def cases(rows, device, dtype, one_call: bool):
    """The cases, each a function of `backward`. one_call (CUDA): every row in one call (dense: one batched
    SDPA over [B, H, L, D] with [B, 1, L, L] masks; varlen: one call, cu_seqlens merged), as a GPU step
    runs them; else one call per row."""
    g = torch.Generator().manual_seed(SEED)
    out = {}
    data = []
    for row in rows:
        offsets = np.concatenate([[0], np.cumsum([len(c) for c in row])])
        role_ids = np.concatenate(row)
        T = int(offsets[-1])
        q, k, v, grad = (torch.randn(T, HEADS, HEAD_DIM, generator=g).to(device, dtype) for _ in range(4))
        mask = torch.from_numpy(hybrid_mask(offsets, role_ids, POLICY, DEFAULT_ROLES)).to(device)
        cu = torch.tensor(offsets, dtype=torch.int32, device=device)
        data.append((q, k, v, grad, mask, cu, int(np.diff(offsets).max()), torch.from_numpy(role_ids).to(device)))
    dense_data = data
    if one_call:
        L = max(len(d[0]) for d in data)
        masks = torch.zeros(len(data), 1, L, L, dtype=torch.bool, device=device)
        for r, d in enumerate(data):
            masks[r, 0, : len(d[0]), : len(d[0])] = d[4]
            masks[r, 0, len(d[0]):, len(d[0]):] = torch.eye(L - len(d[0]), dtype=torch.bool, device=device)  # pads
        dense_data = [tuple(torch.stack([_padded(d[i], L) for d in data]) for i in range(4)) + (masks,)]
        cu = torch.cat([data[0][5]] + [d[5][1:] + sum(len(e[0]) for e in data[:r + 1])
                                        for r, d in enumerate(data[1:])])
        data = [tuple(torch.cat([d[i] for d in data]) for i in range(4)) + (None, cu, max(d[6] for d in data),
                                                                           torch.cat([d[7] for d in data]))]

    def dense(backward):
        for q, k, v, grad, mask, *_ in dense_data:
            for t in (q, k, v):
                t.requires_grad_(backward)
            o = F.scaled_dot_product_attention(*(t.transpose(-3, -2) for t in (q, k, v)), attn_mask=mask)
            if backward:
                o.backward(grad.transpose(-3, -2))

    def varlen(backend, policy):
        def run(backward):
            for q, k, v, grad, _, cu, longest, role_ids in data:
                for t in (q, k, v):
                    t.requires_grad_(backward)
                roles = {"role_ids": role_ids, "policy": policy} if policy is not None else {}
                with torch.set_grad_enabled(backward):
                    o = varlen_attention(q, k, v, cu, longest, backend=backend, **roles)
                if backward:
                    o.backward(grad)
        return run

    out["dense hybrid mask"] = dense
    out["bucketed + policy"] = varlen("bucketed", POLICY)
    out["sdpa + policy"] = varlen("sdpa", POLICY)
    out["bucketed, no policy"] = varlen("bucketed", None)
    if torch.device(device).type == "cuda":
        out["flex + policy"] = varlen("flex", POLICY)
    return out


def best(fn, backward, device, repeats) -> float:
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn(backward)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    global CONTEXT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared 2-core machine)")
    parser.add_argument("--repeats", type=int, help=f"timed rounds, best kept (default {REPEATS}; 10 on CUDA)")
    parser.add_argument("--rows", type=int, help=f"rows of {CONTEXT} (default {N_ROWS}; 32 on CUDA, in one call)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.repeats, CONTEXT = 1, 1, 1024
    cuda = torch.device(args.device).type == "cuda"
    args.repeats = args.repeats or (10 if cuda else REPEATS)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.set_num_threads(args.threads)
    print(f"# {platform.node()} {platform.machine()}, {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}; "
          f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}")
    rows = packed_rows(np.random.default_rng(SEED), args.rows or (32 if cuda else N_ROWS))
    lengths = [len(c) for r in rows for c in r]
    flops = len(rows) * CONTEXT ** 2 / sum(n * n for n in lengths)
    print(f"# {args.device} {dtype}, {len(rows)} rows of {CONTEXT}, {len(lengths)} conversations, fill "
          f"{sum(lengths) / (len(rows) * CONTEXT):.3f}, flop ratio L^2/sum(l^2) {flops:.1f}x, heads {HEADS} x "
          f"{HEAD_DIM}, best of {args.repeats}, {'one call' if cuda else 'one call a row'}, policy {POLICY}")
    runs = cases(rows, args.device, dtype, one_call=cuda)
    for fn in runs.values():  # warm-up (flex's compiles, forward and backward; allocator pools) outside the timing
        fn(False)
        fn(True)
    print(f"{'case':<22} {'fwd ms':>9} {'fwd x':>7} {'fwd+bwd ms':>11} {'fwd+bwd x':>10}")
    base = None
    for name, fn in runs.items():
        f, b = best(fn, False, args.device, args.repeats), best(fn, True, args.device, args.repeats)
        base = base or (f, b)
        print(f"{name:<22} {f * 1e3:9.2f} {base[0] / f:7.2f} {b * 1e3:11.2f} {base[1] / b:10.2f}")


if __name__ == "__main__":
    main()
