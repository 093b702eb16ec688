"""The public torchtitan API: packer's rows as torchtitan samples, ({"input", "positions"}, shifted labels), split by
data-parallel rank and resumable (implemented in packer/train/torchtitan.py; docs/trainers.md is the guide).

    from packer.torchtitan import PackedTitanDataset, titan_dataloader
    loader = titan_dataloader(PackedTitanDataset("out/sample", seq_len=4096, dp_rank=r, dp_world_size=w), 8)
    # in a torchtitan job config: dataloader=PackedTitanDataLoader.Config(dataset_path="out/sample")
"""

from packer.train.torchtitan import PackedTitanDataset, titan_dataloader, titan_sample

__all__ = ["PackedTitanDataLoader", "PackedTitanDataset", "titan_dataloader", "titan_sample"]  # noqa: F822 (lazy)


def __getattr__(name):  # PackedTitanDataLoader imports torchtitan only when asked for
    if name == "PackedTitanDataLoader":
        from packer.train import torchtitan

        return torchtitan.PackedTitanDataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
