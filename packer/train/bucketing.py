"""Length-bucketed batching: documents of similar length share a padded batch of at most `max_tokens` slots.

    lengths   [3, 9, 4, 12, 2, 10, 16]    max_tokens 32, buckets (2^(k-1), 2^k], shuffle=False
    buckets   (1, 2]: [2]   (2, 4]: [3, 4]   (8, 16]: [9, 12, 10, 16]
    batches   [2]  [3, 4]  [9, 12]  [10, 16]     each: B * max length <= 32 (2, 8, 24, 32 slots)
    padding   (2 + 8 + 24 + 32 - 56) / 66 = 15%

Inside a bucket the documents are shuffled (seed, epoch), then cut greedily into batches; the
batches are shuffled. Every document is in exactly one batch. Quantile buckets (`buckets=16`)
put the same number of documents in each bucket, which suits long-tailed lengths better.
The batch size adapts to length, so memory stays flat; the cost is the padding inside each batch.
"""

from __future__ import annotations

import numpy as np

try:  # the sampler is plain numpy; torch is only needed by the collate
    from torch.utils.data import Sampler
except ImportError:  # pragma: no cover - exercised only on a box without torch
    Sampler = object


def bucket_ids(lengths, buckets="pow2") -> np.ndarray:
    """Bucket of each length: ceil(log2(length)) for "pow2", or the quantile bucket 0..buckets-1 for an int."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if buckets == "pow2":
        return np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    if isinstance(buckets, (int, np.integer)) and not isinstance(buckets, bool) and buckets >= 1:
        edges = np.quantile(lengths, np.linspace(0, 1, buckets + 1)[1:-1]) if len(lengths) else []
        return np.searchsorted(edges, lengths, side="left").astype(np.int64)
    raise ValueError(f'buckets must be "pow2" or a number of quantile buckets >= 1; got {buckets!r}')


class BucketedBatchSampler(Sampler):
    """Batches of document indices (a DataLoader `batch_sampler`) under a padded-token budget.

        sampler = BucketedBatchSampler(lengths, max_tokens=16384, seed=0)
        loader = DataLoader(docs, batch_sampler=sampler, collate_fn=functools.partial(collate_documents, pad_id=0))

    With `rank`/`world_size` each rank takes every world_size-th batch (ranks may differ by one batch).
    """

    def __init__(self, lengths, *, max_tokens: int, buckets="pow2", seed: int = 0, shuffle: bool = True,
                 max_batch_size: int | None = None, rank: int | None = None, world_size: int | None = None):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.ndim != 1:
            raise ValueError(f"lengths must be 1-D, got shape {self.lengths.shape}")
        bad = np.flatnonzero((self.lengths < 1) | (self.lengths > max_tokens))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"document {i} has length {int(self.lengths[i])}, outside [1, max_tokens={max_tokens}]; "
                             "raise max_tokens, or truncate or drop longer documents first")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        self.max_tokens, self.seed, self.shuffle, self.max_batch_size = max_tokens, seed, shuffle, max_batch_size
        self.bucket = bucket_ids(self.lengths, buckets)
        self.rank, self.world_size = (rank, world_size) if world_size is not None else (0, 1)
        self.epoch = 0

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def batches(self) -> list[np.ndarray]:
        """All batches of this epoch (every rank's), in the order they are handed out."""
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        order = order[np.argsort(self.bucket[order], kind="stable")]  # grouped by bucket, shuffled inside
        cap = self.max_batch_size or len(order) or 1
        batches, start, longest = [], 0, 0
        lengths, bucket = self.lengths[order].tolist(), self.bucket[order].tolist()
        for k, n in enumerate(lengths):
            size = k - start
            if size and (bucket[k] != bucket[start] or (size + 1) * max(longest, n) > self.max_tokens or size == cap):
                batches.append(order[start:k])
                start, longest = k, 0
            longest = max(longest, n)
        if len(order):
            batches.append(order[start:])
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self):
        for batch in self.batches()[self.rank :: self.world_size]:
            yield batch.tolist()

    def __len__(self) -> int:
        return len(self.batches()[self.rank :: self.world_size])

    def padding_share(self) -> float:
        """Share of the padded slots (sum over batches of B * max length) that are padding."""
        slots = sum(len(b) * int(self.lengths[b].max()) for b in self.batches())
        return 1 - int(self.lengths.sum()) / slots if slots else 0.0


def collate_documents(batch, *, pad_id: int = 0) -> dict:
    """Stack one document per row (bucketed batching; `packer.data.collate_padded` stacks packed rows),
    padded to the batch's longest (T), with the loader's label and
    position semantics. Rows [a a a] and [b b] give

        input_ids       [[a, a, a], [b, b, p]]         int64 [B, T]
        labels          [[-100, a, a], [-100, b, -100]]  (-100 at the first token and on padding)
        position_ids    [[0, 1, 2], [0, 1, 0]]           (padding is its own segment)
        attention_mask  [[1, 1, 1], [1, 1, 0]]         int64 [B, T], HF convention: 1 on tokens
        max_seqlen      3

    `batch` holds token-id sequences or dicts with "input_ids".
    """
    import torch

    from packer.train.items import make_item

    docs = [np.asarray(d["input_ids"] if isinstance(d, dict) else d, dtype=np.int64).reshape(-1) for d in batch]
    width = max(len(d) for d in docs)
    items = [make_item(d, np.array([0, len(d)]), pad_to=width, pad_id=pad_id) for d in docs]
    out = {key: torch.stack([item[key] for item in items]) for key in ("input_ids", "labels", "position_ids")}
    lengths = torch.tensor([len(d) for d in docs])
    out["attention_mask"] = (torch.arange(width)[None, :] < lengths[:, None]).long()
    out["max_seqlen"] = width
    return out
