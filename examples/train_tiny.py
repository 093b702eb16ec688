"""Train packer.train.model.TinyGPT for a few steps on a dataset built by `packer build`, with varlen attention.

    packer run pipelines/sample.toml              # builds out/sample
    python examples/train_tiny.py out/sample --steps 50

Each step concatenates a few packed rows into one varlen row (cu_seqlens merged), so no token
attends across a document boundary and no compute is spent on padding.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from packer.data import PackedDataset, collate_varlen
from packer.train.model import GPTConfig, TinyGPT


def varlen_row(items: list[dict]) -> dict:
    """Rows [a a b | c c c] -> one 1-D row with cu_seqlens [0, 2, 3, 6] (packer.data.collate_varlen,
    without its leading batch axis of 1: TinyGPT reads a 1-D row as packed)."""
    batch = collate_varlen(items)
    return {**batch, **{key: batch[key][0] for key in ("input_ids", "labels", "position_ids")}}


def train(path, *, steps=50, rows_per_step=4, dim=128, n_layers=2, n_heads=4, lr=1e-3, seed=0, log=print):
    """Run `steps` optimizer steps and return the loss of each."""
    torch.manual_seed(seed)
    ds = PackedDataset(path, shuffle=True, seed=seed)
    vocab = ds_vocab_size(path)
    model = TinyGPT(GPTConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=n_heads))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses, n_tokens, t0 = [], 0, time.perf_counter()

    def batches():
        for epoch in itertools.count():
            ds.set_epoch(epoch)
            it = iter(ds)
            while chunk := list(itertools.islice(it, rows_per_step)):
                yield varlen_row(chunk)

    for step, batch in zip(range(steps), batches()):
        _, loss = model(**batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        n_tokens += len(batch["input_ids"])
        if log and (step % 10 == 0 or step == steps - 1):
            log(f"step {step:4d}  loss {losses[-1]:.3f}  docs {len(batch['cu_seqlens']) - 1:3d}  "
                f"{n_tokens / (time.perf_counter() - t0):,.0f} tokens/s")
    return losses


def ds_vocab_size(path) -> int:
    from packer.store.dataset import open_dataset

    return int(open_dataset(path).manifest["tokenizer"]["vocab_size"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="a directory written by `packer build` / `packer run`")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rows-per-step", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    train(args.dataset, steps=args.steps, rows_per_step=args.rows_per_step, dim=args.dim, n_layers=args.layers,
          lr=args.lr)
