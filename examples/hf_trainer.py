"""Train a tiny config-built Llama with transformers.Trainer on a dataset built by `packer build`: the packer.hf recipe.

    packer run pipelines/sample.toml                                   # builds out/sample
    python examples/hf_trainer.py --data out/sample --max-steps 20
    torchrun --nproc_per_node 2 examples/hf_trainer.py --data out/sample --max-steps 20   # CPU: gloo

The recipe (docs/hf.md) is the two packer lines in `train`: the train_dataset is a PackedDataset, and the trainer
is packer.hf.PackedTrainer (or PackedTrainerMixin before your own Trainer subclass). TrainingArguments hold
only what a run needs anyway; no data collator, remove_unused_columns or accelerator_config: PackedTrainer
builds the batches (collate_hf, per_device_train_batch_size rows each, the same count on every rank) and
hands accelerate a loader it does not split again.

--rows-seen FILE writes, per rank, FILE.rank{R}: the stored index of every packed row that rank trained on,
one per line, in training order. --loss-log FILE writes FILE.rank{R}: one JSON line per step, {"step",
"rows" (how many rows), "loss" (the value Trainer backpropagates on that rank: its share of the global
token-weighted loss, times the world size)}; the global loss of a step is their mean over ranks.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

from packer.data import PackedDataset
from packer.hf import PackedTrainer
from packer.store.dataset import open_dataset


def tiny_model(path, *, seed: int = 0, attn: str = "sdpa") -> LlamaForCausalLM:
    """A 2-layer Llama sized for the dataset's vocabulary and context, from a config (no download)."""
    manifest = open_dataset(path).manifest
    config = LlamaConfig(vocab_size=int(manifest["tokenizer"]["vocab_size"]), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=int(manifest["config"]["context_length"]))
    torch.manual_seed(seed)
    return LlamaForCausalLM._from_config(config, attn_implementation=attn)


class AuditedTrainer(PackedTrainer):
    """PackedTrainer that also records, per step, the rows it trained on and the loss it backpropagated."""

    return_row_ids = True  # PackedTrainerMixin asks HFBatches for "row_ids" and drops them before the model

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows_trained, self.step_log = [], []

    def compute_loss(self, model, inputs, *args, **kwargs):
        rows = inputs["row_ids"].tolist()
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.rows_trained += rows
        value = (loss[0] if isinstance(loss, tuple) else loss).item()
        self.step_log.append({"step": len(self.step_log), "rows": len(rows), "loss": value})
        return loss


def train(data, *, max_steps: int, batch_size: int = 4, seed: int = 0, output_dir=None, audit: bool = False):
    """Train for max_steps; return the trainer (its rows_trained / step_log when audit)."""
    args = TrainingArguments(output_dir=output_dir or tempfile.mkdtemp(prefix="hf-trainer-"), max_steps=max_steps,
                             per_device_train_batch_size=batch_size, learning_rate=1e-3, logging_steps=1,
                             save_strategy="no", report_to="none", seed=seed,
                             use_cpu=not torch.cuda.is_available())  # CPU ranks: gloo DDP, not separate runs
    dataset = PackedDataset(data, seed=seed)  # packer: the rows, split by rank and worker
    trainer_class = AuditedTrainer if audit else PackedTrainer  # packer: the batches and the loader
    trainer = trainer_class(model=tiny_model(data, seed=seed), args=args, train_dataset=dataset)
    trainer.train()
    return trainer


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a dataset directory written by packer build")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=4, help="packed rows per step and rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None, help="Trainer's output_dir (default: a temporary directory)")
    parser.add_argument("--rows-seen", default=None, help="write FILE.rank{R}: the rows each rank trained on")
    parser.add_argument("--loss-log", default=None, help="write FILE.rank{R}: one JSON line per step")
    opts = parser.parse_args(argv)
    trainer = train(opts.data, max_steps=opts.max_steps, batch_size=opts.batch_size, seed=opts.seed,
                    output_dir=opts.output_dir, audit=bool(opts.rows_seen or opts.loss_log))
    write_audit(trainer.args.process_index, opts.rows_seen, opts.loss_log, getattr(trainer, "rows_trained", []),
                getattr(trainer, "step_log", []))
    del trainer  # its DDP model goes first: see end_process_group
    end_process_group()


def end_process_group():
    """Close the process group torchrun opened, once the DDP model that trained in it is gone (del the trainer
    or model first; a model still alive is refused here).

    Left to interpreter exit, gloo's threads can abort a rank ("terminate called without an active exception").
    The order matters too: destroy_process_group drops the group's Python handle, whose destructor joins gloo's
    worker threads with the GIL released; a DDP model still alive holds the last reference in its Reducer, and
    the Reducer's destructor joins them with the GIL held. A worker still dropping its last collective (whose
    tensors Python made, so it needs the GIL) then waits for the GIL forever while the main thread waits for it:
    2 runs in 7 of the 2-rank Trainer example hung so on 2 cores (2026-12; py-spy: main thread in
    ProcessGroupGloo::~ProcessGroupGloo under Reducer::~Reducer, worker in gil_scoped_acquire; pytorch #56297).
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    gc.collect()  # a model that only a reference cycle keeps alive goes now, while the group is still registered
    ddp = torch.nn.parallel.DistributedDataParallel  # by type(): isinstance reads __class__, which some objects warn on
    alive = [type(o).__name__ for o in gc.get_objects() if issubclass(type(o), ddp)]
    if alive:
        raise RuntimeError(f"end_process_group: a {alive[0]} model is still alive; del the trainer (or model) first, "
                           "or its destructor joins the process group's threads holding the GIL and can hang")
    torch.distributed.barrier()  # no rank shuts its group down while another is still in a collective
    torch.distributed.destroy_process_group()


def write_audit(rank: int, rows_seen, loss_log, rows: list[int], steps: list[dict]):
    if rows_seen:
        with open(f"{rows_seen}.rank{rank}", "w") as f:
            f.writelines(f"{r}\n" for r in rows)
    if loss_log:
        with open(f"{loss_log}.rank{rank}", "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in steps)


if __name__ == "__main__":
    main()
