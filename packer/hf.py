"""The public HF transformers API: packed batches that `model(**batch)` attends per document, and the Trainer /
accelerate glue (implemented in packer/train/hf.py; docs/hf.md is the guide).

    from packer.data import PackedDataset
    from packer.hf import PackedTrainer, collate_hf, hf_dataloader
    loader = DataLoader(PackedDataset("out/sample", batch_size=8, collate_fn=collate_hf), batch_size=None)
    trainer = PackedTrainer(model=model, args=TrainingArguments("run", max_steps=100), train_dataset=PackedDataset("out/sample"))
"""

from packer.train.hf import HFBatches, PackedTrainerMixin, collate_hf, hf_batch, hf_dataloader

__all__ = ["HFBatches", "PackedTrainer", "PackedTrainerMixin", "collate_hf", "hf_batch", "hf_dataloader"]  # noqa: F822 (PackedTrainer: lazy, below)


def __getattr__(name):  # PackedTrainer imports transformers only when asked for
    if name == "PackedTrainer":
        from packer.train import hf

        return hf.PackedTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
