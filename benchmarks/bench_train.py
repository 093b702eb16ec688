"""Does packing with varlen attention train faster than padding? Effective (non-padding) tokens/s of TinyGPT.

    python benchmarks/bench_train.py              # ~2-3 min on a busy 2-core CPU
    python benchmarks/bench_train.py --tokens 8192 --threads 1
    python benchmarks/bench_train.py --device cuda --dtype bf16 --dim 1024 --layers 8 --heads 16 --tokens 262144

Same model, same documents (web-like lengths: lognormal, median 300, mean 600, split at the
context 2048; random token ids), same number of real tokens, forward + backward + AdamW step:

    (a) padded    one document per row, each batch padded to its longest document
    (b) packed    FFD-packed rows of 2048, rows padded to 2048, plain causal attention per row
                  (documents see each other: the cross-contamination varlen removes)
    (c) varlen    the same packed rows, concatenated unpadded into one row, varlen attention

Prints tokens (real / slots), padding share, seconds, effective tokens/s, peak memory of one
step, and each ratio to (a). Measured 2026-11-29, busy 2-core CPU, --threads 1, default budget:
(a) 594 tokens/s (padding 0.50), (b) 878 (1.48x), (c) 1243 (2.09x); target (c) >= 1.7x (a).

Measured 2026-12-04 on an NVIDIA H200 (benchmarks/gpu_check.sh: torch 2.11.0+cu130, bf16 autocast,
--dim 1024 --layers 8 --heads 16 --tokens 262144, varlen backend torch_varlen): (a) 51,191 effective
tokens/s (padding 0.51), (b) 109,352 (2.14x), (c) 109,376 (2.14x); peak memory 1,126 / 1,683 / 1,683 MB.
On the GPU the exact per-document attention costs nothing against packing without it. Steps of 4K
tokens leave an H200 launch-bound, so read the ratios, not the tokens/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_attention import PeakMemory, machine_line, web_like_lengths  # noqa: E402

from packer import masks  # noqa: E402
from packer.attention import pick_backend  # noqa: E402
from packer.binpack import pack  # noqa: E402
from packer.train.model import GPTConfig, TinyGPT  # noqa: E402

SEED = 0
CONTEXT = 2048
MODEL = GPTConfig(vocab_size=4096, dim=256, n_layers=4, n_heads=4)
PADDED_BATCH = 4  # documents per padded batch
PACKED_BATCH = 2  # packed rows per step


def corpus(n_tokens: int) -> list[np.ndarray]:
    lengths = web_like_lengths(4 * n_tokens // 600 + 50, CONTEXT, SEED)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), n_tokens)) + 1]
    rng = np.random.default_rng(SEED)
    return [rng.integers(0, MODEL.vocab_size, n) for n in lengths]


def padded_batches(docs):
    for i in range(0, len(docs), PADDED_BATCH):
        chunk = docs[i:i + PADDED_BATCH]
        L = max(len(d) for d in chunk)
        ids = torch.zeros(len(chunk), L, dtype=torch.long)
        labels = torch.full((len(chunk), L), masks.IGNORE_INDEX)
        for r, d in enumerate(chunk):
            ids[r, : len(d)] = torch.from_numpy(d)
            labels[r, 1: len(d)] = torch.from_numpy(d[1:])
        yield sum(len(d) for d in chunk), {"input_ids": ids, "labels": labels}


def packed_rows(docs):
    bins = pack(np.array([len(d) for d in docs]), CONTEXT)
    order = np.random.default_rng(SEED).permutation(bins.max() + 1)
    return [[d for d, b in zip(docs, bins) if b == row] for row in order]


def unmasked_batches(rows):
    for i in range(0, len(rows), PACKED_BATCH):
        chunk = rows[i:i + PACKED_BATCH]
        ids = torch.zeros(len(chunk), CONTEXT, dtype=torch.long)
        labels = torch.full((len(chunk), CONTEXT), masks.IGNORE_INDEX)
        for r, row in enumerate(chunk):
            flat = np.concatenate(row)
            offsets = np.concatenate([[0], np.cumsum([len(d) for d in row])])
            ids[r, : len(flat)] = torch.from_numpy(flat)
            labels[r, : len(flat)] = torch.from_numpy(masks.labels(flat, offsets))
        yield sum(len(d) for row in chunk for d in row), {"input_ids": ids, "labels": labels}


def varlen_batches(rows):
    for i in range(0, len(rows), PACKED_BATCH):
        docs = [d for row in rows[i:i + PACKED_BATCH] for d in row]
        flat = np.concatenate(docs)
        offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
        yield len(flat), {
            "input_ids": torch.from_numpy(flat),
            "labels": torch.from_numpy(masks.labels(flat, offsets)),
            "position_ids": torch.from_numpy(masks.position_ids(offsets)),
            "cu_seqlens": torch.from_numpy(offsets.astype(np.int32)),
            "max_seqlen": int(np.diff(offsets).max()),
        }


class Trainer:
    """One mode's model, optimizer and running figures (batches moved to the device up front;
    on CUDA with bf16 the forward runs under autocast, so varlen attention takes its bf16 kernels)."""

    def __init__(self, batches, model=MODEL, device="cpu", dtype=torch.float32):
        torch.manual_seed(SEED)
        self.device, self.dtype = torch.device(device), dtype
        self.model = TinyGPT(model).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batches = [(n, {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in b.items()})
                        for n, b in batches]
        self.real = self.slots = 0
        self.seconds = 0.0
        self.losses = []
        self.step(self.batches[0][1])  # warm-up, untimed
        with PeakMemory(device) as mem:
            self.step(self.batches[0][1])
        self.peak = mem.bytes

    def step(self, batch):
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            _, loss = self.model(**batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()  # waits for the device: the step is over when this returns

    def timed_step(self, i):
        n_real, batch = self.batches[i]
        t = time.perf_counter()
        self.losses.append(self.step(batch))
        self.seconds += time.perf_counter() - t
        self.real += n_real
        self.slots += batch["input_ids"].numel()


def run_modes(modes: dict, **trainer_kw) -> dict:
    """Train every mode over its batches (the first one untimed), the modes taking turns step by step
    so load drift on a shared machine hits them alike."""
    trainers = {name: Trainer(batches, **trainer_kw) for name, batches in modes.items()}
    for i in range(1, max(len(t.batches) for t in trainers.values())):
        for t in trainers.values():
            if i < len(t.batches):
                t.timed_step(i)
    return trainers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=24_576, help="real tokens per mode (default %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared 2-core machine 2 threads oversubscribe and run ~3x slower)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast (CUDA)")
    parser.add_argument("--dim", type=int, default=MODEL.dim)
    parser.add_argument("--layers", type=int, default=MODEL.n_layers)
    parser.add_argument("--heads", type=int, default=MODEL.n_heads)
    parser.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.dim, args.layers, args.heads = 4096, 64, 1, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = dataclasses.replace(MODEL, dim=args.dim, n_layers=args.layers, n_heads=args.heads)
    docs = corpus(args.tokens)
    rows = packed_rows(docs)
    print(machine_line())
    print(f"# TinyGPT {model}, {args.device} {args.dtype}, varlen backend {pick_backend(args.device, dtype, True)}; "
          f"context {CONTEXT}, "
          f"{len(docs)} documents, {sum(len(d) for d in docs)} tokens, seed {SEED}; padded batch {PADDED_BATCH} docs, "
          f"packed batch {PACKED_BATCH} rows ({len(rows)} rows)")
    print(f"{'case':<10} {'real tok':>9} {'slots':>8} {'padding':>8} {'seconds':>8} {'eff tok/s':>10} {'x (a)':>6} "
          f"{'peak MB':>8} {'loss':>6}")
    trainers = run_modes({"(a) padded": padded_batches(docs), "(b) packed": unmasked_batches(rows),
                          "(c) varlen": varlen_batches(rows)}, model=model, device=args.device, dtype=dtype)
    base = None
    for name, r in trainers.items():
        speed = r.real / r.seconds
        base = base or speed
        print(f"{name:<10} {r.real:9d} {r.slots:8d} {1 - r.real / r.slots:8.3f} {r.seconds:8.2f} "
              f"{speed:10.0f} {speed / base:6.2f} {r.peak / 2**20:8.0f} {np.mean(r.losses):6.3f}")


if __name__ == "__main__":
    main()
