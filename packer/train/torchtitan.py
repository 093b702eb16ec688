"""torchtitan's sample convention over packer's rows: `({"input": ..., "positions": ...}, labels)`, labels already
shifted, one packed row (padded to torchtitan's seq_len) per sample, split by data-parallel rank, resumable.

A row [a a a | b b] of a build at context 5, with torchtitan's seq_len = 6 and pad id p:

    input      int64 [seq_len]   a a a b b p
    positions  int64 [seq_len]   0 1 2 0 1 0        reset at each document; the padding is a segment of its own
    labels     int64 [seq_len]   a a - b - -        labels[i] is the target of input[i] (- = -100): no target
                                                    across a document's end, none at the row's end or on padding,
                                                    none where the stored loss mask is 0 (fine-tuning data)

So labels = packer's item labels moved left by one (packer's labels[i] is the target of token i - 1), -100 last.
torchtitan (0.3 and main) builds its block-causal masks from `positions` (models/common/attention.py:
get_document_mask_mod and create_varlen_metadata_for_document start a document where positions == 0), so its
flex and varlen attention see exactly packer's documents. Never its EOS-based masks (torchtitan <= 0.2,
`get_document_mask_mod(batch, eos_id)`): a packer document may contain the EOS id, and padding may equal it.

`PackedTitanDataset` is a torch IterableDataset and a torchdata Stateful (state_dict / load_state_dict: packer's
PackedDataset state, exact mid-epoch); `titan_dataloader` wraps it in torchtitan's ParallelAwareDataloader where
torchtitan imports, else in torchdata's StatefulDataLoader; `PackedTitanDataLoader` (lazy: it subclasses
torchtitan's) is what a torchtitan job config names: `dataloader=PackedTitanDataLoader.Config(dataset_path=...)`.
docs/trainers.md is the user's page.
"""

from __future__ import annotations

import torch
from torch.utils.data import IterableDataset

from packer import masks
from packer.store.manifest import load_manifest
from packer.train.data import PackedDataset
from packer.train.items import ItemFields

_OURS = ("rank", "world_size", "fields", "batch_size", "collate_fn")


def titan_sample(item: dict) -> tuple[dict, torch.Tensor]:
    """torchtitan's (inputs, labels) of one packer item (PackedDataset's, any fields)."""
    return {"input": item["input_ids"], "positions": item["position_ids"]}, masks.next_token_labels(item["labels"])


class PackedTitanDataset(IterableDataset):
    """Samples of a packer build in torchtitan's convention (module docstring), seq_len tokens each.

    path: a dataset built by `packer build` (or several / a blend: PackedDataset's `path` and `weights`).
    seq_len: torchtitan's training.seq_len, at least the build's context length (rows are never cut: a cut
    would split a document). dp_rank / dp_world_size: this loader's data-parallel share (rows striped over
    ranks, each row once per epoch over all of them). infinite: go on with the next epoch's seeded order
    after each epoch (torchtitan's dataloaders default to that; False: stop after one). Other keyword
    arguments go to PackedDataset (seed, shuffle, weights, num_samples, drop_last, epoch).

    state_dict() / load_state_dict(): the PackedDataset's (its epoch and place in it), so a StatefulDataLoader
    (torchtitan's checkpointer saves it) resumes at the next sample, the same one the run would have had.
    """

    def __init__(self, path, *, seq_len: int, dp_rank: int = 0, dp_world_size: int = 1, infinite: bool = True,
                 **packed_kwargs):
        taken = sorted(set(packed_kwargs) & set(_OURS))
        if taken:
            raise ValueError(f"PackedTitanDataset sets {taken} itself (dp_rank, dp_world_size, seq_len); drop them")
        context_length = _context_length(path)  # manifests only, before PackedDataset's own pad_to check
        if seq_len < context_length:
            raise ValueError(f"seq_len={seq_len} is shorter than the context length {context_length} of {path!s}: "
                             "packer rows are never cut (a cut splits documents); set torchtitan's training.seq_len "
                             f">= {context_length}, or build with --context-length {seq_len}")
        self.packed = PackedDataset(path, rank=dp_rank, world_size=dp_world_size, fields=ItemFields(pad_to=seq_len),
                                    **packed_kwargs)
        if len(self.packed) == 0:
            raise ValueError(f"{path!s}: no packed row for dp_rank {dp_rank} of {dp_world_size}; use fewer data "
                             "parallel ranks or more data")
        self.seq_len, self.dp_rank, self.dp_world_size, self.infinite = seq_len, dp_rank, dp_world_size, infinite

    def __iter__(self):
        while True:
            for item in self.packed:
                yield titan_sample(item)
            if not self.infinite:
                return
            self.packed.set_epoch(self.packed.epoch + 1)

    def state_dict(self) -> dict:
        return self.packed.state_dict()

    def load_state_dict(self, state: dict):
        self.packed.load_state_dict(state)


def _context_length(path) -> int:
    """The longest context length of the build(s) `path` names (PackedDataset's forms: one, a list, a dict), from
    their manifests: what building a PackedDataset only to read it would cost (with balance=, every row's cost)
    is spent once, by the one PackedTitanDataset builds."""
    _, paths = PackedDataset._paths(path)
    return max(int(load_manifest(p)[0]["config"]["context_length"]) for p in paths)


def titan_dataloader(dataset: PackedTitanDataset, local_batch_size: int, **loader_kwargs):
    """Batches of `local_batch_size` samples, ({"input": [B, seq_len], "positions": [B, seq_len]}, labels [B, seq_len]):
    torchtitan's ParallelAwareDataloader (its state keyed by dp rank) where torchtitan imports, else torchdata's
    StatefulDataLoader. loader_kwargs: num_workers, pin_memory, snapshot_every_n_steps, ... (StatefulDataLoader's)."""
    try:
        from torchtitan.components.dataloader import ParallelAwareDataloader
    except ImportError:  # torchtitan not installed, or without its own dependencies (tyro)
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(dataset, batch_size=local_batch_size, **loader_kwargs)
    return ParallelAwareDataloader(dataset, dp_rank=dataset.dp_rank, dp_world_size=dataset.dp_world_size,
                                   batch_size=local_batch_size, **loader_kwargs)


_LOADER = None


def _titan_loader_class():
    """PackedTitanDataLoader: a torchtitan Configurable dataloader (built by the trainer with dp_rank,
    dp_world_size, seq_len, local_batch_size, tokenizer) over a packer build."""
    from dataclasses import dataclass

    from torchtitan.components.dataloader import ParallelAwareDataloader

    class PackedTitanDataLoader(ParallelAwareDataloader):
        """torchtitan dataloader over a packer build: `dataloader=PackedTitanDataLoader.Config(dataset_path=DIR)`
        in a job's Trainer.Config. The tokenizer torchtitan hands it is not used: the build is tokenized."""

        @dataclass(kw_only=True, slots=True)
        class Config(ParallelAwareDataloader.Config):
            seed: int = 0
            """packer's shuffle seed (each epoch a new seeded order)"""

            shuffle: bool = True
            """False: the rows in stored order"""

            infinite: bool = True
            """go on with the next epoch after each one"""

        def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, seq_len: int, local_batch_size: int,
                     tokenizer=None, snapshot_every_n_steps: int | None = 1, **kwargs):
            if not config.dataset_path:
                raise ValueError("PackedTitanDataLoader.Config(dataset_path=...) names no dataset: give the directory "
                                 "`packer build` wrote")
            dataset = PackedTitanDataset(config.dataset_path, seq_len=seq_len, dp_rank=dp_rank,
                                         dp_world_size=dp_world_size, infinite=config.infinite, seed=config.seed,
                                         shuffle=config.shuffle)
            loader_kwargs = {"num_workers": config.num_workers, "persistent_workers": config.persistent_workers,
                             "pin_memory": config.pin_memory, "prefetch_factor": config.prefetch_factor,
                             "snapshot_every_n_steps": snapshot_every_n_steps, "batch_size": local_batch_size}
            super().__init__(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size, **loader_kwargs)

    PackedTitanDataLoader.__module__, PackedTitanDataLoader.__qualname__ = __name__, "PackedTitanDataLoader"
    return PackedTitanDataLoader


def __getattr__(name):  # PackedTitanDataLoader imports torchtitan only when asked for
    global _LOADER
    if name != "PackedTitanDataLoader":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _LOADER is None:
        _LOADER = _titan_loader_class()
    return _LOADER
