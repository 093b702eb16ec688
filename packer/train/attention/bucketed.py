"""The fast exact CPU backend: documents grouped by length, one batched causal SDPA per group.

Documents are sorted by length and cut into groups whose lengths are within a factor of each
other; each group is gathered into a right-padded [B, H, L, D] batch and run through one causal
SDPA call. With right padding and a causal mask no real query ever sees a padding key, so no
extra mask is needed and the result is exact; padding queries attend to at least themselves, so
no row is ever fully masked (no NaN). Lengths [300, 280, 40, 9, 0] give the groups [[0, 1], [2, 3]]
(300 and 280 are within 0.75 of 300; 40 and 9 are both <= SMALL), the empty segment in none.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from packer.train.attention.sdpa import repeat_kv, visible

# Lengths in one bucket are within this factor of its longest (padding costs at most 1/0.75^2 in
# score FLOPs); documents at most SMALL long share one bucket whatever their ratio, since a call
# per tiny group costs more than the padding.
BUCKET_RATIO = 0.75
SMALL = 64


def buckets(lengths: list[int]) -> list[list[int]]:
    """Document indices grouped by length: longest first, each group within BUCKET_RATIO of its max."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
    groups, top = [], 0
    for i in order:
        n = lengths[i]
        if groups and (n >= BUCKET_RATIO * top or top <= SMALL):
            groups[-1].append(i)
        else:
            groups.append([i])
            top = n
    return groups


def bucketed_sdpa(q, k, v, cu_seqlens, max_seqlen, causal, window, scale, key_windows=None):
    """Exact varlen attention as a few batched SDPA calls over right-padded length groups; with a
    role policy's `key_windows` [T] each group's mask is the policy's ([B, 1, L, L])."""
    T, H, D = q.shape
    cu = cu_seqlens.tolist()
    starts, lengths = cu[:-1], [b - a for a, b in zip(cu[:-1], cu[1:])]
    live = [n for n in lengths if n > 0]
    if not live:
        return q.new_zeros(q.shape)
    if min(live) == max(live) and len(live) * live[0] == T:  # equal rows: a view, no gather
        n, L = len(live), live[0]
        keyed = key_windows.reshape(n, L) if key_windows is not None else None
        return _sdpa_batch(q.reshape(n, L, H, D), k.reshape(n, L, -1, D), v.reshape(n, L, -1, D), None,
                           causal, window, scale, keyed).reshape(T, H, D)
    zero = q.new_zeros(1, H, D), k.new_zeros(1, k.shape[1], D)
    q_ext, k_ext, v_ext = torch.cat([q, zero[0]]), torch.cat([k, zero[1]]), torch.cat([v, zero[1]])
    w_ext = torch.cat([key_windows, key_windows.new_zeros(1)]) if key_windows is not None else None
    outs, where = [], torch.empty(T, dtype=torch.long)
    done = 0
    for group in buckets(lengths):
        L = lengths[group[0]]
        idx = torch.full((len(group), L), T, dtype=torch.long)  # T = the zero row
        for r, d in enumerate(group):
            n, s = lengths[d], starts[d]
            idx[r, :n] = torch.arange(s, s + n)
            where[s:s + n] = torch.arange(done + r * L, done + r * L + n)
        valid = idx < T
        idx_dev = idx.to(q.device)
        keyed = w_ext[idx_dev] if w_ext is not None else None  # padding keys: 0, and after every real query
        o = _sdpa_batch(q_ext[idx_dev], k_ext[idx_dev], v_ext[idx_dev], valid.to(q.device), causal, window, scale,
                        keyed)
        outs.append(o.reshape(-1, H, D))
        done += len(group) * L
    return torch.cat(outs)[where.to(q.device)]


def _sdpa_batch(q, k, v, valid, causal, window, scale, key_windows=None):
    """q [B, L, H, D], k/v [B, L, K, D], valid [B, L] bool (None: all real), key_windows [B, L]
    (None: no role policy) -> [B, L, H, D]."""
    B, L, H, D = q.shape
    q, k, v = q.transpose(1, 2), repeat_kv(k.transpose(1, 2), H, 1), repeat_kv(v.transpose(1, 2), H, 1)
    mask = visible(L, L, causal, window, q.device, None if key_windows is None else key_windows[:, None, :])
    if not causal and valid is not None:
        # non-causal: hide padding keys; padding queries keep their own key, so no row is empty
        eye = torch.eye(L, dtype=torch.bool, device=q.device)
        keys = valid[:, None, None, :]
        mask = (keys if mask is None else mask & keys) | eye
    elif mask is not None:
        mask = mask | torch.eye(L, dtype=torch.bool, device=q.device)  # causal+window: padding keys lie
        # after every real query of their row, so causality already hides them; the diagonal is set anyway
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=scale)
    return o.transpose(1, 2)
