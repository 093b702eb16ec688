"""varlen_attention: check the arguments once, resolve the backend from the table, call it."""

from __future__ import annotations

import torch

from packer.train.attention.backends import BACKENDS, backend_names, pick_backend


def varlen_attention(q, k, v, cu_seqlens, max_seqlen, *, causal=True, window=None, scale=None, backend="auto"):
    """Attention of each document with itself only: q [T, H, D], k/v [T, K, D] -> [T, H, D].

    `window=W` lets each token see itself and the W previous tokens of its own document
    (flash-attn `window_size=(W, 0)`; `(W, W)` when `causal=False`). `max_seqlen` may exceed
    the true longest document (it is a bound, as in flash-attn).
    """
    _check(q, k, v, cu_seqlens, max_seqlen, window)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if backend == "auto":
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        backend = pick_backend(q.device, q.dtype, grad)
    elif backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {('auto',) + tuple(BACKENDS)}")
    elif backend not in (names := backend_names(q.device.type)):
        raise ValueError(f"attention backend {backend!r} is not available on {q.device} "
                         f"(available: {names}); pick one of those or backend='auto'")
    return BACKENDS[backend].run(q, k, v, cu_seqlens, int(max_seqlen), causal, window, scale)


def _check(q, k, v, cu_seqlens, max_seqlen, window):
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [total_tokens, heads, head_dim], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}; flatten the batch into one row first")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(f"k/v {tuple(k.shape)} do not match q {tuple(q.shape)}: need the same tokens "
                         "and head_dim, and n_heads a multiple of n_kv_heads")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens must be a 1-D int32 tensor, got {cu_seqlens.dtype} "
                         f"{tuple(cu_seqlens.shape)}; use torch.as_tensor(offsets, dtype=torch.int32)")
    if window is not None and window < 0:
        raise ValueError(f"window={window} must be >= 0 (or None for no window)")
    if cu_seqlens.is_cuda:
        return  # a full check would synchronize the device on every layer
    cu = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != q.shape[0] or min(lengths) < 0:
        raise ValueError(f"cu_seqlens must rise from 0 to total_tokens={q.shape[0]}, got {cu[:4]}...{cu[-2:]}")
    if max(lengths) > max_seqlen:
        raise ValueError(f"max_seqlen={max_seqlen} is below the longest document ({max(lengths)}); "
                         "pass at least max(diff(cu_seqlens))")
