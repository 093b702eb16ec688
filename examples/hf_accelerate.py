"""Train the tiny config-built Llama of hf_trainer.py with a plain accelerate loop: `Accelerator.prepare` of
packer's HF loader, and the token-weighted loss over all ranks.

    python examples/hf_accelerate.py --data out/sample --max-steps 20
    torchrun --nproc_per_node 2 examples/hf_accelerate.py --data out/sample --max-steps 20     # CPU: gloo

`packer.hf.hf_dataloader` gives batches of --batch-size packed rows (collate_hf), the same count on every
rank, in a loader that `accelerator.prepare` returns as it is (PackedDataset splits by rank already; accelerate
would split again, or dispatch from rank 0). The loss: each rank's summed token loss over the global token
count, times the world size (DDP averages gradients over ranks), which is the token-weighted mean over the
whole step's batch. --rows-seen / --loss-log: as in hf_trainer.py.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from hf_trainer import end_process_group, tiny_model, write_audit

from packer.data import PackedDataset
from packer.hf import hf_dataloader


def train(data, *, max_steps: int, batch_size: int = 4, seed: int = 0, audit: bool = False):
    """Run max_steps optimizer steps; return (rows trained, one {"step", "rows", "loss"} per step) of this rank."""
    accelerator = Accelerator(cpu=not torch.cuda.is_available())  # CPU ranks: gloo DDP
    model = tiny_model(data, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = hf_dataloader(PackedDataset(data, seed=seed), batch_size, return_row_ids=audit)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    rows_trained, steps = [], []
    model.train()
    while len(steps) < max_steps:
        for batch in loader:  # each pass over the loader is the next epoch (accelerate calls set_epoch)
            rows = batch.pop("row_ids", None)
            n_tokens = accelerator.reduce((batch["labels"] != -100).sum(), "sum")  # labels[0] is -100: = HF's shift
            loss = model(**batch, num_items_in_batch=n_tokens).loss * accelerator.num_processes
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if rows is not None:
                rows_trained += rows.tolist()
            steps.append({"step": len(steps), "rows": len(rows) if rows is not None else None, "loss": loss.item()})
            if accelerator.is_main_process and (len(steps) % 10 == 1 or len(steps) == max_steps):
                print(f"step {len(steps) - 1}: loss (this rank's share x world) {loss.item():.4f}")
            if len(steps) == max_steps:
                break
    return accelerator.process_index, rows_trained, steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a dataset directory written by packer build")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=4, help="packed rows per step and rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows-seen", default=None, help="write FILE.rank{R}: the rows each rank trained on")
    parser.add_argument("--loss-log", default=None, help="write FILE.rank{R}: one JSON line per step")
    opts = parser.parse_args(argv)
    rank, rows, steps = train(opts.data, max_steps=opts.max_steps, batch_size=opts.batch_size, seed=opts.seed,
                              audit=bool(opts.rows_seen or opts.loss_log))
    write_audit(rank, opts.rows_seen, opts.loss_log, rows, steps)
    end_process_group()


if __name__ == "__main__":
    main()
