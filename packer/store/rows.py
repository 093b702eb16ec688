"""Rows in CSR form, the one shape every shard format writes from and reads back into.

A row [a a a | b b | c] has offsets [0, 3, 5, 6] and doc_ids [17, 4, 230]. Several rows
travel as CSR arrays (`Rows`):

    tokens         [a a a b b c | d d d d]        stored dtype (uint16 or uint32)
    token_starts   [0, 6, 10]                     row s = tokens[token_starts[s] : token_starts[s+1]]
    offsets        [0 3 5 6 | 0 4]                int32, each row from 0 to its length
    offset_starts  [0, 4, 6]                      row s's offsets = offsets[offset_starts[s] : ...[s+1]]
    doc_ids        [17 4 230 | 9]                 int64, one per segment: row s's are
                                                  doc_ids[offset_starts[s] - s : offset_starts[s+1] - s - 1]

Optional fields ride along, stored only when a build has them (so other builds keep their bytes):

    loss_mask      [1 1 1 0 0 1 | 1 1 0 0]        uint8, one per token (1 = trained); None: all trained
    source_ids     [0 0 1 | 2]                    uint16, one per segment like doc_ids (the build's
                                                  source of each); None: the build named no sources
    role_ids       [0 0 1 1 2 2 | 0 1 1 2]        uint8, one per token: its chat role (the manifest's
                                                  "roles" table); None: the build stored no roles

A `Layout` is a shard before its tokens are gathered (the writer's plan arithmetic); a format
writes a Layout plus its tokens (and masks), chunk by chunk, and reads back blocks of (Rows, doc_ids).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

ROWS_PER_BATCH = 4096  # rows per written chunk (and per Arrow record batch)


class Rows(NamedTuple):
    """Rows in CSR form (see the module docstring); `ds.get_many` returns one of these."""

    tokens: np.ndarray
    token_starts: np.ndarray
    offsets: np.ndarray
    offset_starts: np.ndarray
    loss_mask: np.ndarray | None = None  # uint8 per token, aligned with tokens
    source_ids: np.ndarray | None = None  # uint16 per segment, aligned with the block's doc_ids
    role_ids: np.ndarray | None = None  # uint8 per token, aligned with tokens

    def __len__(self) -> int:
        return len(self.token_starts) - 1

    def row(self, k: int):
        """(tokens, offsets) of row k."""
        t0, t1 = self.token_starts[k], self.token_starts[k + 1]
        return self.tokens[t0:t1], self.offsets[self.offset_starts[k] : self.offset_starts[k + 1]]


class Layout(NamedTuple):
    """A shard without its tokens: row bounds, offsets and doc_ids (CSR, starting at 0), and the
    optional source id of each segment. Row s's doc_ids are doc_ids[offset_starts[s] - s : offset_starts[s+1] - s - 1]."""

    token_starts: np.ndarray
    offsets: np.ndarray
    offset_starts: np.ndarray
    doc_ids: np.ndarray
    source_ids: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.token_starts) - 1


def row_chunks(n_rows: int) -> list[tuple[int, int]]:
    """(r0, r1) chunks of ROWS_PER_BATCH rows; one (0, 0) for an empty shard, so every format
    sees at least one chunk (and the token dtype)."""
    return [(r, min(r + ROWS_PER_BATCH, n_rows)) for r in range(0, max(n_rows, 1), ROWS_PER_BATCH)]


EXTRAS = ("loss_mask", "source_ids", "role_ids")  # the optional fields, in the order their files are written
PER_TOKEN = ("loss_mask", "role_ids")  # the optional fields with one uint8 per token (the others: per segment)


def extras_of(layout: Layout, loss_mask: bool, role_ids: bool = False) -> tuple[str, ...]:
    """The optional fields a shard of `layout` stores: "loss_mask" when masks were gathered,
    "source_ids" when the layout has them, "role_ids" when roles were gathered."""
    present = {"loss_mask": loss_mask, "source_ids": layout.source_ids is not None, "role_ids": role_ids}
    return tuple(name for name in EXTRAS if present[name])


def split_chunk(chunk) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A chunk from `tokens_of(r0, r1)`: the tokens, (tokens, loss_mask) or (tokens, loss_mask,
    role_ids) -> (tokens, mask or None, roles or None)."""
    if not isinstance(chunk, tuple):
        return chunk, None, None
    return (*chunk, None) if len(chunk) == 2 else chunk


def little_endian(tokens: np.ndarray) -> memoryview:
    """The bytes of `tokens` as stored on disk (little-endian), without a copy on this machine."""
    return memoryview(tokens.astype(tokens.dtype.newbyteorder("<"), copy=False)).cast("B")
