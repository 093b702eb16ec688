"""Plan stage: long-document splitting, packing, seeded bin shuffle -> the plan arrays.

Everything here works on lengths only. A *piece* is a run of one document's tokens
(the whole document, or one split part); a *sequence* is one packed bin. The plan says,
for every output sequence in order, which pieces it holds:

    piece_unit[p], piece_start[p]  where the piece's tokens start in that unit's token file
    piece_len[p], piece_doc[p]     its length and its global document index
    seq_starts[s] : seq_starts[s+1]   the pieces of sequence s (CSR), in output order
    shard_starts[k] : shard_starts[k+1]   the sequences of shard k
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.binpack import pack, split_documents


@dataclass(frozen=True)
class Plan:
    piece_unit: np.ndarray
    piece_start: np.ndarray
    piece_len: np.ndarray
    piece_doc: np.ndarray
    seq_starts: np.ndarray
    shard_starts: np.ndarray
    n_truncated_tokens: int = 0
    n_dropped_docs: int = 0

    @property
    def n_sequences(self) -> int:
        return len(self.seq_starts) - 1

    @property
    def n_shards(self) -> int:
        return len(self.shard_starts) - 1

    @classmethod
    def load(cls, path) -> "Plan":
        """A whole plan (plan_bins, saved), or one shard's plan (packer/preprocess/plan_groups.py writes
        those: the same arrays for that shard alone, without the counters)."""
        with np.load(path) as z:
            fields = {k: z[k].astype(np.int64) for k in z.files}
        fields["n_truncated_tokens"] = int(fields.get("n_truncated_tokens", 0))
        fields["n_dropped_docs"] = int(fields.get("n_dropped_docs", 0))
        return cls(**fields)


def plan_bins(
    unit_lengths: list[np.ndarray],
    *,
    context_length: int,
    algorithm: str = "ffd",
    long_docs: str = "split",
    seed: int = 0,
    shard_size: int,
    pack_group: int | None = None,
) -> Plan:
    """Pack the documents of all units (given in unit order) into shuffled sequences and shards.

    pack_group=N packs each run of N consecutive documents on its own (bounded memory per
    pack, a little fill rate lost at each group's last bins); None packs all at once.
    """
    doc_lengths = np.concatenate(unit_lengths) if unit_lengths else np.zeros(0, np.int64)
    doc_unit = np.repeat(np.arange(len(unit_lengths)), [len(x) for x in unit_lengths])
    # Start of each document inside its unit's token file.
    global_start = np.cumsum(doc_lengths) - doc_lengths
    unit_tokens = np.array([int(x.sum()) for x in unit_lengths], dtype=np.int64)
    unit_base = np.cumsum(unit_tokens) - unit_tokens
    doc_start = global_start - unit_base[doc_unit]

    n_truncated = n_dropped = 0
    if long_docs == "split":
        piece_doc, piece_offset, piece_len = split_documents(doc_lengths, context_length)
    else:
        long = doc_lengths > context_length
        if long_docs == "truncate":
            n_truncated = int((doc_lengths[long] - context_length).sum())
            keep = np.arange(len(doc_lengths))
        else:
            n_dropped = int(long.sum())
            keep = np.flatnonzero(~long)
        piece_doc = keep
        piece_offset = np.zeros(len(keep), dtype=np.int64)
        piece_len = np.minimum(doc_lengths[keep], context_length)

    bins = pack_groups(piece_len, piece_doc, context_length, algorithm, pack_group)
    n_bins = int(bins.max()) + 1 if len(bins) else 0
    rng = np.random.default_rng(seed)
    position = rng.permutation(n_bins)  # output position of each bin
    order = np.argsort(position[bins], kind="stable")  # by output position, then input order
    seq_counts = np.bincount(position[bins], minlength=n_bins)
    seq_starts = np.concatenate([[0], np.cumsum(seq_counts)]).astype(np.int64)

    piece_doc = piece_doc[order]
    piece_len = piece_len[order]
    plan_piece_start = doc_start[piece_doc] + piece_offset[order]
    seq_tokens = np.add.reduceat(piece_len, seq_starts[:-1]) if n_bins else np.zeros(0, np.int64)
    shard_starts = _shard_boundaries(seq_tokens, shard_size)
    return Plan(
        piece_unit=doc_unit[piece_doc].astype(np.int64),
        piece_start=plan_piece_start.astype(np.int64),
        piece_len=piece_len.astype(np.int64),
        piece_doc=piece_doc.astype(np.int64),
        seq_starts=seq_starts,
        shard_starts=shard_starts,
        n_truncated_tokens=n_truncated,
        n_dropped_docs=n_dropped,
    )


def pack_groups(piece_len, piece_doc, capacity: int, algorithm: str, pack_group: int | None) -> np.ndarray:
    """Bin of each piece, packing the pieces of documents [0, N), [N, 2N), ... separately.

    piece_doc [0, 0, 1, 2, 3], pack_group 2  ->  groups: pieces [0, 3) | [3, 5); bin numbers
    continue across groups, so the bins of group g all come after those of group g - 1.
    piece_doc must be ascending (split_documents and the truncate/drop paths give it so).
    """
    if pack_group is None:
        return pack(piece_len, capacity, algorithm)
    n_docs = int(piece_doc[-1]) + 1 if len(piece_doc) else 0
    cuts = np.searchsorted(piece_doc, np.arange(0, n_docs + pack_group, pack_group)).tolist()
    bins = np.empty(len(piece_len), dtype=np.int64)
    n_bins = 0
    for a, b in zip(cuts[:-1], cuts[1:]):
        if a < b:
            bins[a:b] = pack(piece_len[a:b], capacity, algorithm) + n_bins
            n_bins = int(bins[a:b].max()) + 1
    return bins


def _shard_boundaries(seq_tokens: np.ndarray, shard_size: int) -> np.ndarray:
    """Greedy: a shard takes whole sequences while its token count stays <= shard_size.

    One binary search per shard on the running token count (not a loop per sequence):
    seq_tokens [5, 5, 5, 5], shard_size 12  ->  [0, 2, 4]. A sequence bigger than a
    shard gets a shard of its own.
    """
    n = len(seq_tokens)
    ends = np.cumsum(seq_tokens, dtype=np.int64)  # tokens through sequence s
    starts = [0]
    while starts[-1] < n:
        a = starts[-1]
        base = int(ends[a - 1]) if a else 0
        b = int(np.searchsorted(ends, base + shard_size, side="right"))
        starts.append(max(b, a + 1))
    return np.asarray(starts, dtype=np.int64)
