"""varlen_attention: check the arguments once, resolve the backend from the table, call it."""

from __future__ import annotations

import torch

from packer.masks import DEFAULT_ROLES, RolePolicy, token_key_windows
from packer.train.attention.backends import BACKENDS, backend_names, pick_backend


def varlen_attention(q, k, v, cu_seqlens, max_seqlen, *, causal=True, window=None, scale=None, backend="auto",
                     role_ids=None, policy: RolePolicy | None = None, roles=None):
    """Attention of each document with itself only: q [T, H, D], k/v [T, K, D] -> [T, H, D].

    `window=W` lets each token see itself and the W previous tokens of its own document
    (flash-attn `window_size=(W, 0)`; `(W, W)` when `causal=False`). `max_seqlen` may exceed
    the true longest document (it is a bound, as in flash-attn).

    `role_ids` [T] (a chat dataset's, `PackedDataset(..., fields=ItemFields(role_ids=True))`) with `policy`, a
    packer.masks.RolePolicy, give the hybrid mask masks.hybrid_mask draws (causal; the window is
    the policy's), under the role table `roles` (the manifest's "roles"; default DEFAULT_ROLES).
    Run by the backends whose table entry says roles=True (flex, bucketed, sdpa); others refuse.
    """
    _check(q, k, v, cu_seqlens, max_seqlen, window)
    key_windows = _key_windows(q, role_ids, policy, roles, causal, window)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if backend == "auto":
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        backend = pick_backend(q.device, q.dtype, grad, roles=key_windows is not None)
    elif backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {('auto',) + tuple(BACKENDS)}")
    elif backend not in (names := backend_names(q.device.type)):
        raise ValueError(f"attention backend {backend!r} is not available on {q.device} "
                         f"(available: {names}); pick one of those or backend='auto'")
    run = BACKENDS[backend].run
    if key_windows is None:
        return run(q, k, v, cu_seqlens, int(max_seqlen), causal, window, scale)
    if not BACKENDS[backend].roles:
        able = [n for n in backend_names(q.device.type) if BACKENDS[n].roles]
        raise ValueError(f"attention backend {backend!r} cannot run a role policy (its kernel takes one window for "
                         f"every key); use one that can on {q.device}: {able}, or backend='auto'")
    return run(q, k, v, cu_seqlens, int(max_seqlen), causal, None, scale, key_windows=key_windows)


def _key_windows(q, role_ids, policy, roles, causal: bool, window):
    """The policy's window of each key (int64 [T] on q's device), or None without a policy."""
    if role_ids is None and policy is None:
        return None
    if role_ids is None or not isinstance(policy, RolePolicy):
        raise ValueError("a role policy needs both role_ids (one per token) and policy (a packer.masks.RolePolicy); "
                         f"got role_ids={'None' if role_ids is None else 'given'}, policy={type(policy).__name__}")
    if not causal or window is not None:
        raise ValueError("a role policy is causal and holds its own windows: pass causal=True and window=None, "
                         "and put the window in the policy (RolePolicy(window=W))")
    role_ids = torch.as_tensor(role_ids, device=q.device).reshape(-1)
    if role_ids.shape[0] != q.shape[0]:
        raise ValueError(f"{role_ids.shape[0]} role ids for {q.shape[0]} tokens; give one role id per token "
                         "(the batch's role_ids, flattened like input_ids)")
    if not role_ids.is_cuda and len(role_ids) and not 0 <= int(role_ids.min()) <= int(role_ids.max()) <= 255:
        raise ValueError(f"role ids {int(role_ids.min())}..{int(role_ids.max())}: a role id is 0..255 (uint8; "
                         "the manifest's \"roles\", padding 255)")  # on CUDA: not checked, as cu_seqlens
    return token_key_windows(role_ids, policy, DEFAULT_ROLES if roles is None else roles)


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
