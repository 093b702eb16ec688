"""The exact reference backend: one scaled_dot_product_attention call per document, any device.

Every backend takes and returns the same arrays (flash-attn layout, no batch axis):

    q [T, H, D], k/v [T, K, D], cu_seqlens int32 [N + 1], max_seqlen, causal, window, scale -> [T, H, D]

A backend that runs role policies (packer.masks.RolePolicy) also takes `key_windows`, int64 [T]:
query i sees key j of its document when j <= i and i - j <= key_windows[j] (causal; no `window`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def visible(n_q: int, n_k: int, causal: bool, window, device, key_windows=None) -> torch.Tensor | None:
    """[n_q, n_k] bool: query i may see key j (positions within one document), or None for all.
    `key_windows` [..., n_k] (a role policy's, causal): also i - j <= key_windows[j]; [..., n_q, n_k]."""
    if not causal and window is None:
        return None
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    ok = (j <= i) if causal else torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if window is not None:
        ok = ok & ((i - j) <= window) & ((j - i) <= (0 if causal else window))
    if key_windows is not None:
        ok = ok & ((i - j) <= key_windows[..., None, :])
    return ok


def repeat_kv(k, n_heads: int, dim: int):
    """k with its kv heads (axis `dim`) repeated up to `n_heads` (grouped-query attention)."""
    groups = n_heads // k.shape[dim]
    return k if groups == 1 else k.repeat_interleave(groups, dim=dim)


def sdpa_per_document(q, k, v, cu_seqlens, max_seqlen, causal, window, scale, key_windows=None):
    """The reference: one SDPA call per document, [H, l, D] each (a role policy: its dense mask)."""
    H = q.shape[1]
    k, v = repeat_kv(k, H, 1), repeat_kv(v, H, 1)
    cu = cu_seqlens.tolist()
    outs = []
    for a, b in zip(cu[:-1], cu[1:]):
        if b == a:
            continue
        qd, kd, vd = (t[a:b].transpose(0, 1) for t in (q, k, v))
        keyed = key_windows[a:b] if key_windows is not None else None
        mask = visible(b - a, b - a, causal, window, q.device, keyed) if window is not None or keyed is not None \
            else None
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, is_causal=causal and mask is None, scale=scale)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs) if outs else q.new_zeros(q.shape)
