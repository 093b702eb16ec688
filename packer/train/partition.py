"""Where this process stands among the readers of a dataset: its rank of the world, its DataLoader worker.

    Split(rank=1, world_size=2, worker=0, num_workers=2)    rank 1 of 2, in its worker 0 of 2

rank / world_size come from the caller when given, else from torch.distributed when it is
initialised, else 0 / 1; worker / num_workers from the worker info the caller passes (torch's
get_worker_info(): None in the main process, then 0 / 1). How a split maps to data is the dataset's own rule (PackedDataset: epoch positions
rank + world_size * (worker + num_workers * j); OnlinePackedDataset: partition rank * num_workers + worker).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Split:
    rank: int
    world_size: int
    worker: int
    num_workers: int


def check_rank(rank: int | None, world_size: int | None):
    """Reject a rank without a world size (or the reverse) and a rank outside [0, world_size)."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"pass rank and world_size together (got rank={rank}, world_size={world_size})")
    if world_size is not None and not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")


def rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size): the given ones, else torch.distributed's when initialised, else (0, 1)."""
    if world_size is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def current_split(rank: int | None, world_size: int | None, worker_info) -> Split:
    """The split of the calling process; `worker_info` is its torch get_worker_info()."""
    worker, num_workers = (worker_info.id, worker_info.num_workers) if worker_info else (0, 1)
    return Split(*rank_world(rank, world_size), worker, num_workers)
