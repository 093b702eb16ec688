"""The attention mask of one packed row as a picture of bounded size, whatever the context length.

A context of L tokens is cut into P <= MASK_PIXELS pixel bands per axis (edges e_0 = 0 < e_1 < ... <
e_P = L; one token each when L <= MASK_PIXELS). Pixel (q, k) covers queries [e_q, e_q+1) and keys
[e_k, e_k+1); it is "all" when every pair in it attends, "some" when at least one does. For the
block-causal mask (query i sees key j iff j <= i in the same document) both come from the offsets
alone, never from the L x L mask (that is L^2 bytes: 17 GB at 131,072; its int64 picture, 23 GB at
32,768, is what show-mask used to draw):

    some[q, k]  <=>  first[q] <= k <= q      first[q]: the band holding the start of the document
                                             that holds token e_q (q's first token; q inside the row)
    all[q, k]   <=>  bands q and k lie inside one document and e_k+1 - 1 <= e_q

    offsets [0, 3, 5, 6], L 8, P 4 (2 tokens a band):   some        all
                                                        1 . . .     1 . . .     (. : no pair attends;
                                                        1 1 . .     . . . .      bands 2, 3 start at or
                                                        . . . .     . . . .      past the row's end:
                                                        . . . .     . . . .      padding)

A role policy's hybrid mask (packer.masks.hybrid_mask) has windows, so it is computed exactly one
query band at a time, over the keys of the documents that band touches, KEY_CHUNK keys at a time:
memory is one band (L / P queries) by KEY_CHUNK keys, never L x L (131,072, four documents: 6.5 s,
24 MB traced, 2026-12-05).
"""

from __future__ import annotations

import numpy as np

MASK_INCHES, MASK_DPI = (8.0, 8.0), 100  # show-mask PNG: 800 x 800 pixels
MASK_PIXELS = 704  # bands per axis: about the mask axes' size in that PNG
KEY_CHUNK = 8192  # keys a role-mask band is computed against at once
MASK_AXES = (0.11, 0.1, 0.85, 0.84)  # the mask's axes in the PNG (left, bottom, width, height), legend below


def band_edges(context_length: int, pixels: int = MASK_PIXELS) -> np.ndarray:
    """int64 [P + 1]: 0 = e_0 < ... < e_P = context_length, bands as even as integers allow."""
    p = max(1, min(int(pixels), int(context_length)))
    return (np.arange(p + 1, dtype=np.int64) * int(context_length)) // p


def _doc_of(offsets: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Document index of each token position (positions past the row's end: the last document)."""
    return np.minimum(np.searchsorted(offsets, tokens, side="right") - 1, len(offsets) - 2)


def block_causal_bands(offsets, context_length: int, pixels: int = MASK_PIXELS):
    """(some_PP, all_PP bool, doc_PP int64, edges): which bands of the block-causal mask of one row
    attend somewhere / everywhere, and the document a band's pairs belong to (-1 where none)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = int(offsets[-1])
    edges = band_edges(context_length, pixels)
    starts, ends = edges[:-1], edges[1:]
    inside = starts < n  # bands that hold a token of the row
    doc_first, doc_last = _doc_of(offsets, starts), _doc_of(offsets, np.minimum(ends, n) - 1)
    first = np.searchsorted(edges, offsets[doc_first], side="right") - 1  # band of that document's start
    q = np.arange(len(starts))[:, None]
    k = np.arange(len(starts))[None, :]
    some = inside[:, None] & (k <= q) & (k >= first[:, None])
    whole = inside & (ends <= n) & (doc_first == doc_last)  # the band lies inside one document
    every = whole[:, None] & whole[None, :] & (doc_first[:, None] == doc_first[None, :]) & (ends[None, :] - 1 <= starts[:, None])
    last_key = np.minimum(np.minimum(ends[None, :], ends[:, None]), n) - 1  # a key of the pair, inside the row
    doc = np.where(some, _doc_of(offsets, np.maximum(last_key, 0)), -1)
    return some, every, doc, edges


def role_mask_bands(offsets, role_ids, policy, roles: dict, context_length: int, pixels: int = MASK_PIXELS):
    """(some_PP, all_PP bool, key_role_PP int64, edges) of the hybrid mask under a role policy; key_role:
    the role of the last attended key in the band pair (-1 where none)."""
    from packer.masks import token_key_windows

    offsets = np.asarray(offsets, dtype=np.int64)
    role_ids = np.asarray(role_ids, dtype=np.int64)
    n = int(offsets[-1])
    if len(role_ids) != n:
        raise ValueError(f"{len(role_ids)} role ids for a row of {n} tokens; give one role id per token")
    window = np.asarray(token_key_windows(role_ids, policy, roles), dtype=np.int64)
    edges = band_edges(context_length, pixels)
    p = len(edges) - 1
    some, every = np.zeros((p, p), bool), np.zeros((p, p), bool)
    role = np.full((p, p), -1, np.int64)
    key_band = np.searchsorted(edges, np.arange(n), side="right") - 1
    for q in range(p):
        a, b = int(edges[q]), min(int(edges[q + 1]), n)
        if a >= n:
            break
        lo = int(offsets[_doc_of(offsets, np.array([a]))[0]])  # keys before the band's first document: never seen
        i = np.arange(a, b)[:, None]
        query_docs = _doc_of(offsets, np.arange(a, b))[:, None]
        full_rows = b - a == edges[q + 1] - edges[q]
        k_lo, k_hi = int(key_band[lo]), int(key_band[b - 1])
        step = max(1, KEY_CHUNK // max(int(edges[1] - edges[0]), 1))  # key bands a chunk: about KEY_CHUNK keys
        for k0 in range(k_lo, k_hi + 1, step):  # whole key bands at a time: memory (L / P) x KEY_CHUNK
            ka, kb = max(int(edges[k0]), lo), min(int(edges[min(k0 + step, k_hi + 1)]), b)
            j = np.arange(ka, kb)[None, :]
            seen = (_doc_of(offsets, np.arange(ka, kb))[None, :] == query_docs) & (j <= i) & (i - j <= window[ka:kb][None, :])
            bands = key_band[ka:kb]
            first_cols = np.concatenate(([0], np.flatnonzero(np.diff(bands)) + 1))
            ks = bands[first_cols]
            widths = np.diff(np.append(first_cols, seen.shape[1]))
            every[q, ks] = np.logical_and.reduceat(seen.all(axis=0), first_cols) & full_rows & (edges[ks + 1] - edges[ks] == widths)
            columns = np.where(seen.any(axis=0), np.arange(seen.shape[1]), -1)  # key columns some query sees
            attended = np.maximum.reduceat(columns, first_cols)  # the last such column of each key band
            some[q, ks] = attended >= 0
            role[q, ks] = np.where(attended >= 0, role_ids[ka + np.maximum(attended, 0)], -1)
    return some, every, role, edges


def _draw(fig, ax, some, every, colour, colors, edges, offsets, context_length: int):
    """Paint the bands (full colour where every pair attends, paler where some do), outline the
    documents, grey the padding, and set the axes in token positions."""
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Rectangle

    palette = np.array([to_rgba(c) for c in colors], dtype=np.float32)
    image = np.ones((*some.shape, 4), np.float32)
    image[some] = palette[colour[some] % len(palette)]
    pale = some & ~every
    image[pale, :3] = 1 - 0.45 * (1 - image[pale, :3])  # some pairs only: the colour at about half strength
    n = int(offsets[-1])
    pad = edges[:-1] >= n
    image[pad, :, :3] = 0.87
    image[:, pad, :3] = 0.87
    ax.imshow(image, interpolation="nearest", extent=(0, context_length, context_length, 0))
    if len(offsets) - 1 <= 400:  # more outlines than that would hide the picture
        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
            ax.add_patch(Rectangle((a, a), b - a, b - a, fill=False, edgecolor="black", linewidth=0.6))
    if n < context_length:
        ax.text((n + context_length) / 2, (n + context_length) / 2, "padding", ha="center", va="center", fontsize=8)
    ax.set_xlim(0, context_length)
    ax.set_ylim(context_length, 0)
    ax.set_ylabel("query position")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(lambda x, _: f"{int(x):,}")


def _scale_note(edges) -> str:
    widths = np.diff(edges)
    if widths.max() == 1:
        return "one pixel per token"
    return f"one pixel per {widths.min():,}-{widths.max():,} tokens; pale: some of its pairs attend" if widths.min() != widths.max() \
        else f"one pixel per {widths.max():,} tokens; pale: some of its pairs attend"


def _length_legend(offsets, shown: int = 8) -> str:
    lengths = np.diff(np.asarray(offsets, dtype=np.int64))
    head = ", ".join(f"{int(x):,}" for x in lengths[:shown])
    more = f", ... ({len(lengths) - shown:,} more)" if len(lengths) > shown else ""
    return (f"{len(lengths):,} documents, lengths {head}{more}; longest {int(lengths.max()):,}, "
            f"shortest {int(lengths.min()):,}")


def write_mask_png(offsets, context_length: int, path, title: str = "", pixels: int = MASK_PIXELS) -> None:
    """The block-causal mask of one packed row as a MASK_INCHES x MASK_DPI PNG: query i (row) may
    see key j (column) iff j <= i in the same document; each document's triangle has its own colour
    and an outline; slots past the row's end, up to the context, are grey padding. Memory: a few
    arrays of pixels x pixels, whatever the context length."""
    from packer.stats.report import _figure

    fig = _figure(MASK_INCHES, MASK_DPI)  # first: says how to install matplotlib when it is missing
    offsets = np.asarray(offsets, dtype=np.int64)
    some, every, doc, edges = block_causal_bands(offsets, context_length, pixels)
    ax = fig.add_axes(MASK_AXES)
    _draw(fig, ax, some, every, doc, [f"C{k}" for k in range(10)], edges, offsets, context_length)
    ax.set_xlabel(f"key position ({_scale_note(edges)})")
    n = int(offsets[-1])
    fig.text(0.5, 0.015, _length_legend(offsets), ha="center", fontsize=8)
    ax.set_title(title or f"block-causal mask: {len(offsets) - 1} documents, {n} of {context_length} tokens", fontsize=10)
    fig.savefig(path, format="png")


def write_role_mask_png(offsets, role_ids, policy, roles: dict, context_length: int, path, title: str = "",
                        pixels: int = MASK_PIXELS) -> None:
    """The hybrid mask of one packed row under a role policy (packer.masks.hybrid_mask) as a PNG: a
    visible (query, key) cell is coloured by the key's role (the legend names them), documents
    outlined, padding grey as in write_mask_png."""
    from packer.stats.report import _figure

    fig = _figure(MASK_INCHES, MASK_DPI)
    from matplotlib.patches import Patch

    offsets = np.asarray(offsets, dtype=np.int64)
    role_ids = np.asarray(role_ids, dtype=np.int64)
    names = {int(i): name for name, i in roles.items()}
    shown = sorted(set(role_ids.tolist()))  # colour k for the k-th role present
    colour_of = np.zeros(max(shown, default=0) + 1, np.int64)
    colour_of[shown] = np.arange(len(shown))
    some, every, role, edges = role_mask_bands(offsets, role_ids, policy, roles, context_length, pixels)
    colors = [f"C{k % 10}" for k in range(max(len(shown), 1))]
    ax = fig.add_axes((MASK_AXES[0], MASK_AXES[1], MASK_AXES[2] - 0.16, MASK_AXES[3]))  # room for the legend
    _draw(fig, ax, some, every, np.where(role >= 0, colour_of[np.maximum(role, 0)], 0), colors, edges, offsets,
          context_length)
    ax.set_xlabel(f"key position, coloured by the key's role ({_scale_note(edges)})")
    n = int(offsets[-1])
    fig.text(0.5, 0.015, _length_legend(offsets), ha="center", fontsize=8)
    ax.set_title(title or f"hybrid mask: {len(offsets) - 1} documents, {n} of {context_length} tokens", fontsize=10)
    handles = []
    for k, r in enumerate(shown):
        name = names.get(r, f"id {r}")
        w = policy.window_of(name) if r in names else policy.window
        rule = "global" if name in policy.global_roles else ("no window" if w is None else f"window {w}")
        handles.append(Patch(color=colors[k], label=f"{name}: {rule}"))
    fig.legend(handles=handles, loc="upper right", fontsize=8, title="key role", title_fontsize=8, frameon=False)
    fig.savefig(path, format="png")


def pick_row(doc_counts) -> int:
    """The row show-mask draws by default: the first whose document count is nearest the median of
    the rows given (of those with 2 or more, where the median is 1), so the picture shows a typical
    packed row with several documents rather than whatever row 0 holds."""
    counts = np.asarray(doc_counts, dtype=np.int64)
    target = int(np.median(counts))
    if target < 2 and counts.max() >= 2:
        target = int(np.median(counts[counts >= 2]))
    return int(np.argmin(np.abs(counts - target)))  # the first row nearest the median
