"""PackedDataset: a torch IterableDataset over a built dataset, yielding training-ready items.

Each item, for a stored row of T tokens (or `pad_to` = L >= T):

    input_ids     int64 [T or L]
    labels        int64 [T or L]  input_ids with -100 at each document's first token and on padding
    position_ids  int64 [T or L]  restart at 0 for every document (and for the padding segment)
    cu_seqlens    int32 [n_docs + 1 (+1 with padding)]  flash-attn convention
    max_seqlen    int             longest segment
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packer import masks
from packer.shards import open_dataset


def _to_item(tokens: np.ndarray, offsets: np.ndarray, pad_to: int | None, pad_id: int) -> dict:
    offsets = np.asarray(offsets, dtype=np.int64)
    input_ids = np.asarray(tokens, dtype=np.int64)
    labels = masks.offsets_to_labels(input_ids, offsets)
    if pad_to is not None and pad_to > len(input_ids):
        n_pad = pad_to - len(input_ids)
        input_ids = np.concatenate([input_ids, np.full(n_pad, pad_id, np.int64)])
        labels = np.concatenate([labels, np.full(n_pad, masks.IGNORE_INDEX, np.int64)])
        offsets = np.append(offsets, pad_to)
    elif pad_to is not None and pad_to < len(input_ids):
        raise ValueError(f"pad_to={pad_to} is shorter than a stored row of {len(input_ids)} tokens")
    return {
        "input_ids": torch.from_numpy(input_ids),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(masks.offsets_to_position_ids(offsets)),
        "cu_seqlens": torch.from_numpy(offsets.astype(np.int32)),
        "max_seqlen": int(np.diff(offsets).max()),
    }


class PackedDataset(IterableDataset):
    """Iterate a dataset built by `packer build`, shuffled per epoch, split over ranks and workers."""

    def __init__(self, path, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, pad_to: int | None = None,
                 rank: int | None = None, world_size: int | None = None):
        self.path = path
        self.shuffle, self.seed, self.epoch, self.pad_to = shuffle, seed, epoch, pad_to
        self.rank, self.world_size = rank, world_size
        self._ds = None
        manifest = open_dataset(path).manifest
        self.n_sequences = manifest["totals"]["sequences"]
        self.pad_id = manifest["config"]["pad_id"]

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def _order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n_sequences)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n_sequences)

    def _shard_of_indices(self) -> np.ndarray:
        rank, world = self.rank, self.world_size
        if world is None:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
            else:
                rank, world = 0, 1
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info else (0, 1)
        return self._order()[rank::world][worker::n_workers]

    def __iter__(self):
        if self._ds is None:
            self._ds = open_dataset(self.path)  # opened per process: memory maps do not pickle
        for i in self._shard_of_indices():
            tokens, offsets = self._ds[int(i)]
            yield _to_item(tokens, offsets, self.pad_to, self.pad_id)

    def __len__(self) -> int:
        return self.n_sequences


def make_item(tokens, offsets, *, pad_to=None, pad_id=0, return_attention_mask=False, return_document_ids=False) -> dict:
    """TEMPORARY stub of the item builder another branch adds here (dropped at merge)."""
    item = _to_item(tokens, offsets, pad_to, pad_id)
    cu = item["cu_seqlens"].numpy()
    if return_attention_mask:
        item["attention_mask"] = torch.from_numpy(masks.offsets_to_block_causal_mask(cu))
    if return_document_ids:
        item["document_ids"] = torch.from_numpy(masks.offsets_to_document_ids(cu))
    return item
