"""Online packing of lengths: one bounded buffer at a time, under-filled bins carried over (numpy only, no torch).

One buffer at context 8, pieces [5, 3, 4, 2, 6, 1] (the previous buffer's carry first):

    FFD bins     0: 6+2   1: 5+3   2: 4+1
    fill         8/8      8/8      5/8
    emit         bins 0 and 1, in a seeded shuffle
    carry        bin 2 (5 < min_fill * 8): its pieces [4, 1] open the next buffer

Which bins are carried: after packing a buffer, a bin is *under-filled* when it holds fewer than
`min_fill * context_length` tokens; the `max_carry_bins` least-filled under-filled bins (ties: the
later-opened bin first) go back into the next buffer, every other bin is emitted. So a buffer holds
at most `buffer_docs` new documents plus `max_carry_bins * context_length` carried tokens, whatever
the stream. When the stream ends, everything left is packed and emitted.

The torch dataset that runs these steps over a stream of documents is packer/train/online.py.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from packer.binpack import pack, split_documents
from packer.config import LONG_DOC_POLICIES

# 2026-11-29, 300k lognormal web-like lengths (median 300, mean 600), context 2048, 10k-doc buffer:
# 0.0053% padding against offline FFD's 0.0019% (-0.003 pp fill), at most 1 bin (2,008 tokens) carried;
# without any carry 0.024% (benchmarks/bench_online.py).
MIN_FILL = 0.99
MAX_CARRY_BINS = 32


@dataclass(frozen=True, kw_only=True)
class CarryPolicy:
    """Which bins of a packed buffer are emitted and which go back into the next buffer."""

    min_fill: float = MIN_FILL
    max_carry_bins: int = MAX_CARRY_BINS

    def __post_init__(self):
        if not 0.0 <= self.min_fill <= 1.0:
            raise ValueError(f"min_fill must be in [0, 1], got {self.min_fill}")
        if self.max_carry_bins < 0:
            raise ValueError(f"max_carry_bins must be >= 0, got {self.max_carry_bins}")


def pack_buffer(lengths, context_length: int, algorithm: str = "ffd", *, policy: CarryPolicy = CarryPolicy(),
                final: bool = False) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Pack one buffer of pieces into (emitted bins, carried bins), each bin an array of piece
    indices in input order, bins in the order FFD opened them. `final` carries nothing.

        pack_buffer([5, 3, 4, 2, 6, 1], 8)  ->  emitted [[3, 4], [0, 1]], carried [[2, 5]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return [], []
    bin_of = pack(lengths, context_length, algorithm)
    n_bins = int(bin_of.max()) + 1
    fill = np.bincount(bin_of, weights=lengths, minlength=n_bins).astype(np.int64)
    carried = np.zeros(n_bins, dtype=bool)
    if not final and policy.max_carry_bins:
        under = np.flatnonzero(fill < policy.min_fill * context_length)[::-1]  # later-opened first on ties
        carried[under[np.argsort(fill[under], kind="stable")][: policy.max_carry_bins]] = True
    by_bin = np.argsort(bin_of, kind="stable")  # grouped by bin, input order inside a bin
    groups = np.split(by_bin, np.cumsum(np.bincount(bin_of, minlength=n_bins))[:-1])
    return [g for b, g in enumerate(groups) if not carried[b]], [g for b, g in enumerate(groups) if carried[b]]


def flat_indices(groups: list[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate(groups)) if groups else np.zeros(0, np.int64)


def cut_long(lengths: np.ndarray, context_length: int, long_docs: str):
    """Pieces of documents: (piece_doc, piece_offset, piece_len) under a long-document policy."""
    if long_docs == "split":
        return split_documents(lengths, context_length)
    keep = np.flatnonzero(lengths <= context_length) if long_docs == "drop" else np.arange(len(lengths))
    return keep, np.zeros(len(keep), np.int64), np.minimum(lengths[keep], context_length)


def online_fill_rate(lengths, context_length: int, buffer_docs: int, algorithm: str = "ffd", *,
                     long_docs: str = "split", policy: CarryPolicy = CarryPolicy()) -> dict:
    """Fill rate the online packer reaches on a stream of documents with these lengths, in order.

    Lengths only, no torch: the same buffer, pack and carry steps as OnlinePackedDataset with one
    partition. `lower_bound_rows` is ceil(tokens / context), the best any packing can do.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    check_online_args(context_length, buffer_docs, long_docs)
    carry = np.zeros(0, np.int64)
    n_sequences = n_tokens = n_buffers = max_carry_bins = max_carry_tokens = 0
    for start in itertools.count(0, buffer_docs):
        new = lengths[start : start + buffer_docs]
        final = len(new) < buffer_docs  # as in the dataset: a stream that ends on a full buffer ends with a flush
        pieces = np.concatenate([carry, cut_long(new[new > 0], context_length, long_docs)[2]])
        emitted, carried = pack_buffer(pieces, context_length, algorithm, policy=policy, final=final)
        n_buffers += 1
        n_sequences += len(emitted)
        n_tokens += int(pieces[flat_indices(emitted)].sum())
        carry = pieces[flat_indices(carried)]
        max_carry_bins = max(max_carry_bins, len(carried))
        max_carry_tokens = max(max_carry_tokens, int(carry.sum()))
        if final:
            break
    fill = n_tokens / (n_sequences * context_length) if n_sequences else 1.0
    return {
        "documents": int(len(lengths)),
        "tokens": n_tokens,
        "context_length": context_length,
        "buffer_docs": buffer_docs,
        "algorithm": algorithm,
        "buffers": n_buffers,
        "sequences": n_sequences,
        "fill_rate": fill,
        "padding_share": 1 - fill,
        "lower_bound_rows": -(-n_tokens // context_length),
        "max_carry_bins": max_carry_bins,
        "max_carry_tokens": max_carry_tokens,
    }


def check_online_args(context_length: int, buffer_docs: int, long_docs: str):
    if context_length < 1:
        raise ValueError(f"context_length must be >= 1, got {context_length}")
    if buffer_docs < 1:
        raise ValueError(f"buffer_docs must be >= 1, got {buffer_docs} (try 10000)")
    if long_docs not in LONG_DOC_POLICIES:
        raise ValueError(f"long_docs must be one of {', '.join(LONG_DOC_POLICIES)}; got {long_docs!r}")
