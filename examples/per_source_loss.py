"""Train TinyGPT on a weighted blend and log the loss of each source, from the batch's per-token source ids.

    python examples/per_source_loss.py web=out/web code=out/code --weights web=0.7,code=0.3 --steps 40
    python examples/per_source_loss.py out/mixed --weights prose=0.5,code=0.5   # named sources of one build

PackedDataset(..., fields=ItemFields(source_ids=True)) gives each batch `source_ids` (int64, one per token: the source
of the row it came from; names in dataset.source_names). The per-token loss (reduction="none"), grouped by
the source of the token it predicts, gives one mean per source: what a mixture run watches to see whether a
source is learned, or over-weighted.
"""

from __future__ import annotations

import argparse
import time

import torch

from packer.data import ItemFields, PackedDataset
from packer.store.dataset import open_dataset
from packer.train.model import GPTConfig, TinyGPT, next_token_loss


def source_losses(token_loss: torch.Tensor, labels: torch.Tensor, source_ids: torch.Tensor, n_sources: int):
    """(sum of loss, tokens) per source: token_loss[t] is position t predicting labels[t + 1] (-100 ignored)."""
    target_source, trained = source_ids[1:], labels[1:] != -100
    sums = torch.zeros(n_sources).index_add_(0, target_source[trained], token_loss[trained].detach().float())
    counts = torch.bincount(target_source[trained], minlength=n_sources)
    return sums, counts


def train(paths, weights=None, *, steps=40, batch_size=4, dim=128, lr=1e-3, seed=0, log=print) -> dict:
    """Run `steps` optimizer steps; return {source name: mean loss over the run}."""
    torch.manual_seed(seed)
    ds = PackedDataset(paths, weights=weights, seed=seed, batch_size=batch_size, fields=ItemFields(source_ids=True))
    names = ds.source_names
    vocab = max(int(m["tokenizer"]["vocab_size"]) for m in ds.manifests)
    model = TinyGPT(GPTConfig(vocab_size=vocab, dim=dim))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    total, tokens, t0, step, epoch = torch.zeros(len(names)), torch.zeros(len(names)), time.perf_counter(), 0, 0
    while step < steps:
        ds.set_epoch(epoch)
        for batch in ds:  # one flattened row: input_ids [1, T], source_ids [1, T]
            ids, labels, sources = batch["input_ids"][0], batch["labels"][0], batch["source_ids"][0]
            logits = model(ids, batch["position_ids"][0], batch["cu_seqlens"], batch["max_seqlen"])
            token_loss = next_token_loss(logits, labels, reduction="none")
            loss = token_loss[labels[1:] != -100].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sums, counts = source_losses(token_loss, labels, sources, len(names))
            total, tokens = total + sums, tokens + counts
            if log and (step % 10 == 0 or step == steps - 1):
                per = "  ".join(f"{n} {s / max(c, 1):.3f} ({int(c)} tok)" for n, s, c in zip(names, sums, counts))
                log(f"step {step:4d}  loss {loss.item():.3f}  {per}  {tokens.sum() / (time.perf_counter() - t0):,.0f} "
                    "tokens/s")
            step += 1
            if step == steps:
                break
        epoch += 1
    return {n: float(s / max(c, 1)) for n, s, c in zip(names, total, tokens)}


def _parse(dataset_args, weights_arg):
    paths = dict(a.split("=", 1) for a in dataset_args) if "=" in dataset_args[0] else dataset_args[0]
    weights = {k: float(v) for k, v in (w.split("=") for w in weights_arg.split(","))} if weights_arg else None
    return paths, weights


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="+", help="NAME=DIR ... (several builds), or one DIR with named sources")
    parser.add_argument("--weights", help="NAME=W,NAME=W (default: in proportion to rows)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    paths, weights = _parse(args.datasets, args.weights)
    if isinstance(paths, str):
        open_dataset(paths)  # one line naming a missing or damaged directory, before torch spins up
    print(train(paths, weights, steps=args.steps, batch_size=args.batch_size))
