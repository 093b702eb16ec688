"""PackedDataset: a torch IterableDataset over a built dataset: seeded epoch order, ranks, workers, resume.

Items and batches are built by packer/train/items.py (its docstring draws them).

Epoch order, ranks and workers: position p = 0..N-1 of an epoch holds sequence perm(p), a seeded
bijection of [0, N) computed on demand (no N-sized array). Rank r owns positions r, r + W_r,
r + 2 W_r, ... (W_r = world size); its DataLoader worker w of W_w owns every W_w-th of those,
starting at its w-th. So each sequence is yielded once per epoch over all ranks and workers.
`drop_last` first cuts N to a multiple of the world size (at most world_size - 1 dropped,
different ones each epoch).

Speed: rows are read a block at a time (`ds.views`, one lookup) and built in one vectorized pass
per field into a buffer from a small pool; item tensors are views of the block's, and the
collates turn consecutive items of a block into slices of it. With `batch_size`, batches are cut
from the block directly (no items). Measured 2026-11-29 (benchmarks/bench_loader.py, sample
corpus x8, context 4096, batch 8, 2-core box), num_workers=0, share of the raw np.memmap
baseline: batches 29% (26% on a busy box), items + collate_varlen 21%, a per-item loader 2.3%.
"""

from __future__ import annotations

import dataclasses
import functools
import operator

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packer.store.dataset import open_dataset, read_rows
from packer.train.items import _block_batch, _block_items, _make_block, collate_padded, collate_varlen
from packer.train.partition import check_rank, current_split, rank_world

# Rows built per vectorized step: about this many tokens (64 rows of 4096). Measured 2026-11-29
# (busy 2-core box, context 4096, bench_loader): blocks of 8 / 32 / 64 / 128 rows gave 7 / 10 /
# 12 / 13% of the raw memmap baseline; 64 keeps a block's buffer at 6 MiB.
BLOCK_TOKENS = 2**18
ORDER_CHUNK = 8192  # epoch positions mapped to sequences per permute() call


# -- epoch order ---------------------------------------------------------------------------


_ROUNDS = 4  # Luby-Rackoff: 4 rounds of a strong round function give a strong pseudorandom permutation
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a fast, well-spread hash of uint64 values (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@functools.lru_cache(maxsize=16)
def _round_keys(seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0x5EED]).integers(0, 2**63, size=_ROUNDS, dtype=np.uint64)


def permute(positions: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """perm(positions) for a seeded bijection perm of [0, n): the epoch order, without an n-array.

    A balanced Feistel network over the smallest even bit width 2h with 2^(2h) >= n, and cycle
    walking: values that land outside [0, n) go through the network again until they fall
    inside, which keeps the map a bijection of [0, n) (at most 4x the domain, so few walks).
    """
    half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    keys = _round_keys(seed, epoch)
    x = np.asarray(positions, dtype=np.uint64).copy()
    todo = np.arange(len(x))
    with np.errstate(over="ignore"):
        while len(todo):
            left, right = x[todo] >> np.uint64(half), x[todo] & mask
            for key in keys:
                left, right = right, left ^ (_mix(right ^ key) & mask)
            x[todo] = (left << np.uint64(half)) | right
            todo = todo[x[todo] >= np.uint64(n)]
    return x.astype(np.int64)


# -- the dataset ---------------------------------------------------------------------------


class PackedDataset(IterableDataset):
    """Iterate a dataset built by `packer build` (any format `open_dataset` reads), shuffled per
    epoch, split over ranks and DataLoader workers, resumable mid-epoch.

    rank / world_size default to torch.distributed's when it is initialised, else 0 / 1.
    state_dict() / load_state_dict() follow torchdata's StatefulDataLoader: the state is that of
    the process iterating (with num_workers > 0, each worker's own copy, which StatefulDataLoader
    saves and restores per worker), and loading it makes the next iteration yield exactly the
    rest of that epoch, in the same order.

    batch_size=B makes it yield batches instead of items: `collate_fn` (collate_varlen or
    collate_padded, or any function of a list of items) of each B consecutive items of this
    process's order, the last batch of an epoch shorter. Use it with DataLoader(batch_size=None):
    the batches equal those of DataLoader(batch_size=B, collate_fn=...) over the item form, but the
    two built-in collates are cut straight from each block of rows, with no per-item tensors or
    dicts (several times faster; benchmarks/bench_loader.py). `len()` then counts batches as one
    process forms them; each DataLoader worker ends its share with its own shorter batch.
    """

    def __init__(self, path, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, pad_to: int | None = None,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False,
                 return_attention_mask: bool = False, return_document_ids: bool = False,
                 batch_size: int | None = None, collate_fn=None):
        manifest = open_dataset(path).manifest
        self.path, self.manifest = path, manifest
        self.n_sequences = int(manifest["totals"]["sequences"])
        self.context_length = int(manifest["config"]["context_length"])
        self.pad_id = int(manifest["config"].get("pad_id", 0))
        if pad_to is not None and pad_to < self.context_length:
            raise ValueError(f"pad_to={pad_to} is shorter than the dataset's context length {self.context_length} "
                             f"({path}); use pad_to >= {self.context_length}, or None")
        check_rank(rank, world_size)
        self.shuffle, self.seed, self.epoch, self.pad_to, self.drop_last = shuffle, seed, epoch, pad_to, drop_last
        self.rank, self.world_size = rank, world_size
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1 (or None to yield items)")
        if collate_fn is not None and batch_size is None:
            raise ValueError("collate_fn is used only with batch_size: pass batch_size=B too, or give collate_fn "
                             "to the DataLoader")
        self.batch_size, self.collate_fn = batch_size, collate_fn or collate_varlen
        self.return_attention_mask, self.return_document_ids = return_attention_mask, return_document_ids
        self._ds = None
        self._yielded = 0  # items this process yielded in the current epoch before the current block
        self._block_iter = None  # (iterator over the block's items or batches, their count, items, items per one)
        self._resume: dict | None = None  # a loaded state, applied by the next __iter__
        self._iter_split: dict | None = None  # the split of the iteration in progress

    def __getstate__(self):  # DataLoader workers open their own copy: memory maps do not pickle
        return {**self.__dict__, "_ds": None}

    def set_epoch(self, epoch: int):
        """Use the order of `epoch`. A state loaded for another epoch is dropped."""
        if self._resume is not None and self._resume["epoch"] != epoch:
            self._resume = None
        self.epoch = epoch

    def split(self) -> dict:
        """{rank, world_size, worker, num_workers} of the calling process (its rank, its DataLoader worker)."""
        return dataclasses.asdict(current_split(self.rank, self.world_size, get_worker_info()))

    def rank_world(self) -> tuple[int, int]:
        """(rank, world size) this dataset reads as: the given ones, else torch.distributed's, else (0, 1)."""
        return rank_world(self.rank, self.world_size)

    def rank_count(self, rank: int, world: int) -> int:
        """Sequences rank `rank` of `world` yields per epoch (over all its workers)."""
        n = self.n_sequences // world * world if self.drop_last else self.n_sequences
        return len(range(rank, n, world))

    def epoch_rows(self, split: dict) -> np.ndarray:
        """int64: the stored row index of each item `split` yields this epoch, in order."""
        positions = self._positions(split, 0)
        return permute(positions, self.n_sequences, self.seed, self.epoch) if self.shuffle else positions

    @property
    def resuming(self) -> bool:
        """True when a loaded state_dict has not been consumed by an iteration yet."""
        return self._resume is not None

    def __len__(self) -> int:
        """Sequences this rank yields per epoch (over all its workers); with batch_size, batches."""
        n = self.rank_count(*self.rank_world())
        return n if self.batch_size is None else -(-n // self.batch_size)

    def state_dict(self) -> dict:
        """{seed, shuffle, epoch, yielded, rank, world_size, worker, num_workers}: where this process
        is in the epoch (`yielded` items so far, as its split sees them)."""
        split = self._iter_split or self.split()
        yielded = self._yielded if self._resume is None else self._resume["yielded"]
        if self._resume is None and self._block_iter is not None:  # items taken from the current block
            block_iter, n_units, n_items, per_unit = self._block_iter
            yielded += min(n_items, (n_units - operator.length_hint(block_iter)) * per_unit)
        return {"seed": self.seed, "shuffle": self.shuffle, "epoch": self.epoch, "yielded": yielded, **split}

    def load_state_dict(self, state: dict):
        self.epoch = state["epoch"]
        self._resume = dict(state)

    def _check_resume(self, split: dict) -> int:
        state, self._resume = self._resume, None
        if state is None:
            return 0
        differ = [key for key, value in split.items() if state[key] != value]
        if differ:
            saved = ", ".join(f"{k}={state[k]}" for k in differ)
            here = ", ".join(f"{k}={split[k]}" for k in differ)
            raise ValueError(f"resume state was saved with {saved}; this loader has {here}: resume with the same "
                             "ranks, world size and DataLoader num_workers")
        if (state["seed"], state["shuffle"]) != (self.seed, self.shuffle):
            raise ValueError(f"resume state was saved with seed={state['seed']}, shuffle={state['shuffle']}; "
                             f"this dataset has seed={self.seed}, shuffle={self.shuffle}")
        return int(state["yielded"])

    def _positions(self, split: dict, skip: int) -> np.ndarray:
        """Epoch positions this process yields, in order, after its first `skip`."""
        rank, world, worker, n_workers = split["rank"], split["world_size"], split["worker"], split["num_workers"]
        local = np.arange(worker + n_workers * skip, self.rank_count(rank, world), n_workers, dtype=np.int64)
        return rank + world * local

    def __iter__(self):
        split = self._iter_split = self.split()
        skip = self._check_resume(split)
        if self._ds is None:
            self._ds = open_dataset(self.path)  # opened per process: memory maps do not pickle
        positions = self._positions(split, skip)
        length = self.pad_to or self.context_length
        block = max(1, BLOCK_TOKENS // length)
        if self.return_attention_mask:  # a block's dense masks within 64 MiB (4 rows of 4096)
            block = min(block, max(1, 2**26 // length**2))
        per_unit = self.batch_size or 1
        block = -(-block // per_unit) * per_unit  # whole batches in a block
        chunk = block * max(1, ORDER_CHUNK // block)  # whole blocks in a chunk
        self._yielded, self._block_iter = skip, None
        for c in range(0, len(positions), chunk):
            indices = positions[c:c + chunk]
            if self.shuffle:
                indices = permute(indices, self.n_sequences, self.seed, self.epoch)
            for b in range(0, len(indices), block):
                picked = indices[b:b + block]
                units, n_items = self._block_units(read_rows(self._ds, picked)), len(picked)
                self._block_iter = (iter(units), len(units), n_items, per_unit)
                del units  # only the iterator holds them: once it ends, the block's buffer is free for the next
                yield from self._block_iter[0]  # C-level delegation; state_dict counts what it took
                self._yielded += n_items
                self._block_iter = None

    def _block_units(self, rows) -> list:
        """What one block of rows yields: its items, or with batch_size its batches."""
        block = _make_block(*rows, self.pad_to, self.pad_id, self.return_document_ids)
        n, size = len(block.row_start_list) - 1, self.batch_size
        if size is None:
            return _block_items(block, self.return_attention_mask)
        if self.collate_fn in (collate_varlen, collate_padded) and not self.return_attention_mask:
            padded = self.collate_fn is collate_padded
            return [_block_batch(block, r, min(r + size, n), padded) for r in range(0, n, size)]
        items = _block_items(block, self.return_attention_mask)
        return [self.collate_fn(items[r:r + size]) for r in range(0, n, size)]

