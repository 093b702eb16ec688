"""Rows -> training items and batches: one vectorized builder, the collates cut straight from a block.

Each item, for a stored row of T tokens (or `pad_to` = L >= T):

    input_ids       int64 [L]         the row's tokens, then pad_id
    labels          int64 [L]         input_ids, -100 at each document's first token, on padding and
                                      on untrained tokens (a loss mask: below)
    position_ids    int64 [L]         restart at 0 for every document (and for the padding segment)
    cu_seqlens      int32 [n_seg + 1] document boundaries (flash-attn); padding is the last segment
    max_seqlen      int               longest segment
    document_ids    int64 [L]         segment index per token; padding has its own  (opt-in)
    attention_mask  bool  [L, L]      block-causal, True = may attend; O(L^2)        (opt-in)
    role_ids        int64 [L]         chat role of each token (a manifest's "roles"), padding
                                      masks.PAD_ROLE: for a role policy (packer.masks.RolePolicy)  (opt-in)
    seq_idx         int32 [L]         document_ids as int32, for Mamba-style layers         (opt-in)
    cu_seqlens_padded, n_tokens       with pad_multiple: documents padded apart (below)     (opt-in)

A row [a a a | b b] padded to 6 with pad id p:

    input_ids     [a a a b b p]       cu_seqlens [0, 3, 5, 6]
    labels        [- a a - b -]       (- = -100)
    position_ids  [0 1 2 0 1 0]       max_seqlen 3

A loss mask (uint8 [T], one per token, 1 = trained; fine-tuning data) adds -100 at every token
whose mask is 0. labels[i] is the *target* token i (the model shifts: the logits at position i - 1
predict labels[i]), so an untrained token is never predicted, yet stays an input that later
predictions see. A prompt p p and its completion c c, then a second example q | d:

    input_ids     [p p c c q d]       (two documents: offsets [0, 4, 6])
    loss_mask     [0 0 1 1 0 1]
    labels        [- - c c - d]       -100 at document starts, untrained tokens and padding

So the first completion token is trained (predicted from the last prompt token), and with an
all-ones mask the labels are exactly those without one.

Opt-in as well: `seq_idx` int32 [L], the document ids as transformers' DataCollatorWithFlattening
(return_seq_idx=True) and Mamba-style layers take them (a varlen batch numbers them across its rows).

Context-parallel layouts (pad_multiple = K): every document is padded to a multiple of K (Transformer
Engine's THD format with context parallelism needs 2 x cp_size: each rank takes two chunks of every
document), and the item follows TE's convention (PackedSeqParams(cu_seqlens_q=cu_seqlens,
cu_seqlens_q_padded=cu_seqlens_padded), as Megatron-LM passes them): tokens lie in the padded layout,
`cu_seqlens` counts each document's real tokens, `cu_seqlens_padded` says where each one lies. The row
[a a a | b b] with K = 4 and pad id p:

    input_ids          [a a a p b b p p]
    labels             [- a a - - b - -]   padding trains nothing
    position_ids       [0 1 2 0 0 1 0 1]   each document's as unpadded; each run of padding from 0
    cu_seqlens         [0, 3, 5]           int32, real tokens: 3 and 2
    cu_seqlens_padded  [0, 4, 8]           int32, where they lie: 4 and 4
    max_seqlen         4                   int, the longest padded document
    n_tokens           8                   int, len(input_ids) (PackedSeqParams' total_tokens)
    document_ids       [0 0 0 1 2 2 3 3]   each run of padding a segment of its own (seq_idx: the same)

Every real token keeps its id, label, position and the keys it attends to; a document's padding
attends only to itself (masks.padded_segments gives the layout's segments, [0, 3, 4, 6, 8], for a
kernel that takes one cu_seqlens; the dense attention_mask draws them). With pad_to (a multiple of K,
>= every row's padded length) the tail is one more sequence, as without pad_multiple, and counts in
both: padded to 12 the row above has cu_seqlens [0, 3, 5, 9], cu_seqlens_padded [0, 4, 8, 12]. With
K = 1 the tokens are today's and cu_seqlens_padded equals cu_seqlens. Batches merge both: a varlen batch's
cu_seqlens runs on by each item's real tokens, cu_seqlens_padded by its length (docs/loading.md).
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import sys
import threading

import numpy as np
import torch

from packer import masks
from packer.train.padded_documents import PaddedDocuments, check_pad_multiple, write_padded_tokens

# -- items ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class ItemFields:
    """What each item carries beyond its five fields, for PackedDataset and OnlinePackedDataset alike:

        ItemFields(pad_to=4096)                     input_ids etc. [4096], padding its own segment
        ItemFields(document_ids=True, source_ids=True)

    pad_to: pad every row to this many tokens (>= the context length; None: rows as stored). pad_id:
    the padding token (None: the dataset's, a build's manifest pad_id; online: its eos, else 0).
    attention_mask: a dense block-causal [L, L] mask (O(L^2)). document_ids: the segment index per
    token. source_ids: the source of each token's row (a built dataset with named sources).
    role_ids: the chat role of each token, padding masks.PAD_ROLE (chat datasets built with
    --store-roles; online: a chat config with store_roles), for a role policy (docs/role_masks.md).
    pad_multiple: pad every document to a multiple of this many tokens (context parallelism: 2 x cp_size;
    see "Context-parallel layouts" below); pad_to must then be a multiple of it, and at least the longest
    padded row. seq_idx: int32 `seq_idx`, the document index of each token (as transformers'
    DataCollatorWithFlattening(return_seq_idx=True) gives it; Mamba / gated-delta-net layers)."""

    pad_to: int | None = None
    pad_id: int | None = None
    attention_mask: bool = False
    document_ids: bool = False
    source_ids: bool = False
    role_ids: bool = False
    pad_multiple: int | None = None
    seq_idx: bool = False

    def __post_init__(self):
        if self.pad_to is not None and (isinstance(self.pad_to, bool) or not isinstance(self.pad_to, numbers.Integral)
                                        or self.pad_to < 1):
            raise ValueError(f"pad_to must be a number of tokens >= 1 (or None: no padding), got {self.pad_to!r}")
        if self.pad_id is not None and (isinstance(self.pad_id, bool) or not isinstance(self.pad_id, numbers.Integral)
                                        or self.pad_id < 0):
            raise ValueError(f"pad_id must be a token id >= 0 (or None: the dataset's), got {self.pad_id!r}")
        check_pad_multiple(self.pad_multiple, self.pad_to)


def make_item(tokens, offsets, *, loss_mask=None, pad_to=None, pad_id=0, return_attention_mask=False,
              return_document_ids=False, role_ids=None, pad_multiple=None, return_seq_idx=False) -> dict:
    """One training item (see the module docstring) from a row's tokens, its offsets and optionally
    its loss mask (one value per token, 0 = untrained; None = every token trained) and its role ids
    (one per token; the item then has `role_ids`). `pad_multiple`: each document padded to a multiple
    of it (the item then has cu_seqlens_padded and n_tokens; module docstring); `return_seq_idx`: seq_idx."""
    return make_items([tokens], [offsets], loss_masks=None if loss_mask is None else [loss_mask], pad_to=pad_to,
                      pad_id=pad_id, return_attention_mask=return_attention_mask,
                      return_document_ids=return_document_ids, role_ids=None if role_ids is None else [role_ids],
                      pad_multiple=pad_multiple, return_seq_idx=return_seq_idx)[0]


def make_items(tokens_list, offsets_list, *, loss_masks=None, pad_to=None, pad_id=0, return_attention_mask=False,
               return_document_ids=False, role_ids=None, pad_multiple=None, return_seq_idx=False) -> list[dict]:
    """`make_item` for many rows at once (row k: tokens_list[k], offsets_list[k], loss_masks[k],
    e.g. the views `ds.views(indices)` and `ds.mask_views(indices)` give): one vectorized pass over
    all their tokens. `loss_masks` None, or a row's entry None: every token of it trained.
    `role_ids` (one array per row, `ds.role_views(indices)`): the items carry `role_ids`.

    The items' tensors are views into one block tensor per field (cheap to build, and
    `collate_varlen` joins consecutive items of a block without copying); clone one to keep it
    alone.
    """
    if not len(tokens_list):
        return []
    check_pad_multiple(pad_multiple, pad_to)
    block = _make_block(tokens_list, offsets_list, pad_to, pad_id, return_document_ids, loss_masks=loss_masks,
                        role_ids=role_ids, pad_multiple=pad_multiple, seq_idx=return_seq_idx)
    return _block_items(block, return_attention_mask)


def _make_block(tokens_list, offsets_list, pad_to, pad_id, return_document_ids, *, loss_masks=None,
                role_ids=None, pad_multiple=None, seq_idx=False) -> _Block:
    """The token fields of many rows, in one buffer, with their layout; -100 in labels where a
    row's loss mask is 0; `role_ids` (one array per row) give the field role_ids; `pad_multiple`
    pads each document (_Layout); `seq_idx` adds the int32 field seq_idx."""
    rows = _Layout(tokens_list, offsets_list, pad_to, pad_multiple)
    # One pooled allocation for all token fields: fresh arrays page-faulted in again on every
    # block (12.6 ms against 1.0 ms a block of 32 rows of 4096; measured 2026-11-29).
    n_fields = (4 if return_document_ids else 3) + (role_ids is not None)
    buffer = _POOL.take(n_fields * rows.total).reshape(n_fields, rows.total)
    input_ids, labels, position_ids = buffer[0], buffer[1], buffer[2]
    if rows.dest is None:
        _write_tokens(input_ids, labels, tokens_list, rows, pad_id)
    else:
        write_padded_tokens(input_ids, labels, tokens_list, rows.dest, pad_id)
    labels[rows.seg_start[:-1]] = masks.IGNORE_INDEX
    if loss_masks is not None:
        _mask_labels(labels, loss_masks, rows)
    _position_ids(position_ids, rows)
    fields = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
    if return_document_ids:  # 0 at each row start, +1 at each later segment start: 0 0 1 1 1 2 ...
        fields["document_ids"] = _document_ids(buffer[3], rows)
    if role_ids is not None:
        fields["role_ids"] = _role_ids(buffer[-1], role_ids, rows)
    if seq_idx:  # the document ids as int32 (a fresh array: the pool is int64)
        doc = fields["document_ids"] if return_document_ids else _document_ids(_scratch("seq_idx", rows.total,
                                                                                          np.int64), rows)
        fields["seq_idx"] = doc.astype(np.int32)
    return _Block({name: torch.from_numpy(array) for name, array in fields.items()}, rows)


def _role_ids(out, role_ids, rows: _Layout):
    """Each row's role ids (one per token) into `out`, padding masks.PAD_ROLE: one concatenate."""
    n_roles = np.fromiter(map(len, role_ids), np.int64, len(role_ids))
    if len(role_ids) != len(rows.n_tokens) or (n_roles != rows.n_tokens).any():
        raise ValueError(f"role ids of {n_roles.tolist()[:4]} tokens for rows of {rows.n_tokens.tolist()[:4]}; "
                         "give one role id per token of each row")
    if rows.dest is not None:  # documents padded apart: scattered to their places
        out.fill(masks.PAD_ROLE)
        out[rows.dest] = np.concatenate(role_ids, dtype=np.int64)
        return out
    if not rows.padded.any():
        np.concatenate(role_ids, out=out, casting="unsafe")
        return out
    pad = np.full(int((rows.row_len - rows.n_tokens).max()), masks.PAD_ROLE, np.int64)
    parts = []
    for ids, n in zip(role_ids, (rows.row_len - rows.n_tokens).tolist()):  # rows, not tokens
        parts += (ids, pad[:n])
    np.concatenate(parts, out=out, casting="unsafe")
    return out


def _block_items(block: _Block, return_attention_mask: bool) -> list[dict]:
    """One item per row of a block: views of its tensors."""
    rows = block.rows
    row_len = rows.row_len.tolist()
    columns = {name: torch.split_with_sizes(t, row_len) for name, t in block.fields.items()}  # views, at once
    if rows.docs is None:
        cu_seqlens = torch.from_numpy(rows.offsets.astype(np.int32))
        columns["cu_seqlens"] = torch.split_with_sizes(cu_seqlens, rows.n_offsets.tolist())
    else:  # documents padded apart: real and padded boundaries, each row's from 0
        docs = rows.docs
        sizes = (docs.n_docs + 1).tolist()
        for name, lengths in (("cu_seqlens", docs.length), ("cu_seqlens_padded", docs.padded)):
            columns[name] = torch.split_with_sizes(torch.from_numpy(docs.row_cumsum(lengths)), sizes)
    columns["max_seqlen"] = block.max_seqlen
    if rows.docs is not None:
        columns["n_tokens"] = row_len
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
    batch = {key: _rows_view(t, a, b, n_rows) for key, t in block.fields.items()
             if padded or key not in ("document_ids", "seq_idx")}
    s0, s1 = block.first_seg_list[r0], block.first_seg_list[r1]
    segments = torch.from_numpy((block.rows.seg_start[s0:s1 + 1] - a).astype(np.int32))
    docs = block.rows.docs
    if docs is None:
        batch["cu_seqlens"] = segments
    else:  # the rows' documents back to back: both boundaries run on across rows
        d0, d1 = docs.first_list[r0], docs.first_list[r1]
        batch["cu_seqlens"] = torch.from_numpy(_cumsum0(docs.length[d0:d1]))
        batch["cu_seqlens_padded"] = torch.from_numpy(_cumsum0(docs.padded[d0:d1]))
    batch["max_seqlen"] = max(block.max_seqlen[r0:r1])
    if docs is not None:
        batch["n_tokens"] = b - a
    if not padded:  # numbered across the flattened row: the segments of its layout
        _number_documents(batch, segments, "document_ids" in block.fields, "seq_idx" in block.fields)
    return batch


def _cumsum0(lengths) -> np.ndarray:
    """int32 [0, l0, l0 + l1, ...]."""
    out = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=out[1:])
    return out


class _Layout:
    """Where rows and segments lie in the flat block, padding segments included.

    Rows [a a a | b b] and [c] padded to 6: row_start [0, 6, 12], offsets [0 3 5 6 | 0 1 6]
    (bounds [0, 4, 7]), seg_start [0, 3, 5, 6, 7, 12] (the last is the end), seg_len [3 2 1 1 5],
    first_seg [0, 3, 5] (row k's segments: first_seg[k]..first_seg[k+1]).

    With pad_multiple each document's padding is a segment of its own (`docs`: PaddedDocuments), and
    `dest` says where each real token lies in the block (None: no document padded, the rows' tokens
    back to back as without pad_multiple).
    """

    def __init__(self, tokens_list, offsets_list, pad_to, pad_multiple=None):
        n_rows = len(tokens_list)
        self.n_tokens = np.fromiter(map(len, tokens_list), np.int64, n_rows)
        offsets = np.concatenate(offsets_list, dtype=np.int64)
        n_offsets = np.fromiter(map(len, offsets_list), np.int64, n_rows)
        self.docs, self.dest = None, None
        content = self.n_tokens  # tokens of each row before pad_to
        if pad_multiple is not None:
            self.docs = PaddedDocuments(offsets, n_offsets, pad_multiple)
            offsets, n_offsets, content = self.docs.segment_offsets()
        if pad_to is not None and content.max() > pad_to:
            what = "tokens" if pad_multiple is None else f"tokens with its documents padded to multiples of {pad_multiple}"
            raise ValueError(f"pad_to={pad_to} is shorter than a row of {int(content.max())} {what}; "
                             "use pad_to >= the dataset's context length" +
                             (" plus the padding (or None)" if pad_multiple is not None else ", or None"))
        self.row_len = content if pad_to is None else np.full(n_rows, pad_to, np.int64)
        self.row_start = np.zeros(n_rows + 1, np.int64)
        np.cumsum(self.row_len, out=self.row_start[1:])
        self.total = int(self.row_start[-1])
        self.padded = content < self.row_len
        self.bounds = np.zeros(n_rows + 1, np.int64)  # row k: offsets[bounds[k]:bounds[k+1]]
        np.cumsum(n_offsets, out=self.bounds[1:])
        if self.docs is not None:
            gaps = bool((self.docs.padded > self.docs.length).any())  # else the tokens lie as without pad_multiple
            self.docs.add_tails(self.row_len - content)
            self.dest = self.docs.destinations(_scratch("dest", int(self.n_tokens.sum()), np.int64)) if gaps else None
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
    Unpadded: the rows gathered once in their stored dtype into a kept scratch array, then widened
    into each field by one contiguous cast. Measured 2026-12-03 (64-row blocks of ~4096 uint16
    tokens, busy 2-core box): 2.8 ms a 6M-token pass against 3.5 for a widening np.concatenate per
    field (numpy casts a list's parts chunk by chunk through a buffer; one cast of one array does not)."""
    if not rows.padded.any():
        dtype = tokens_list[0].dtype
        gathered = np.concatenate(tokens_list, out=_scratch(f"gathered_{dtype.str}", rows.total, dtype))
        np.copyto(input_ids, gathered)
        np.copyto(labels, gathered)
        return
    n_pad = (rows.row_len - rows.n_tokens).tolist()
    pads, ignore = np.full(max(n_pad), pad_id, np.int64), np.full(max(n_pad), masks.IGNORE_INDEX, np.int64)
    ids, labs = [], []
    for tokens, n in zip(tokens_list, n_pad):  # rows, not tokens
        ids += (tokens, pads[:n])
        labs += (tokens, ignore[:n])
    np.concatenate(ids, out=input_ids)
    np.concatenate(labs, out=labels)


def _mask_labels(labels, loss_masks, rows: _Layout):
    """-100 in labels wherever a row's loss mask is 0. The masks are gathered into one flat uint8
    array in block layout (padding and rows without a mask count as trained: padding labels are
    -100 already), inverted into a bool array, then one masked write: three passes over the block,
    none in Python per token. 64 rows of 4096 with prompt-like runs: 0.15 ms on top of the block's
    0.4 ms (gather 0.01, invert 0.01, masked write 0.08; busy 2-core box, 2026-12-01)."""
    n_rows = len(rows.n_tokens)
    if len(loss_masks) != n_rows:
        raise ValueError(f"{len(loss_masks)} loss masks for {n_rows} rows; give one per row (None: all trained)")
    complete = not any(mask is None for mask in loss_masks)
    n_mask = np.fromiter(map(len, loss_masks), np.int64, n_rows) if complete else \
        np.array([n if mask is None else len(mask) for mask, n in zip(loss_masks, rows.n_tokens.tolist())], np.int64)
    if (n_mask != rows.n_tokens).any():
        k = int(np.flatnonzero(n_mask != rows.n_tokens)[0])
        raise ValueError(f"row {k}: a loss mask of {n_mask[k]} values for a row of {rows.n_tokens[k]} tokens; give "
                         "one 0/1 value per token (or None for an all-trained row)")
    if rows.dest is not None:  # documents padded apart: the untrained tokens' places
        ones = _scratch("ones_u8", int(rows.n_tokens.max()), np.uint8, fill=1)
        trained = np.concatenate([ones[:n] if mask is None else mask for mask, n in
                                  zip(loss_masks, rows.n_tokens.tolist())], dtype=np.uint8, casting="unsafe")
        labels[rows.dest[trained == 0]] = masks.IGNORE_INDEX
        return
    trained = _scratch("trained", rows.total, np.uint8)
    if complete and not rows.padded.any():  # the stored case: the masks back to back
        np.concatenate(loss_masks, out=trained, casting="unsafe")
    else:
        ones = _scratch("ones_u8", int(rows.row_len.max()), np.uint8, fill=1)  # only read: shared by the parts
        parts = []
        for mask, n, pad in zip(loss_masks, rows.n_tokens.tolist(), (rows.row_len - rows.n_tokens).tolist()):
            parts += (ones[:n] if mask is None else mask, ones[:pad])  # rows, not tokens
        np.concatenate(parts, out=trained, casting="unsafe")
    untrained = np.logical_not(trained, out=_scratch("untrained", rows.total, bool))
    np.copyto(labels, masks.IGNORE_INDEX, where=untrained)


def _scratch(name: str, n: int, dtype, fill=None) -> np.ndarray:
    """A per-thread array of at least n values, kept between calls (grown in 64 Ki steps); `fill`
    sets every value when it is made (for arrays only ever read)."""
    array = getattr(_SCRATCH, name, None)
    if array is None or len(array) < n:
        array = np.empty(-(-n // 2**16) * 2**16, dtype) if fill is None else np.full(-(-n // 2**16) * 2**16, fill, dtype)
        setattr(_SCRATCH, name, array)
    return array[:n]


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
        self.max_seqlen = np.maximum.reduceat(rows.seg_len, rows.first_seg[:-1]).tolist() if rows.docs is None \
            else rows.docs.max_padded()  # per row
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
    keys = ("input_ids", "labels", "position_ids") + tuple(k for k in ("source_ids", "role_ids") if k in items[0])
    batch = {key: _join([it[key] for it in items])[None] for key in keys}
    lengths = [it["input_ids"].shape[0] for it in items]
    _merge_boundaries(batch, items, lengths)
    if "document_ids" in items[0] or "seq_idx" in items[0]:  # numbered across the flattened row: its segments
        segments = batch["cu_seqlens"] if "cu_seqlens_padded" not in batch else \
            masks.padded_segments(batch["cu_seqlens"], batch["cu_seqlens_padded"])
        _number_documents(batch, segments, "document_ids" in items[0], "seq_idx" in items[0])
    return batch


def _number_documents(batch: dict, segments, document_ids: bool, seq_idx: bool):
    """The flattened row's document index per token, numbered once for either field asked for."""
    if not (document_ids or seq_idx):
        return
    doc = masks.document_ids(segments)
    if document_ids:
        batch["document_ids"] = doc[None]
    if seq_idx:
        batch["seq_idx"] = doc.to(torch.int32)[None]


def _merge_boundaries(batch: dict, items: list[dict], lengths: list[int]):
    """cu_seqlens, max_seqlen (and with padded documents cu_seqlens_padded, n_tokens) of items laid end to end."""
    if "cu_seqlens_padded" not in items[0]:
        batch["cu_seqlens"] = _merge_cu([it["cu_seqlens"] for it in items], lengths)
    else:  # real boundaries run on by each item's real tokens, padded ones by its length
        batch["cu_seqlens"] = _merge_cu([it["cu_seqlens"] for it in items],
                                        [int(it["cu_seqlens"][-1]) for it in items])
        batch["cu_seqlens_padded"] = _merge_cu([it["cu_seqlens_padded"] for it in items], lengths)
        batch["n_tokens"] = sum(lengths)
    batch["max_seqlen"] = max(it["max_seqlen"] for it in items)


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
        if key not in batch and key not in ("cu_seqlens", "cu_seqlens_padded", "max_seqlen", "n_tokens"):
            batch[key] = _join([it[key] for it in items]).view(len(items), *items[0][key].shape)
    if not run:
        _merge_boundaries(batch, items, [lengths.pop()] * len(items))
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
