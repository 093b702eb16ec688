"""The public Megatron API: a packer build as Megatron-Core's dataset, each row the THD sample of Megatron-LM's
packed path, and its PackedSeqParams (implemented in packer/train/megatron.py; docs/format.md, Megatron shards).

    from packer.megatron import PackedGPTDataset, collate_thd, packed_seq_params
    train, valid, test = BlendedMegatronDatasetBuilder(PackedGPTDataset, sizes, lambda: True, GPTDatasetConfig(
        blend=(["out/web", "out/chat"], [0.7, 0.3]), split="98,2,0", sequence_length=4096, ...)).build()
    params = packed_seq_params(batch)        # PackedSeqParams(qkv_format="thd", cu_seqlens_q=..., ...)
"""

from packer.train.megatron import collate_thd, megatron_sample, packed_seq_params, sample_rows

__all__ = ["PackedGPTDataset", "collate_thd", "megatron_sample", "packed_seq_params", "sample_rows"]  # noqa: F822 (PackedGPTDataset: lazy, below)


def __getattr__(name):  # PackedGPTDataset imports megatron-core only when asked for
    if name == "PackedGPTDataset":
        from packer.train import megatron

        return megatron.PackedGPTDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
