"""The CUDA kernel backends: adapters from our arguments to flash-attn's and torch's varlen calls.

Both take causal + window as flash-attn's `window_size=(left, right)`: (-1, 0) causal, (-1, -1)
full, (W, 0) causal with a window of W previous tokens, (W, W) non-causal.
"""

from __future__ import annotations

import functools
import inspect

import torch

from packer.train.attention.sdpa import repeat_kv


def _window_size(causal: bool, window):
    if window is None:
        return (-1, 0) if causal else (-1, -1)
    return (window, 0) if causal else (window, window)


def flash_attn_varlen(q, k, v, cu_seqlens, max_seqlen, causal, window, scale):
    from flash_attn import flash_attn_varlen_func

    kwargs = {"softmax_scale": scale, "causal": causal}
    if window is not None:
        if "window_size" not in inspect.signature(flash_attn_varlen_func).parameters:
            raise ValueError("this flash_attn has no window_size (needs flash-attn >= 2.3); upgrade it or use window=None")
        kwargs["window_size"] = (window, 0 if causal else window)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kwargs)


@functools.lru_cache(maxsize=None)
def torch_varlen_params() -> frozenset:
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def torch_varlen(q, k, v, cu_seqlens, max_seqlen, causal, window, scale):
    """torch.nn.attention.varlen.varlen_attn: early releases take `is_causal` (and maybe no `scale`,
    no GQA); later ones take `window_size=(left, right)`, `scale`, `enable_gqa`."""
    from torch.nn.attention.varlen import varlen_attn

    params = torch_varlen_params()
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = _window_size(causal, window)
    elif window is not None:
        raise ValueError(f"torch {torch.__version__} varlen_attn has no window_size; use backend='flex' for a window")
    else:
        kwargs["is_causal"] = causal
    if "scale" in params:
        kwargs["scale"] = scale
    elif scale != q.shape[-1] ** -0.5:
        q = q * (scale * q.shape[-1] ** 0.5)  # fold a custom scale into q
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k, v = repeat_kv(k, q.shape[1], 1), repeat_kv(v, q.shape[1], 1)
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kwargs)
