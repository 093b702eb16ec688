"""The torch side: rows -> items and batches, PackedDataset, online packing, bucketing, attention, a tiny model."""

try:  # every torch face (packer.data, .attention, .hf, .megatron, .torchtitan) comes through here first
    import torch  # noqa: F401
except ImportError as error:
    if error.name not in (None, "torch"):  # torch is there but something it needs is not: its own error says what
        raise
    raise ModuleNotFoundError(
        f"packer's loader, attention and trainer faces (packer.data, .attention, .hf, .megatron, .torchtitan) need "
        f"torch, which does not import here ({error}): pip install 'packer[torch]' (building, stats and verify need "
        "no torch)", name="torch") from None
