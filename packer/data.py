"""PackedDataset: a torch IterableDataset over a built dataset, yielding training-ready items.

Each item, for a stored row of T tokens (or `pad_to` = L >= T):

    input_ids       int64 [L]         the row's tokens, then pad_id
    labels          int64 [L]         input_ids, -100 at each document's first token and on padding
    position_ids    int64 [L]         restart at 0 for every document (and for the padding segment)
    cu_seqlens      int32 [n_seg + 1] document boundaries (flash-attn); padding is the last segment
    max_seqlen      int               longest segment
    document_ids    int64 [L]         segment index per token; padding has its own  (opt-in)
    attention_mask  bool  [L, L]      block-causal, True = may attend; O(L^2)        (opt-in)

A row [a a a | b b] padded to 6 with pad id p:

    input_ids     [a a a b b p]       cu_seqlens [0, 3, 5, 6]
    labels        [- a a - b -]       (- = -100)
    position_ids  [0 1 2 0 1 0]       max_seqlen 3

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

import functools
import operator
import sys
import threading

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packer import masks
from packer.shards import open_dataset, read_rows

# Rows built per vectorized step: about this many tokens (64 rows of 4096). Measured 2026-11-29
# (busy 2-core box, context 4096, bench_loader): blocks of 8 / 32 / 64 / 128 rows gave 7 / 10 /
# 12 / 13% of the raw memmap baseline; 64 keeps a block's buffer at 6 MiB.
BLOCK_TOKENS = 2**18
ORDER_CHUNK = 8192  # epoch positions mapped to sequences per permute() call


# -- items ---------------------------------------------------------------------------------


def make_item(tokens, offsets, *, pad_to=None, pad_id=0, return_attention_mask=False,
              return_document_ids=False) -> dict:
    """One training item (see the module docstring) from a row's tokens and its offsets."""
    return make_items([tokens], [offsets], pad_to=pad_to, pad_id=pad_id,
                      return_attention_mask=return_attention_mask,
                      return_document_ids=return_document_ids)[0]


def make_items(tokens_list, offsets_list, *, pad_to=None, pad_id=0, return_attention_mask=False,
               return_document_ids=False) -> list[dict]:
    """`make_item` for many rows at once (row k: tokens_list[k], offsets_list[k], e.g. the views
    `ds.views(indices)` gives): one vectorized pass over all their tokens.

    The items' tensors are views into one block tensor per field (cheap to build, and
    `collate_varlen` joins consecutive items of a block without copying); clone one to keep it
    alone.
    """
    if not len(tokens_list):
        return []
    block = _make_block(tokens_list, offsets_list, pad_to, pad_id, return_document_ids)
    return _block_items(block, return_attention_mask)


def _make_block(tokens_list, offsets_list, pad_to, pad_id, return_document_ids) -> _Block:
    """The token fields of many rows, in one buffer, with their layout."""
    rows = _Layout(tokens_list, offsets_list, pad_to)
    # One pooled allocation for all token fields: fresh arrays page-faulted in again on every
    # block (12.6 ms against 1.0 ms a block of 32 rows of 4096; measured 2026-11-29).
    n_fields = 4 if return_document_ids else 3
    buffer = _POOL.take(n_fields * rows.total).reshape(n_fields, rows.total)
    input_ids, labels, position_ids = buffer[0], buffer[1], buffer[2]
    _write_tokens(input_ids, labels, tokens_list, rows, pad_id)
    labels[rows.seg_start[:-1]] = masks.IGNORE_INDEX
    _position_ids(position_ids, rows)
    fields = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
    if return_document_ids:  # 0 at each row start, +1 at each later segment start: 0 0 1 1 1 2 ...
        fields["document_ids"] = _document_ids(buffer[3], rows)
    return _Block({name: torch.from_numpy(array) for name, array in fields.items()}, rows)


def _block_items(block: _Block, return_attention_mask: bool) -> list[dict]:
    """One item per row of a block: views of its tensors."""
    rows = block.rows
    row_len = rows.row_len.tolist()
    columns = {name: torch.split_with_sizes(t, row_len) for name, t in block.fields.items()}  # views, at once
    cu_seqlens = torch.from_numpy(rows.offsets.astype(np.int32))
    columns["cu_seqlens"] = torch.split_with_sizes(cu_seqlens, rows.n_offsets.tolist())
    columns["max_seqlen"] = block.max_seqlen
    names = tuple(columns)
    items = [_Item(zip(names, values)) for values in zip(*columns.values())]
    for k, item in enumerate(items):
        item.block, item.row = block, k
    if return_attention_mask:
        bounds = rows.bounds.tolist()
        for k, item in enumerate(items):
            item["attention_mask"] = torch.from_numpy(_dense_block_causal(rows.offsets[bounds[k]:bounds[k + 1]]))
    return items


def _block_batch(block: _Block, r0: int, r1: int, padded: bool) -> dict:
    """`collate_varlen` (or with `padded`, `collate_padded`) of rows r0..r1 of a block, without
    their items: views of the block's tensors, cu_seqlens from its segment starts."""
    a, b = block.row_start_list[r0], block.row_start_list[r1]
    n_rows = r1 - r0 if padded else 1
    if padded and (lengths := block.rows.row_len[r0:r1]).min() != lengths.max():
        raise ValueError(f"collate_padded: item lengths differ ({lengths.min()}..{lengths.max()}); "
                         "set pad_to on the dataset (e.g. its context length), or use collate_varlen")
    batch = {key: _rows_view(t, a, b, n_rows) for key, t in block.fields.items() if padded or key != "document_ids"}
    s0, s1 = block.first_seg_list[r0], block.first_seg_list[r1]
    batch["cu_seqlens"] = torch.from_numpy((block.rows.seg_start[s0:s1 + 1] - a).astype(np.int32))
    batch["max_seqlen"] = max(block.max_seqlen[r0:r1])
    if "document_ids" in block.fields and not padded:  # numbered across the flattened row
        batch["document_ids"] = masks.document_ids(batch["cu_seqlens"])[None]
    return batch


class _Layout:
    """Where rows and segments lie in the flat block, padding segments included.

    Rows [a a a | b b] and [c] padded to 6: row_start [0, 6, 12], offsets [0 3 5 6 | 0 1 6]
    (bounds [0, 4, 7]), seg_start [0, 3, 5, 6, 7, 12] (the last is the end), seg_len [3 2 1 1 5],
    first_seg [0, 3, 5] (row k's segments: first_seg[k]..first_seg[k+1]).
    """

    def __init__(self, tokens_list, offsets_list, pad_to):
        n_rows = len(tokens_list)
        self.n_tokens = np.fromiter(map(len, tokens_list), np.int64, n_rows)
        if pad_to is not None and self.n_tokens.max() > pad_to:
            raise ValueError(f"pad_to={pad_to} is shorter than a row of {int(self.n_tokens.max())} tokens; "
                             "use pad_to >= the dataset's context length, or None")
        self.row_len = self.n_tokens if pad_to is None else np.full(n_rows, pad_to, np.int64)
        self.row_start = np.zeros(n_rows + 1, np.int64)
        np.cumsum(self.row_len, out=self.row_start[1:])
        self.total = int(self.row_start[-1])
        self.padded = self.n_tokens < self.row_len
        offsets = np.concatenate(offsets_list, dtype=np.int64)
        n_offsets = np.fromiter(map(len, offsets_list), np.int64, n_rows)
        self.bounds = np.zeros(n_rows + 1, np.int64)  # row k: offsets[bounds[k]:bounds[k+1]]
        np.cumsum(n_offsets, out=self.bounds[1:])
        if self.padded.any():  # a padded row gets one more boundary: its padding segment's end
            offsets = np.insert(offsets, self.bounds[1:][self.padded], self.row_len[self.padded])
            n_offsets = n_offsets + self.padded
            np.cumsum(n_offsets, out=self.bounds[1:])
        self.offsets, self.n_offsets = offsets, n_offsets
        is_start = np.ones(len(offsets), bool)
        is_start[self.bounds[1:] - 1] = False  # a row's last offset ends it, it starts nothing
        self.n_segs = n_offsets - 1
        self.seg_start = np.empty(int(self.bounds[-1]) - n_rows + 1, np.int64)
        np.add(offsets[is_start], np.repeat(self.row_start[:-1], self.n_segs), out=self.seg_start[:-1])
        self.seg_start[-1] = self.total
        self.seg_len = np.diff(self.seg_start)
        self.first_seg = np.zeros(n_rows + 1, np.int64)
        np.cumsum(self.n_segs, out=self.first_seg[1:])


def _write_tokens(input_ids, labels, tokens_list, rows: _Layout, pad_id: int):
    """Each row's tokens (as int64) into input_ids and labels; padding gets pad_id and -100.
    One np.concatenate per field gathers and widens in one pass (2x a copy then a cast)."""
    if not rows.padded.any():
        np.concatenate(tokens_list, out=input_ids)
        np.concatenate(tokens_list, out=labels)  # from the small stored dtype: less to read than input_ids
        return
    n_pad = (rows.row_len - rows.n_tokens).tolist()
    pads, ignore = np.full(max(n_pad), pad_id, np.int64), np.full(max(n_pad), masks.IGNORE_INDEX, np.int64)
    ids, labs = [], []
    for tokens, n in zip(tokens_list, n_pad):  # rows, not tokens
        ids += (tokens, pads[:n])
        labs += (tokens, ignore[:n])
    np.concatenate(ids, out=input_ids)
    np.concatenate(labs, out=labels)


_SCRATCH = threading.local()  # per thread: an int64 array of ones, restored after each use


def _ones(n: int) -> np.ndarray:
    ones = getattr(_SCRATCH, "ones", None)
    if ones is None or len(ones) < n:
        ones = _SCRATCH.ones = np.ones(-(-n // 2**16) * 2**16, np.int64)
    return ones


def _position_ids(out, rows: _Layout):
    """0, 1, 2, ... in each segment: a cumulative sum of ones with a step back at each segment
    start, taken from a kept array of ones (no fill pass over the block) into `out`."""
    steps = _ones(rows.total)
    starts = rows.seg_start[1:-1]
    try:
        steps[starts] = 1 - rows.seg_len[:-1]
        steps[0] = 0
        torch.cumsum(torch.from_numpy(steps[:rows.total]), 0, out=torch.from_numpy(out))  # 1.3x numpy's
    finally:
        steps[starts] = 1
        steps[0] = 1
    return out


def _document_ids(out, rows: _Layout):
    """0 at each row start, +1 at each later segment start: segment index within its row."""
    out.fill(0)
    steps = np.ones(len(rows.seg_len) - 1, np.int64)
    steps[rows.first_seg[1:-1] - 1] = 1 - rows.n_segs[:-1]
    out[rows.seg_start[1:-1]] = steps
    torch.cumsum(torch.from_numpy(out), 0, out=torch.from_numpy(out))
    return out


class _BufferPool:
    """Reuse the int64 buffers of blocks whose items nobody holds any more.

    A buffer is free again when the pool's own reference is the only one left: every item
    tensor of a block keeps its buffer alive through torch.from_numpy, so a buffer still seen
    anywhere (an item, a batch view, a tensor the training loop kept) is never handed out.
    """

    def __init__(self, size: int = 4):
        self.size, self.buffers, self.lock = size, [], threading.Lock()

    def take(self, n: int) -> np.ndarray:
        with self.lock:  # the view returned holds the buffer before another thread can look
            for k in range(len(self.buffers)):
                # references: the list, and getrefcount's argument
                if sys.getrefcount(self.buffers[k]) == 2 and len(self.buffers[k]) >= n:
                    return self.buffers[k][:n]
            buffer = np.empty(-(-n // 2**16) * 2**16, np.int64)  # whole 512 KiB steps: fit other sizes
            if len(self.buffers) < self.size:
                self.buffers.append(buffer)
            return buffer[:n]


_POOL = _BufferPool()


class _Block:
    """The tensors a block of items are views of, and its layout (where rows and segments start)."""

    __slots__ = ("fields", "rows", "max_seqlen", "row_start_list", "first_seg_list")

    def __init__(self, fields: dict, rows: _Layout):
        self.fields, self.rows = fields, rows
        self.max_seqlen = np.maximum.reduceat(rows.seg_len, rows.first_seg[:-1]).tolist()  # per row
        self.row_start_list, self.first_seg_list = rows.row_start.tolist(), rows.first_seg.tolist()  # plain ints


class _Item(dict):
    """An item (a plain dict to its users) that knows its block, so collating consecutive items
    of one block is a slice of the block's tensors. Pickles and copies as a plain dict."""

    __slots__ = ("block", "row")

    def __reduce__(self):
        return dict, (dict(self),)


def _block_run(items):
    """(block, first row, end row) when the items are consecutive rows of one block, else None."""
    try:  # (an _Item rebuilt by default_collate has no block; a plain dict has no slots)
        block, row = items[0].block, items[0].row
        k = row
        for item in items:
            if type(item) is not _Item or item.block is not block or item.row != k:
                return None
            k += 1
    except AttributeError:
        return None
    return block, row, k


@functools.lru_cache(maxsize=4)
def _tril(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n), bool))


def _dense_block_causal(offsets) -> np.ndarray:
    """masks.block_causal_mask, written block by block (a loop over segments): 5x less work
    than the broadcast comparison for a 4096 row of several documents."""
    length = int(offsets[-1])
    mask = np.zeros((length, length), bool)
    tril = _tril(1 << (int(np.diff(offsets).max()) - 1).bit_length())  # powers of two: few to cache
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        mask[a:b, a:b] = tril[:b - a, :b - a]
    return mask


# -- collates ------------------------------------------------------------------------------


def collate_varlen(items: list[dict]) -> dict:
    """A batch flattened to one row: what `flash_attn_varlen_func` and HF packed rows take.

    Items of T0 and T1 tokens give input_ids / labels / position_ids [1, T0 + T1],
    cu_seqlens int32 [0, ...item 0..., T0 + ...item 1...] (merged), max_seqlen the batch max,
    document_ids [1, T0 + T1] numbered across the batch. Dense masks do not flatten (the mask
    of the row would be [N, N]): items with attention_mask need `collate_padded`.
    """
    if "attention_mask" in items[0]:
        raise ValueError("collate_varlen: items carry attention_mask, whose flattened [N, N] form is "
                         "too large; use collate_padded, or masks.block_causal_mask(batch['cu_seqlens'])")
    run = _block_run(items)
    if run:  # consecutive rows of one block: slices of its tensors, no copy
        return _block_batch(*run, padded=False)
    batch = {key: _join([it[key] for it in items])[None] for key in ("input_ids", "labels", "position_ids")}
    lengths = [it["input_ids"].shape[0] for it in items]
    batch["cu_seqlens"] = _merge_cu([it["cu_seqlens"] for it in items], lengths)
    batch["max_seqlen"] = max(it["max_seqlen"] for it in items)
    if "document_ids" in items[0]:  # numbered across the flattened row: the segments of its cu_seqlens
        batch["document_ids"] = masks.document_ids(batch["cu_seqlens"])[None]
    return batch


def collate_padded(items: list[dict]) -> dict:
    """Equal-length items stacked: [B, L] fields, attention_mask [B, L, L], document_ids [B, L]
    (row-local), cu_seqlens merged with row offsets (row b's boundaries + b * L), max_seqlen the
    batch max. Items of different lengths need `pad_to` on the dataset."""
    lengths = {len(it["input_ids"]) for it in items}
    if len(lengths) > 1:
        raise ValueError(f"collate_padded: item lengths differ ({min(lengths)}..{max(lengths)}); "
                         "set pad_to on the dataset (e.g. its context length), or use collate_varlen")
    run = _block_run(items)
    batch = _block_batch(*run, padded=True) if run else {}  # consecutive rows of one block: views, no copy
    for key in items[0]:
        if key not in batch and key not in ("cu_seqlens", "max_seqlen"):
            batch[key] = _join([it[key] for it in items]).view(len(items), *items[0][key].shape)
    if not run:
        batch["cu_seqlens"] = _merge_cu([it["cu_seqlens"] for it in items], [lengths.pop()] * len(items))
        batch["max_seqlen"] = max(it["max_seqlen"] for it in items)
    return batch


def _rows_view(flat, a: int, b: int, n_rows: int):
    """flat[a:b] as [n_rows, (b - a) / n_rows]: one as_strided call (3x cheaper than indexing)."""
    width = (b - a) // n_rows
    return flat.as_strided((n_rows, width), (width, 1), flat.storage_offset() + a)


def _join(parts: list):
    """torch.cat(parts), or when the parts lie back to back in one storage (items of one
    `make_items` block, yielded in order) a view of that run: no copy."""
    first = parts[0]
    size = first.element_size()
    address, n = first.data_ptr(), 0
    for t in parts:
        if t.data_ptr() != address + n * size or not t.is_contiguous():
            return torch.cat([t.reshape(-1) for t in parts])
        n += t.numel()
    storage = first.untyped_storage()  # back to back inside first's storage <=> one storage
    if address + n * size > storage.data_ptr() + storage.nbytes():
        return torch.cat([t.reshape(-1) for t in parts])
    return first.as_strided((n,), (1,), first.storage_offset())


def _merge_cu(cus: list, lengths: list[int]):
    """Per-item cu_seqlens [0, 3, 4], [0, 2] of items of 4 and 2 tokens -> [0, 3, 4, 6]."""
    counts = [cu.shape[0] for cu in cus]
    flat = _join(cus).numpy() + np.repeat(np.cumsum([0] + lengths[:-1]), counts)  # a new array
    keep = np.ones(len(flat), bool)
    keep[np.cumsum(counts[:-1], dtype=np.int64)] = False  # each later item's leading 0 is the previous item's end
    return torch.from_numpy(flat[keep].astype(np.int32))


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
        if (rank is None) != (world_size is None):
            raise ValueError(f"pass rank and world_size together (got rank={rank}, world_size={world_size})")
        if world_size is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
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

    def _rank_world(self) -> tuple[int, int]:
        if self.world_size is not None:
            return self.rank, self.world_size
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def _split(self) -> dict:
        rank, world = self._rank_world()
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info else (0, 1)
        return {"rank": rank, "world_size": world, "worker": worker, "num_workers": n_workers}

    def _rank_count(self, rank: int, world: int) -> int:
        n = self.n_sequences // world * world if self.drop_last else self.n_sequences
        return len(range(rank, n, world))

    def __len__(self) -> int:
        """Sequences this rank yields per epoch (over all its workers); with batch_size, batches."""
        n = self._rank_count(*self._rank_world())
        return n if self.batch_size is None else -(-n // self.batch_size)

    def state_dict(self) -> dict:
        """{seed, shuffle, epoch, yielded, rank, world_size, worker, num_workers}: where this process
        is in the epoch (`yielded` items so far, as its split sees them)."""
        split = self._iter_split or self._split()
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
        local = np.arange(worker + n_workers * skip, self._rank_count(rank, world), n_workers, dtype=np.int64)
        return rank + world * local

    def __iter__(self):
        split = self._iter_split = self._split()
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


# The other two ways to feed the same loop (README: "Offline, online or bucketed?").
from packer.bucketing import BucketedBatchSampler, collate_documents  # noqa: E402
from packer.online import OnlinePackedDataset  # noqa: E402
