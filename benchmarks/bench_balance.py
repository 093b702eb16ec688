"""Do steps finish together? Each rank's step cost, rows dealt in the shuffled order (by tokens) against
rows dealt by cost (packer.balance, PackedDataset(balance=Balance(...))), and what a fitted cost model says.

    python benchmarks/bench_balance.py                   # FFD rows of lognormal lengths at 8K, 32K, 128K
    python benchmarks/bench_balance.py --dataset DIR     # the rows of a built dataset
    python benchmarks/bench_balance.py --fit             # time packer's tiny model, fit per_token / per_pair
    python benchmarks/bench_balance.py --fit --device cuda --shape llama-layer   # on a GPU (gpu_check.sh)

Rows: packer's own FFD (packer.binpack) over lognormal document lengths scaled to the context (median
context * e^-4.3, sigma 1.5: web-like, and the attention shares of issue 37's table), or a dataset's rows.
Cost: the 8B model of the issue, 6 * 8e9 a token + 6 * 4096 * 32 an entry of each document's L^2
(packer/balance.py says why that is the causal attention FLOPs). The rows, in a seeded shuffle, are dealt
to `ranks` x `rows/rank` a step; `tokens` deals them in that order, `balanced` by packer.balance with a
window of 32 steps. slowest/mean: the mean over steps of the slowest rank's cost over the mean rank's;
busy: sum of mean costs / sum of slowest costs (the share of GPU time spent working); moved: mean steps
a row moved from its shuffled step; corr: correlation of a row's cost with its step index.

Measured 2026-12-05 (2-core box, load 8; 65536 FFD rows a context, seed 0, window 32), six of the 24 rows:
    context ranks rows/rank attention dealing  slowest/mean busy   moved corr   deal s
    8K      8     1         0.033     tokens   1.065        0.939  0.00  -0.002 0.000
    8K      8     1         0.033     balanced 1.003        0.997  5.53  -0.002 0.045
    8K      64    1         0.033     tokens   1.096        0.912  0.00  -0.002 0.000
    8K      64    1         0.033     balanced 1.004        0.996  5.95  -0.003 0.017
    32K     64    1         0.120     tokens   1.353        0.739  0.00  -0.002 0.000
    32K     64    1         0.120     balanced 1.010        0.990  8.63  -0.001 0.015
    128K    8     1         0.353     tokens   1.682        0.592  0.00  -0.002 0.000
    128K    8     1         0.353     balanced 1.017        0.981  8.09  -0.002 0.034
    128K    64    1         0.353     tokens   2.037        0.492  0.00  -0.002 0.000
    128K    64    1         0.353     balanced 1.020        0.977  9.30  -0.000 0.010
    128K    64    4         0.353     tokens   1.570        0.637  0.00  -0.002 0.000
    128K    64    4         0.353     balanced 1.004        0.996  9.45  -0.001 0.021
With 4 rows a rank a smaller window is enough: --window 8 gives busy 0.991 at 128K / 64 ranks with rows moving
2.45 steps (0.995 at 32K), --window 16 0.995 at 4.8 steps.
--fit on the same box (tiny model, 1.4M parameters, CPU, one thread, load 7.5, bucketed attention): per_token
3.0e-4 s, per_pair 2.4e-7 s, R^2 0.956 over 15 rows of 512-2048 tokens in 1-64 equal documents; per_pair /
per_token 7.8e-4 against the FLOP count's 1.8e-4 (on a CPU attention runs far below the matmuls' FLOP rate).
(the full table: run it; issue 37's targets: busy >= 0.97 at 128K/64/1 with rows moving <= 16 steps,
>= 0.99 with 4 rows, >= 0.98 at 32K/64/1, at 8K no worse than tokens.)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer import __version__  # noqa: E402
from packer.balance import CostModel, balance_figures, balanced_order, move_figures  # noqa: E402
from packer.binpack import pack, split_documents  # noqa: E402

SEED = 0
CONTEXTS = (8192, 32768, 131072)
CASES = ((8, 1), (8, 4), (64, 1), (64, 4))  # (ranks, rows per rank)
ROWS = 65536  # rows a context: 10 windows of 32 steps at 64 ranks x 4 rows
WINDOW = 32
MU, SIGMA = -4.3, 1.5  # log(length / context) ~ Normal(MU, SIGMA)
COST = CostModel.for_model(n_params=8e9, d_model=4096, n_layers=32)


def web_like_rows(context: int, n_rows: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, pairs) of the first n_rows FFD rows of lognormal document lengths scaled to the context."""
    rng = np.random.default_rng([seed, context])
    n_docs = int(n_rows * context / (context * np.exp(MU + SIGMA**2 / 2))) + 16
    lengths = np.maximum(1, context * np.exp(rng.normal(MU, SIGMA, n_docs))).astype(np.int64)
    pieces = split_documents(lengths, context)[2]
    bins = pack(pieces, context)
    keep = bins < n_rows
    return (np.bincount(bins[keep], weights=pieces[keep], minlength=n_rows).astype(np.int64),
            np.bincount(bins[keep], weights=pieces[keep].astype(np.float64) ** 2, minlength=n_rows))


def dataset_rows(path: str) -> tuple[int, np.ndarray, np.ndarray]:
    """(context, tokens, pairs) of every row of a built dataset."""
    from packer.store.dataset import open_dataset
    from packer.train.balance import dataset_tokens_pairs

    ds = open_dataset(path)
    return int(ds.manifest["config"]["context_length"]), *dataset_tokens_pairs(ds)


def table(contexts_rows, window: int, seed: int):
    print(f"{'context':<8}{'ranks':<6}{'rows/rank':<10}{'attention':<10}{'dealing':<9}{'slowest/mean':<13}"
          f"{'busy':<7}{'moved':<6}{'corr':<7}{'deal s':<7}")
    for context, tokens, pairs in contexts_rows:
        costs = COST.costs(tokens, pairs)[np.random.default_rng(seed).permutation(len(tokens))]
        share = COST.attention_share(rows=len(tokens), tokens=float(np.sum(tokens)), pairs=float(np.sum(pairs)))
        for ranks, rows in CASES:
            t0 = time.perf_counter()
            perm = balanced_order(costs, ranks, rows, window)
            seconds = time.perf_counter() - t0
            for name, order in (("tokens", np.arange(len(costs))), ("balanced", perm)):
                fig, moves = balance_figures(costs[order], ranks, rows), move_figures(order, costs, ranks, rows)
                print(f"{f'{context // 1024}K':<8}{ranks:<6}{rows:<10}{share:<10.3f}{name:<9}"
                      f"{fig['slowest_over_mean']:<13.3f}{fig['busy_fraction']:<7.3f}{moves['mean_moved_steps']:<6.2f}"
                      f"{moves['corr_cost_step']:<7.3f}{seconds if name == 'balanced' else 0:<7.3f}")


def _fit_rows(context: int) -> list[np.ndarray]:
    """Document lengths of rows of different cost: 1 to 64 equal documents (one length group each: the CPU's
    bucketed attention makes one batched call a group), tokens from a quarter to all of the context."""
    rows = []
    for fill in (0.25, 0.5, 1.0):
        for n_docs in (1, 2, 4, 16, 64):
            rows.append(np.full(n_docs, max(1, int(context * fill) // n_docs), np.int64))
    return rows


def fit(device: str, shape: str, context: int, repeats: int):
    """Time forward + backward of a model on packed rows of different cost; fit per_token and per_pair."""
    import torch

    from packer.masks import position_ids
    from packer.train.model import GPTConfig, TinyGPT

    torch.manual_seed(SEED)
    if shape == "tiny":
        cfg = GPTConfig(vocab_size=4096, dim=128, n_layers=2, n_heads=4)
    else:  # one Llama-8B-shaped layer: d_model 4096, 32 heads, 8 KV heads (a 4x GELU MLP, not SwiGLU 14336)
        cfg = GPTConfig(vocab_size=4096, dim=4096, n_layers=1, n_heads=32, n_kv_heads=8)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = TinyGPT(cfg).to(device=device, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"fit: {shape} model, {n_params / 1e6:.1f}M parameters, dim {cfg.dim}, {cfg.n_layers} layers, device "
          f"{device}, {dtype}, context {context}, best of {repeats}")
    rng = np.random.default_rng(SEED)
    tokens, pairs, seconds, n_docs = [], [], [], []
    for docs in _fit_rows(context):
        offsets = np.concatenate([[0], np.cumsum(docs)]).astype(np.int32)
        total = int(offsets[-1])
        ids = torch.from_numpy(rng.integers(0, cfg.vocab_size, total)).to(device)
        pos = torch.as_tensor(position_ids(offsets)).to(device)
        cu = torch.from_numpy(offsets).to(device)
        best = float("inf")
        for r in range(repeats + 1):  # the first is a warm-up
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            _, loss = model(ids, pos, cu, int(docs.max()), labels=ids)
            loss.backward()
            if device == "cuda":
                torch.cuda.synchronize()
            if r:
                best = min(best, time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        tokens.append(total), pairs.append(float((docs.astype(np.float64) ** 2).sum())), seconds.append(best)
        n_docs.append(len(docs))
    fitted = CostModel.fit(tokens, pairs, seconds)
    flops = CostModel.for_model(n_params=n_params, d_model=cfg.dim, n_layers=cfg.n_layers)
    print(f"{'docs':<6}{'tokens':<8}{'pairs':<14}{'seconds':<10}{'fitted':<10}")
    for d, t, p, s in zip(n_docs, tokens, pairs, seconds):
        print(f"{d:<6}{t:<8}{p:<14.0f}{s:<10.4f}{float(fitted.costs([t], [p])[0]):<10.4f}")
    print(f"fitted: per_token {fitted.per_token:.3e} s, per_pair {fitted.per_pair:.3e} s, R^2 {fitted.r2:.4f}; "
          f"per_pair / per_token {fitted.per_pair / max(fitted.per_token, 1e-30):.3e} (FLOP count: "
          f"{flops.per_pair / flops.per_token:.3e})")
    return fitted


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", help="a built dataset: deal its own rows")
    parser.add_argument("--rows", type=int, default=ROWS, help="generated rows a context")
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--fit", action="store_true", help="time a model's forward+backward and fit the cost model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", choices=("tiny", "llama-layer"), default="tiny")
    parser.add_argument("--context", type=int, default=2048, help="--fit: tokens of the longest row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 4096 rows a context, and a fit at "
                        "context 256 (tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.rows = 4096
    print(f"packer {__version__}, python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}; cost {COST}")
    if args.fit or args.smoke:
        import torch

        torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
        fit(args.device, args.shape, 256 if args.smoke else args.context, 1 if args.smoke else args.repeats)
        if not args.smoke:
            return
    if args.dataset:
        rows = [dataset_rows(args.dataset)]
    else:
        print(f"rows: {args.rows} FFD rows a context of lognormal lengths (median context * e^{MU}, sigma {SIGMA}), "
              f"seed {args.seed}, window {args.window}")
        rows = [(c, *web_like_rows(c, args.rows, args.seed)) for c in CONTEXTS]
    table(rows, args.window, args.seed)


if __name__ == "__main__":
    main()
