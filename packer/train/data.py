"""PackedDataset: a torch IterableDataset over a built dataset (or a weighted blend of several, or of one's
named sources): a seeded global epoch order, striped over ranks and workers, resumable at any world size.

Items and batches are built by packer/train/items.py (its docstring draws them).

The global order: position g = 0..N-1 of an epoch holds one stored row, from the order (train/order.py:
full shuffle, block shuffle or storage order) or the blend (train/blend.py), computed on demand for any
positions (no N-sized array). Ranks and DataLoader workers read it striped batch-major (train/partition.py
draws it): after k batches on every rank the job has read exactly positions [0, k * batch_size * world).
So the state of any one rank tells what the whole job consumed, and a job of another world size or
num_workers continues the same order from there (`load_state_dict` of the StatefulDataLoader's state).
`drop_last` first cuts N to a multiple of the world size (at most world_size - 1 dropped, different
ones each epoch).
With `balance=`, each window of steps of that order is dealt again by row cost (train/balance.py): a
bijection of each window, so all of the above holds for it too.

Speed: rows are read a block at a time (`ds.views`, one lookup) and built in one vectorized pass
per field into a buffer from a small pool; item tensors are views of the block's, and the
collates turn consecutive items of a block into slices of it. With `batch_size`, batches are cut
from the block directly (no items). Measured 2026-11-29 (benchmarks/bench_loader.py, sample
corpus x8, context 4096, batch 8, 2-core box), num_workers=0, share of the raw np.memmap
baseline: batches 29% (26% on a busy box), items + collate_varlen 21%, a per-item loader 2.3%.
"""

from __future__ import annotations

import dataclasses
import operator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packer.balance import Balance
from packer.io import fs
from packer.store.dataset import open_dataset, read_rows
from packer.store.manifest import load_manifest
from packer.train.balance import BalancedOrder, dataset_tokens_pairs
from packer.train.blend import Blend, Source
from packer.train.items import (
    _POOL,
    ItemFields,
    _block_batch,
    _block_items,
    _make_block,
    collate_padded,
    collate_varlen,
)
from packer.train.order import BlockShuffle, check_shuffle, epoch_order, permute
from packer.train.partition import (
    Progress,
    check_rank,
    current_split,
    job_consumed,
    job_progress,
    rank_items,
    rank_units,
    rank_world,
    unit_positions,
)

__all__ = ["BlockShuffle", "ItemFields", "PackedDataset", "permute"]

# Rows built per vectorized step: about this many tokens (64 rows of 4096). Measured 2026-11-29
# (busy 2-core box, context 4096, bench_loader): blocks of 8 / 32 / 64 / 128 rows gave 7 / 10 /
# 12 / 13% of the raw memmap baseline; 64 keeps a block's buffer at 6 MiB.
BLOCK_TOKENS = 2**18
ORDER_CHUNK = 8192  # epoch positions mapped to rows per step (and told to the reader's prefetch a step ahead)
BALANCE_SPAN = 2**19  # with balance=: global positions (every rank's) whose windows one chunk deals, ~20 MB of rows
_SPLIT_KEYS = ("rank", "world_size", "worker", "num_workers", "unit")


def _sources_of(manifest: dict, dataset: int, name: str) -> list[Source]:
    """A dataset's sources: manifest["sources"] (each a contiguous row range), else the whole dataset as one."""
    n = int(manifest["totals"]["sequences"])
    named = manifest.get("sources") or [{"name": name, "sequences": [0, n]}]
    out = [Source(str(s["name"]), dataset, int(s["sequences"][0]), int(s["sequences"][1])) for s in named]
    ends = [s.start for s in out[1:]] + [n]
    if out[0].start != 0 or any(s.end != e or s.start > s.end for s, e in zip(out, ends)):
        raise ValueError(f"manifest sources of {name} are not contiguous row ranges covering [0, {n}): "
                         f"{[(s.name, s.start, s.end) for s in out]}; rebuild the dataset")
    return out


def _manifest_of(ds) -> tuple[dict, str]:
    return ds.manifest, ds.generation


def _loss_masks(ds, rows) -> list | None:
    """ds.mask_views(rows) where the dataset stores loss masks (fine-tuning data), else None."""
    return ds.mask_views(rows) if getattr(ds, "has_loss_mask", False) else None


def _role_table(manifests: list[dict], paths) -> dict:
    """The one role table (name -> id) of datasets built with --store-roles; ValueError naming the fix."""
    for m, p in zip(manifests, paths):
        if not m.get("roles"):
            raise ValueError(f"ItemFields(role_ids=True), but {p} stores no role ids; build it with --input-kind chat "
                             "--store-roles (docs/role_masks.md)")
    if any(m["roles"] != manifests[0]["roles"] for m in manifests):
        raise ValueError("ItemFields(role_ids=True) over datasets with different role tables (manifest \"roles\"); "
                         "build them with the same --role-names")
    return dict(manifests[0]["roles"])


class PackedDataset(IterableDataset):
    """Iterate a dataset built by `packer build` (any format `open_dataset` reads), shuffled per
    epoch, split over ranks and DataLoader workers, resumable mid-epoch at the same or another world size.

    path: one dataset; or {name: path, ...} / [path, ...] several, blended with `weights`
    ({name: w} / [w, ...]; default: in proportion to their rows). weights={source: w} with one path blends
    the named sources of one dataset (manifest["sources"]). `num_samples` is a blend's epoch length
    (default: the sources' rows together); `source_names` names the sources, in the order of their ids.

    shuffle: True (a full seeded shuffle), "block" or BlockShuffle(block=64, window=16) (blocks of `block`
    consecutive rows in a seeded order, rows shuffled within each `window` blocks: coalesced reads from
    object stores; packer/train/order.py), False.

    fields: what each item carries beyond its five fields (ItemFields, packer/train/items.py): pad_to,
    pad_id (default: the manifest's), attention_mask, document_ids, source_ids (int64, one per token:
    the source of its row), role_ids (int64, one per token: its chat role, padding masks.PAD_ROLE; a
    dataset built with --store-roles; `roles` is then its role table (name -> id), for a
    packer.masks.RolePolicy: docs/role_masks.md).

    rank / world_size default to torch.distributed's when it is initialised, else 0 / 1.
    state_dict() / load_state_dict() follow torchdata's StatefulDataLoader: the state is that of
    the process iterating (with num_workers > 0, each worker's own copy, which StatefulDataLoader
    saves and restores per worker). load_state_dict also takes a whole StatefulDataLoader state_dict
    (every worker's state) of any one rank, saved at any world size and num_workers: the job then
    continues the same global order (docs/loading.md, "The global order").

    batch_size=B makes it yield batches instead of items: `collate_fn` (collate_varlen or
    collate_padded, or any function of a list of items) of each unit of B consecutive positions of
    this rank (the last one shorter). Use it with DataLoader(batch_size=None): with num_workers=0 the
    batches equal those of DataLoader(batch_size=B, collate_fn=...) over the item form, and with any
    num_workers they are the same batches in the same order. The two built-in collates are cut straight
    from each block of rows, with no per-item tensors or dicts (several times faster;
    benchmarks/bench_loader.py). `len()` then counts the rank's batches.

    The datasets' generations (their manifests' sha256) are pinned at construction: a DataLoader
    worker, or a later epoch's reopen, of a dataset another build replaced meanwhile raises
    "the dataset at X was replaced after this loader opened it; restart from a checkpoint" instead
    of mixing rows of two builds (docs/format.md, Block checksums).

    balance=Balance(cost=CostModel(...), rows_per_rank=R, window=32) deals each step's rows (R a rank, W
    ranks) so that every rank's step costs about the same (tokens and squared document lengths, read from
    every row's offsets at construction), and a rank's R rows to its micro-batches of batch_size rows
    (R a multiple of batch_size): each window of `window` steps of the order is dealt again inside
    itself (packer/balance.py, packer/train/balance.py; docs/loading.md, "Balancing"). Every row is
    still yielded once per epoch, the same on every rank, resumable at any world size.
    """

    def __init__(self, path, *, weights=None, num_samples: int | None = None, mix_by: str = "sequences",
                 shuffle: bool | str | BlockShuffle = True, seed: int = 0, epoch: int = 0, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False, fields: ItemFields = ItemFields(),
                 batch_size: int | None = None, collate_fn=None, balance: Balance | None = None):
        self.path = path
        names, self.paths = self._paths(path)
        # opened (so a damaged dataset fails here), but a URI's manifest alone: opening reads its indexes.
        # Each one's generation is pinned: every process opens that dataset or raises (DatasetReplaced).
        opened = [load_manifest(p) if fs.is_remote(p) else _manifest_of(open_dataset(p)) for p in self.paths]
        self.manifests, self.generations = [m for m, _ in opened], [g for _, g in opened]
        self.manifest = self.manifests[0]
        self._row_base = np.cumsum([0] + [int(m["totals"]["sequences"]) for m in self.manifests])
        self.context_length = max(int(m["config"]["context_length"]) for m in self.manifests)
        pad_to = fields.pad_to
        pad_ids = {int(m["config"].get("pad_id", 0)) for m in self.manifests}
        if len(pad_ids) > 1 and pad_to is not None and fields.pad_id is None:
            raise ValueError(f"the blended datasets pad with different ids {sorted(pad_ids)}; rebuild them with "
                             "one pad id, give ItemFields(pad_id=ID), or leave pad_to=None")
        self.pad_id = int(self.manifest["config"].get("pad_id", 0)) if fields.pad_id is None else fields.pad_id
        if pad_to is not None and pad_to < self.context_length:
            raise ValueError(f"pad_to={pad_to} is shorter than the dataset's context length {self.context_length} "
                             f"({path}); use pad_to >= {self.context_length}, or None")
        self.sources = [s for d, (m, name) in enumerate(zip(self.manifests, names)) for s in _sources_of(m, d, name)]
        self.source_names = [s.name for s in self.sources]
        self.blend = self._blend(weights, num_samples, mix_by)
        self.n_sequences = self.blend.length if self.blend else int(self._row_base[-1])
        check_rank(rank, world_size)
        self.order, sizes = check_shuffle(shuffle)
        self.shuffle = "block" if isinstance(shuffle, BlockShuffle) else shuffle  # as a state saves it
        self.shuffle_block, self.shuffle_window = sizes.block, sizes.window
        self.seed, self.epoch, self.pad_to, self.drop_last = seed, epoch, pad_to, drop_last
        self.rank, self.world_size = rank, world_size
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1 (or None to yield items)")
        if collate_fn is not None and batch_size is None:
            raise ValueError("collate_fn is used only with batch_size: pass batch_size=B too, or give collate_fn "
                             "to the DataLoader")
        self.batch_size, self.collate_fn = batch_size, collate_fn or collate_varlen
        self.fields = fields
        self.return_attention_mask, self.return_document_ids = fields.attention_mask, fields.document_ids
        self.return_source_ids = fields.source_ids
        self.return_role_ids = fields.role_ids
        self.roles = _role_table(self.manifests, self.paths) if fields.role_ids else None
        self._dss = None
        self._done = (0, 0)  # (units, items) this process yielded in the current epoch before the current block
        self._block_iter = None  # (iterator over the block's items or batches, their count, items)
        self._resume: dict | None = None  # a loaded state, applied by the next __iter__
        self._iter = None  # (split, progress, order length) of the iteration in progress
        self.balance, self._costs = balance, self._row_costs(balance)

    def _row_costs(self, balance: Balance | None) -> np.ndarray | None:
        """Every row's cost (the datasets' rows one after another), or None without balancing."""
        if balance is None:
            return None
        if not isinstance(balance, Balance):
            raise ValueError(f"balance={balance!r}: give packer.data.Balance(cost=..., rows_per_rank=..., window=...) "
                             "or None")
        if balance.rows_per_rank % self.unit:
            raise ValueError(f"Balance(rows_per_rank={balance.rows_per_rank}) is not a multiple of batch_size="
                             f"{self.batch_size}: a rank's step is whole batches (micro-batches); use rows_per_rank="
                             f"{-(-balance.rows_per_rank // self.unit) * self.unit}")
        parts = [dataset_tokens_pairs(open_dataset(p, generation=g)) for p, g in zip(self.paths, self.generations)]
        return balance.cost.costs(np.concatenate([t for t, _ in parts]), np.concatenate([q for _, q in parts]))

    def _balanced(self, progress: Progress, n: int, world: int, unit: int) -> BalancedOrder | None:
        """The balanced order of an iteration of n indices of `progress`'s remaining order, or None."""
        if self.balance is None:
            return None
        return BalancedOrder(self.balance, n, world, unit, lambda idx: self._rows_at(progress.position(idx)),
                             self._costs, self._row_base)

    def _job_progress(self, states: list[dict]) -> Progress:
        """job_progress, through the balanced order of the job that saved `states` when balancing."""
        if self.balance is None:
            return job_progress(states)
        base, done, holes = job_consumed(states)
        first = states[0]
        order = self._balanced(base, first["order_length"], first["world_size"], first["unit"])
        prefix, ranges = order.consumed_ranges(done, holes)
        return base.after(prefix, ranges)

    @staticmethod
    def _paths(path) -> tuple[list[str], list]:
        if isinstance(path, dict):
            return [str(k) for k in path], list(path.values())
        if isinstance(path, (list, tuple)):
            return [Path(str(p)).name or str(p) for p in path], list(path)
        return [Path(str(path)).name or str(path)], [path]

    def _blend(self, weights, num_samples, mix_by) -> Blend | None:
        if mix_by not in ("sequences", "tokens"):
            raise ValueError(f"mix_by={mix_by!r}: use 'sequences' or 'tokens'")
        if weights is None and len(self.paths) == 1:
            if num_samples is not None:
                raise ValueError("num_samples sets a blend's length: pass weights too")
            return None
        sizes = np.array([s.end - s.start for s in self.sources], np.float64)
        if weights is None:
            w = sizes
        elif isinstance(weights, dict):
            unknown = sorted(set(weights) - set(self.source_names))
            if unknown:
                raise ValueError(f"weights name {unknown}, not sources of {self.path}: its sources are "
                                 f"{self.source_names}")
            w = np.array([float(weights.get(name, 0.0)) for name in self.source_names])
        else:
            w = np.asarray(list(weights), np.float64)
            if len(w) != len(self.sources):
                raise ValueError(f"{len(w)} weights for {len(self.sources)} sources {self.source_names}")
        if mix_by == "tokens":  # sequence weights that give these token shares: w_s / mean row length
            w = w / np.maximum(self._mean_lengths(), 1)
        length = int(num_samples) if num_samples is not None else int(sizes.sum())
        return Blend(self.sources, w, length)

    def _mean_lengths(self) -> np.ndarray:
        out = []
        for s in self.sources:
            m = self.manifests[s.dataset]
            named = {x["name"]: x for x in m.get("sources") or []}
            tokens = named.get(s.name, {}).get("tokens")
            if tokens is None:  # the dataset's mean, where the manifest has no per-source count
                return_rows = int(m["totals"]["sequences"])
                tokens = m["totals"].get("tokens_out", 0) / max(return_rows, 1) * (s.end - s.start)
            out.append(float(tokens) / max(s.end - s.start, 1))
        return np.array(out)

    def __getstate__(self):  # DataLoader workers open their own copy: memory maps do not pickle
        return {**self.__dict__, "_dss": None}

    def set_epoch(self, epoch: int):
        """Use the order of `epoch`. A state loaded for another epoch is dropped."""
        if self._resume is not None and self._resume["epoch"] != epoch:
            self._resume = None
        if epoch != self.epoch:
            self._iter, self._done, self._block_iter = None, (0, 0), None
        self.epoch = epoch

    def split(self) -> dict:
        """{rank, world_size, worker, num_workers} of the calling process (its rank, its DataLoader worker)."""
        return dataclasses.asdict(current_split(self.rank, self.world_size, get_worker_info()))

    def rank_world(self) -> tuple[int, int]:
        """(rank, world size) this dataset reads as: the given ones, else torch.distributed's, else (0, 1)."""
        return rank_world(self.rank, self.world_size)

    @property
    def unit(self) -> int:
        return self.batch_size or 1

    def _order_length(self, n: int, world: int) -> int:
        return n // world * world if self.drop_last else n

    def rank_count(self, rank: int, world: int) -> int:
        """Sequences rank `rank` of `world` yields per epoch (over all its workers)."""
        return rank_items(self._order_length(self.n_sequences, world), self.unit, world, rank)

    def epoch_rows(self, split: dict) -> np.ndarray:
        """int64: the row index of each item `split` yields this epoch, in order (over several datasets,
        the datasets' rows counted one after another)."""
        n = self._order_length(self.n_sequences, split["world_size"])
        units = np.arange(split["worker"], rank_units(n, self.unit, split["world_size"], split["rank"]),
                          split["num_workers"])
        positions, _ = unit_positions(units, n, self.unit, split["world_size"], split["rank"])
        balanced = self._balanced(Progress(self.n_sequences), n, split["world_size"], self.unit)
        datasets, rows, _ = balanced.rows_at(positions) if balanced else self._rows_at(positions)
        return self._row_base[datasets] + rows

    @property
    def resuming(self) -> bool:
        """True when a loaded state_dict has not been consumed by an iteration yet."""
        return self._resume is not None

    def __len__(self) -> int:
        """Sequences this rank yields per epoch (over all its workers); with batch_size, batches."""
        rank, world = self.rank_world()
        n = self._order_length(self.n_sequences, world)
        return rank_items(n, 1, world, rank) if self.batch_size is None else rank_units(n, self.unit, world, rank)

    def _order_key(self) -> str:
        order = f"{self.order}:{self.shuffle_block}:{self.shuffle_window}" if self.order == "block" else self.order
        key = f"{order}:{self.blend.fingerprint() if self.blend else self.n_sequences}"
        return key if self.balance is None else f"{key}:balance:{self.balance.key()}"

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where this process is in the epoch: {seed, shuffle, epoch, yielded (items), units (items or
        batches), its split, unit, progress (what the epoch consumed before this iteration began), order
        length and order}."""
        if self._resume is not None or not self._iter:  # not started: where the next pass would begin
            split = {**self.split(), "unit": self.unit}
            progress, skip = self._resolve(split)
            length = self._order_length(len(progress), split["world_size"])
            return self._state(split, progress, length, skip, self._items_in(skip, split, length))
        split, progress, length = self._iter
        units, items = self._done
        if self._block_iter is not None:  # what was taken from the current block
            block_iter, n_units, n_items = self._block_iter
            taken = n_units - operator.length_hint(block_iter)
            units, items = units + taken, items + min(n_items, taken * self.unit)
        return self._state(split, progress, length, units, items)

    def _state(self, split, progress, length, units, items) -> dict:
        return {"seed": self.seed, "shuffle": self.shuffle, "epoch": self.epoch, "yielded": items, "units": units,
                **split, "progress": [progress.n, progress.done, [list(h) for h in progress.holes]],
                "order_length": length, "order": self._order_key()}

    def load_state_dict(self, state):
        """Resume from `state`: this process's own state_dict (resumes its own place), or a
        StatefulDataLoader state_dict, or a list of every worker's state of one rank (the job then
        continues the global order at any world size and num_workers)."""
        if isinstance(state, dict) and "_snapshot" in state:  # StatefulDataLoader with workers
            state = [w["dataset_state"] for w in state["_snapshot"]["_worker_snapshots"].values()]
        elif isinstance(state, dict) and "dataset_state" in state:  # StatefulDataLoader, num_workers=0
            state = state["dataset_state"]
        if isinstance(state, (list, tuple)):
            self._check_order(state[0])
            progress = self._job_progress(list(state))
            state = {**state[0], "progress": [progress.n, progress.done, [list(h) for h in progress.holes]],
                     "elastic": True}
        self.epoch = state["epoch"]
        self._resume = dict(state)

    def _check_order(self, state: dict):
        if (state["seed"], state["shuffle"], state.get("order")) != (self.seed, self.shuffle, self._order_key()):
            raise ValueError(f"resume state was saved with seed={state['seed']}, shuffle={state['shuffle']}, order "
                             f"{state.get('order')}; this dataset has seed={self.seed}, shuffle={self.shuffle}, "
                             f"order {self._order_key()}: a changed order (weights, num_samples, shuffle) "
                             "starts at an epoch boundary (set_epoch)")

    def _start(self, split: dict) -> tuple[Progress, int]:
        """(progress before this iteration, units of it this process already yielded) from a loaded state,
        which it consumes."""
        try:
            return self._resolve(split)
        finally:
            self._resume = None

    def _resolve(self, split: dict) -> tuple[Progress, int]:
        state = self._resume
        if state is None:
            return Progress(self.n_sequences), 0
        self._check_order(state)
        n, done, holes = state["progress"]
        progress = Progress(n, done, tuple(map(tuple, holes)))
        if state.get("elastic"):
            return progress, 0
        if all(state[k] == split[k] for k in _SPLIT_KEYS):
            return progress, int(state["units"])
        if state["num_workers"] == 1:  # the whole rank: the job's progress follows
            return self._job_progress([state]), 0
        differ = [k for k in _SPLIT_KEYS if state[k] != split[k]]
        saved = ", ".join(f"{k}={state[k]}" for k in differ)
        here = ", ".join(f"{k}={split[k]}" for k in differ)
        raise ValueError(f"resume state was saved with {saved}; this loader has {here}: one worker's state "
                         "resumes only that worker; to resume at another world size or num_workers pass every "
                         "worker's state (the StatefulDataLoader's state_dict()) to PackedDataset.load_state_dict")

    # -- the order and the rows ----------------------------------------------------------------

    def _rows_at(self, positions: np.ndarray):
        """(dataset, row in it, source) of each global position of this epoch."""
        if self.blend is not None:
            return self.blend.rows(positions, self.order, self.seed, self.epoch, self.shuffle_block,
                                   self.shuffle_window)
        rows = epoch_order(positions, self.n_sequences, self.order, self.seed, self.epoch, self.shuffle_block,
                           self.shuffle_window)
        datasets = np.zeros(len(rows), np.int64)
        if len(self.sources) == 1 or not self.return_source_ids:
            return datasets, rows, datasets
        starts = np.array([s.start for s in self.sources[1:]], np.int64)
        return datasets, rows, np.searchsorted(starts, rows, side="right")

    def _open(self):
        if self._dss is None:  # per process (memory maps do not pickle), of the generations opened first
            self._dss = [open_dataset(p, generation=g) for p, g in zip(self.paths, self.generations)]
        return self._dss

    def _read(self, datasets: np.ndarray, rows: np.ndarray) -> tuple[list, list, list | None]:
        """(token views, offset views, loss masks) of the rows; the masks are None when no dataset has one,
        and a row of a dataset without masks has None (all trained) beside masked ones.

        Several datasets: each one's rows read in one lookup, its views put back at their places:
            datasets [0 1 0 0 1]: dataset 0 reads rows at places [0 2 3], dataset 1 at [1 4]
        (a scatter by place: 20% faster than joining the parts and undoing an argsort; bench_blend)."""
        dss = self._open()
        if len(dss) == 1:
            return (*read_rows(dss[0], rows), _loss_masks(dss[0], rows))
        n = len(rows)
        tokens, offsets, masks = [None] * n, [None] * n, None
        for d, ds in enumerate(dss):
            here = np.flatnonzero(datasets == d)
            if not len(here):
                continue
            places, mine = here.tolist(), rows[here]
            for k, t, o in zip(places, *read_rows(ds, mine)):
                tokens[k], offsets[k] = t, o
            mask = _loss_masks(ds, mine)
            if mask is not None:
                masks = masks or [None] * n
                for k, m in zip(places, mask):
                    masks[k] = m
        return tokens, offsets, masks

    def _read_roles(self, datasets: np.ndarray, rows: np.ndarray) -> list | None:
        """The rows' role ids (every dataset has them: checked at init), or None unless fields.role_ids;
        put back at their places as _read does."""
        if not self.return_role_ids:
            return None
        dss = self._open()
        if len(dss) == 1:
            return dss[0].role_views(rows)
        roles = [None] * len(rows)
        for d, ds in enumerate(dss):
            here = np.flatnonzero(datasets == d)
            for k, r in zip(here.tolist(), ds.role_views(rows[here]) if len(here) else ()):
                roles[k] = r
        return roles

    def _will_read(self, datasets: np.ndarray, rows: np.ndarray, sizes, units_per_block: int, first: bool):
        """Tell readers that read ahead (a streamed store: ds.prefetch, packer/store/stream.py) the rows
        coming next, in order, after those told before (`first`: forget those), and how many of them
        each read takes (a read is `units_per_block` units of `sizes` rows, each dataset's part of it)."""
        starts = np.concatenate([[0], np.cumsum(sizes)])[:-1][::units_per_block]
        for d, ds in enumerate(self._open()):
            hint = getattr(ds, "prefetch", None)
            if hint is not None:
                mine = datasets == d if len(self._dss) > 1 else np.ones(len(rows), bool)
                calls = np.add.reduceat(mine.astype(np.int64), starts) if len(rows) else np.zeros(0, np.int64)
                hint(rows[mine], reset=first, calls=calls[calls > 0])

    def __iter__(self):
        split = {**self.split(), "unit": self.unit}
        progress, skip = self._start(split)
        world, rank = split["world_size"], split["rank"]
        n = self._order_length(len(progress), world)
        self._iter = (split, progress, n)
        length = self.pad_to or self.context_length
        block = max(1, BLOCK_TOKENS // length)
        if self.return_attention_mask:  # a block's dense masks within 64 MiB (4 rows of 4096)
            block = min(block, max(1, 2**26 // length**2))
        units_per_block = -(-block // self.unit)
        units_per_chunk = units_per_block * max(1, ORDER_CHUNK // (units_per_block * self.unit))
        units = np.arange(split["worker"] + split["num_workers"] * skip, rank_units(n, self.unit, world, rank),
                          split["num_workers"])
        self._done, self._block_iter = (skip, self._items_in(skip, split, n)), None
        balanced = self._balanced(progress, n, world, self.unit)
        if balanced is not None:  # every rank deals whole windows: a chunk spans about BALANCE_SPAN positions of all ranks
            span = units_per_block * self.unit * world
            units_per_chunk = min(units_per_chunk, units_per_block * max(1, BALANCE_SPAN // span))
        chunks = range(0, len(units), units_per_chunk)

        def chunk_rows(c):
            positions, sizes = unit_positions(units[c:c + units_per_chunk], n, self.unit, world, rank)
            if balanced is not None:
                return (*balanced.rows_at(positions), sizes)
            return (*self._rows_at(progress.position(positions)), sizes)

        ahead = chunk_rows(0) if len(chunks) else None
        if ahead is not None:
            self._will_read(ahead[0], ahead[1], ahead[3], units_per_block, first=True)
        for c in chunks:
            datasets, rows, sources, sizes = ahead
            if c + units_per_chunk < len(units):  # the next chunk's rows, told to the reader before this one is read
                ahead = chunk_rows(c + units_per_chunk)
                self._will_read(ahead[0], ahead[1], ahead[3], units_per_block, first=False)
            bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
            for b in range(0, len(sizes), units_per_block):
                lo, hi = bounds[b], bounds[min(b + units_per_block, len(sizes))]
                n_units = min(units_per_block, len(sizes) - b)
                out = self._block_units(self._read(datasets[lo:hi], rows[lo:hi]), sources[lo:hi],
                                        self._read_roles(datasets[lo:hi], rows[lo:hi]))
                self._block_iter = (iter(out), n_units, hi - lo)
                del out  # only the iterator holds them: once it ends, the block's buffer is free for the next
                yield from self._block_iter[0]  # C-level delegation; state_dict counts what it took
                self._done = (self._done[0] + n_units, self._done[1] + hi - lo)
                self._block_iter = None

    def _items_in(self, units: int, split: dict, n: int) -> int:
        """Items in this worker's first `units` units: whole units, but for the rank's short last one."""
        mine = range(split["worker"], rank_units(n, self.unit, split["world_size"], split["rank"]),
                     split["num_workers"])
        if units < len(mine) or not len(mine):
            return units * self.unit
        last = unit_positions(np.array([mine[-1]]), n, self.unit, split["world_size"], split["rank"])[1]
        return (len(mine) - 1) * self.unit + int(last[0])

    def _block_units(self, rows, sources, role_ids=None) -> list:
        """What one block of rows (tokens, offsets, loss masks; role ids) yields: its items, or with batch_size its
        batches."""
        tokens, offsets, loss_masks = rows
        block = _make_block(tokens, offsets, self.pad_to, self.pad_id, self.return_document_ids, loss_masks=loss_masks,
                            role_ids=role_ids, pad_multiple=self.fields.pad_multiple, seq_idx=self.fields.seq_idx)
        if self.return_source_ids:
            block.fields["source_ids"] = torch.from_numpy(_source_ids(sources, block.row_start_list))
        n, size = len(block.row_start_list) - 1, self.batch_size
        if size is None:
            return _block_items(block, self.return_attention_mask)
        if self.collate_fn in (collate_varlen, collate_padded) and not self.return_attention_mask:
            padded = self.collate_fn is collate_padded
            return [_block_batch(block, r, min(r + size, n), padded) for r in range(0, n, size)]
        items = _block_items(block, self.return_attention_mask)
        return [self.collate_fn(items[r:r + size]) for r in range(0, n, size)]


def _source_ids(sources: np.ndarray, row_starts: list) -> np.ndarray:
    """int64, one per token of the block: its row's source. A pooled buffer filled row by row: a fresh
    array would be page-faulted in again on every block (the same cost items.py measured). Measured
    2026-12-01 (bench_blend's blocks of 64 rows of <= 4096): 106 us a block against 84 us for a bare
    fill of the buffer (the cost is writing 8 bytes a token; np.repeat into it 227, by runs of one
    source 118)."""
    out = _POOL.take(row_starts[-1])
    for a, b, source in zip(row_starts, row_starts[1:], sources.tolist()):
        out[a:b] = source
    return out
