"""Documents padded apart: where each document of a block of rows lies once every one is padded to a multiple
of K, its padding a segment of its own (context-parallel layouts; packer/train/items.py draws the item).

Rows [a a a | b b] and [c], K = 4, pad id p: [a a a p b b p p] and [c p p p]. Real tokens keep their order and
land at PaddedDocuments.destinations: [0 1 2 4 5 | 8] in the block of the two rows (8 + 4 tokens).
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from packer import masks
from packer.balance import document_lengths


def check_pad_multiple(pad_multiple, pad_to=None):
    """pad_multiple is None or a whole number >= 1, and pad_to (when both are given) a multiple of it."""
    if pad_multiple is None:
        return
    if isinstance(pad_multiple, bool) or not isinstance(pad_multiple, numbers.Integral) or pad_multiple < 1:
        raise ValueError(f"pad_multiple must be a number of tokens >= 1 (e.g. 2 x the context-parallel size; None: "
                         f"documents unpadded), got {pad_multiple!r}")
    if pad_to is not None and pad_to % pad_multiple:
        raise ValueError(f"pad_to={pad_to} is not a multiple of pad_multiple={pad_multiple}, so the padding after the "
                         f"last document could not be split like the documents; use pad_to="
                         f"{-(-pad_to // pad_multiple) * pad_multiple}")


class PaddedDocuments:
    """Each document of a block padded to a multiple of K, the padding a segment of its own.

    Rows [a a a | b b] and [c], K = 4: document lengths [3 2 | 1], padded [4 4 | 4]; the layout's
    offsets [0 3 4 6 8 | 0 1 4] (pad runs as segments). With pad_to = 12 each row's tail is one more
    entry, as long real as padded: length [3 2 4 | 1 8], padded [4 4 4 | 4 8] (`tail` marks them).
    first [0, 3, 5]: row k's entries first[k]..first[k+1].
    """

    def __init__(self, offsets, n_offsets, multiple: int):
        n_rows = len(n_offsets)
        self.length = document_lengths(offsets, n_offsets)
        self.padded = self.length + (-self.length) % multiple
        self.n_docs = n_offsets - 1
        self.row = np.repeat(np.arange(n_rows), self.n_docs)
        self.tail = np.zeros(len(self.length), bool)
        self._set_first()

    def _set_first(self):
        self.first = np.zeros(len(self.n_docs) + 1, np.int64)
        np.cumsum(self.n_docs, out=self.first[1:])
        self.first_list = self.first.tolist()

    def segment_offsets(self):
        """(offsets, their count per row, tokens per row): every document, then its padding if any, as segments."""
        n_rows = len(self.n_docs)
        pad = self.padded - self.length
        seg_len = np.stack([self.length, pad], 1).ravel()
        keep = np.ones(len(seg_len), bool)
        keep[1::2] = pad > 0
        seg_len, seg_row = seg_len[keep], np.repeat(self.row, 2)[keep]
        n_segs = np.bincount(seg_row, minlength=n_rows)
        ends = np.cumsum(seg_len)
        seg_first = np.zeros(n_rows + 1, np.int64)
        np.cumsum(n_segs, out=seg_first[1:])
        base = np.concatenate([[0], ends])[seg_first[:-1]]
        within = ends - np.repeat(base, n_segs)  # each row's segment ends, from its own 0
        offsets = np.insert(within, seg_first[:-1], 0)
        content = np.concatenate([[0], ends])[seg_first[1:]] - base
        return offsets, n_segs + 1, content

    def add_tails(self, tail_len):
        """Each row's padding up to pad_to (tail_len > 0) as one more entry, as long real as padded."""
        rows = np.flatnonzero(tail_len > 0)
        if not len(rows):
            return
        at = self.first[1:][rows]
        self.length = np.insert(self.length, at, tail_len[rows])
        self.padded = np.insert(self.padded, at, tail_len[rows])
        self.tail = np.insert(self.tail, at, True)
        self.row = np.insert(self.row, at, rows)
        self.n_docs = self.n_docs + (tail_len > 0)
        self._set_first()

    def destinations(self, steps: np.ndarray) -> np.ndarray:
        """int64, one per real token (the rows' tokens back to back): its place in the block. `steps`: an int64
        scratch array of one value per real token, overwritten."""
        starts = np.zeros(len(self.padded), np.int64)
        np.cumsum(self.padded[:-1], out=starts[1:])  # entries lie back to back over the block's rows
        real = ~self.tail
        length = self.length[real]
        read = np.zeros(len(length), np.int64)
        np.cumsum(length[:-1], out=read[1:])
        # a cumulative sum of steps: 1 a token, plus the padding before at each document's first token
        # (1.4 ms for 2M tokens in 2,500 documents against 2.0 for arange + repeat of each document's shift;
        # 2026-12-05, busy 2-core box; np.add.at: an empty document would repeat a place)
        assert len(steps) == int(length.sum())
        steps.fill(1)
        np.add.at(steps, read, np.diff(starts[real] - read, prepend=0))
        steps[0] -= 1
        dest = np.empty(len(steps), np.int64)
        torch.cumsum(torch.from_numpy(steps), 0, out=torch.from_numpy(dest))
        return dest

    def row_cumsum(self, lengths) -> np.ndarray:
        """int32, each row's [0, l0, l0 + l1, ...] back to back (row k: first[k] + k .. first[k+1] + k + 1)."""
        ends = np.cumsum(lengths)
        base = np.concatenate([[0], ends])[self.first[:-1]]
        return np.insert(ends - np.repeat(base, self.n_docs), self.first[:-1], 0).astype(np.int32)

    def max_padded(self) -> list[int]:
        """Each row's longest padded entry."""
        return np.maximum.reduceat(self.padded, self.first[:-1]).tolist()


def write_padded_tokens(input_ids, labels, tokens_list, dest: np.ndarray, pad_id: int):
    """Each row's tokens scattered to their places (`dest`: PaddedDocuments.destinations); everything else pad_id
    and -100."""
    gathered = np.concatenate(tokens_list, dtype=np.int64)
    input_ids.fill(pad_id)
    labels.fill(masks.IGNORE_INDEX)
    input_ids[dest] = gathered
    labels[dest] = gathered
