"""The FlexAttention backend: one fused call with a document block mask built from per-block ranges.

Fused on CUDA in both passes (masked blocks skipped); on CPU forward only in torch 2.13, where
its forward also loses to `bucketed` (benchmarks/bench_attention.py), so auto ranks it after.
"""

from __future__ import annotations

import functools
import warnings

import torch

from packer import masks

FLEX_BLOCK = 128
FLEX_COMPILE_MIN_TOKENS = 1024  # below this eager FlexAttention is cheaper than a compile


@functools.lru_cache(maxsize=None)
def cpu_backward() -> bool:
    """Probe once: does this torch run FlexAttention's backward on CPU? (torch 2.13: no.)"""
    try:
        from torch.nn.attention.flex_attention import flex_attention

        q = torch.randn(1, 1, 8, 8, requires_grad=True)
        flex_attention(q, q, q).sum().backward()
        return True
    except Exception:  # NotImplementedError in 2.13; anything else also means "cannot train"
        return False


def trains(device_type: str) -> bool:
    return device_type == "cuda" or cpu_backward()


def document_block_mask(cu_seqlens, T: int, causal: bool, window, device, key_windows=None):
    """A FlexAttention BlockMask for documents given by cu_seqlens, built from per-block ranges.

    Tokens are cut into 128-token blocks. Document ids never decrease along a row, so a block
    holds the documents lo..hi (every one of them has tokens in it), and a (query block i, key
    block j) pair has a visible pair of tokens exactly when their ranges share a document (and
    j <= i when causal); it needs no mask_mod when both lie inside one document (j < i when
    causal) and, with a window, its farthest pair is within it. O(T + (T/128)^2): at T = 131072
    that is 1M block pairs, where the dense [T, T] mask would be 17 GB. With a window, pairs
    whose nearest tokens are within it are kept as partial (mask_mod decides inside them).
    Kept beside flex_block_mask (below: causal documents only, built by create_block_mask):
    this one also takes causal=False and a window.

    A role policy (packer.masks.RolePolicy) comes as `key_windows` [T] (causal): the mask_mod adds
    q - kv <= key_windows[kv], a pair is kept when its nearest tokens are within the largest window
    of its key block, and full only when its farthest are within the smallest.
    """
    from torch.nn.attention.flex_attention import BlockMask

    n_blocks = -(-T // FLEX_BLOCK)
    Tp = n_blocks * FLEX_BLOCK
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(device=device, dtype=torch.long)
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths, output_size=T)
    doc = torch.cat([doc, torch.full((Tp - T,), -1, device=device, dtype=torch.long)])

    keyed = None
    if key_windows is not None:  # padding keys: window 0 (they are masked by doc anyway)
        keyed = torch.cat([key_windows.to(device=device, dtype=torch.long), doc.new_zeros(Tp - T)])

    def mask_mod(b, h, q_idx, kv_idx):
        ok = (doc[q_idx] == doc[kv_idx]) & (doc[q_idx] >= 0)
        if causal:
            ok = ok & (kv_idx <= q_idx)
        if window is not None:
            ok = ok & (q_idx - kv_idx <= window) & (kv_idx - q_idx <= (0 if causal else window))
        if keyed is not None:
            ok = ok & (q_idx - kv_idx <= keyed[kv_idx])
        return ok

    blocks = doc.view(n_blocks, FLEX_BLOCK)
    lo, hi = blocks[:, 0], blocks.max(dim=1).values  # padding (-1) only ever ends the last block
    real = hi >= 0
    whole = (lo == hi) & (blocks[:, -1] >= 0)  # one document, no padding
    i, j = torch.arange(n_blocks, device=device)[:, None], torch.arange(n_blocks, device=device)[None, :]
    shared = torch.maximum(lo[:, None], lo[None, :]) <= torch.minimum(hi[:, None], hi[None, :])  # a document
    any_ = shared & real[:, None] & real[None, :]
    full = whole[:, None] & whole[None, :] & (lo[:, None] == lo[None, :])
    if causal:
        any_, full = any_ & (j <= i), full & (j < i)
    gap = (i - j).abs()
    nearest, farthest = (gap - 1).clamp(min=0) * FLEX_BLOCK + (gap > 0).long(), (gap + 1) * FLEX_BLOCK - 1
    if window is not None:
        any_, full = any_ & (nearest <= window), full & (farthest <= window)
    if keyed is not None:
        key_blocks = keyed.view(n_blocks, FLEX_BLOCK)
        widest, narrowest = key_blocks.max(dim=1).values, key_blocks.min(dim=1).values
        any_, full = any_ & (nearest <= widest[None, :]), full & (farthest <= narrowest[None, :])
    partial = any_ & ~full

    def to_kv(blocks):
        num = blocks.sum(-1, dtype=torch.int32)[None, None]
        idx = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)[None, None]
        return num, idx

    (kv_num, kv_idx), (full_num, full_idx) = to_kv(partial), to_kv(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=FLEX_BLOCK,
                                    mask_mod=mask_mod, seq_lengths=(T, T))


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)  # dynamic after the first new shape: packed rows vary in T


def flex_varlen(q, k, v, cu_seqlens, max_seqlen, causal, window, scale, key_windows=None):
    from torch.nn.attention.flex_attention import flex_attention

    T, H, D = q.shape
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if grad and q.device.type == "cpu" and not cpu_backward():
        raise ValueError(f"backend='flex' cannot train on CPU in torch {torch.__version__} (no backward); "
                         "use backend='bucketed' or run under torch.no_grad()")
    if not grad:  # CPU FlexAttention refuses inputs that require grad, even under no_grad
        q, k, v = q.detach(), k.detach(), v.detach()
    block_mask = document_block_mask(cu_seqlens, T, causal, window, q.device, key_windows)
    fn = _compiled_flex() if T >= FLEX_COMPILE_MIN_TOKENS else flex_attention
    with warnings.catch_warnings():  # eager on purpose for small T: a compile costs ~25 s on CPU
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        o = fn(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=block_mask,
               scale=scale, enable_gqa=k.shape[1] != H)
    return o[0].transpose(0, 1)


def flex_block_mask(offsets, length: int | None = None, *, device=None, block_size: int = 128):
    """A FlexAttention `BlockMask` [1, 1, L, L] for one row (or a varlen batch: pass its cu_seqlens).

    The mask_mod is document-causal, the same predicate as `packer.masks.block_causal_mask`:

        mask_mod(b, h, q, kv) = (doc[q] == doc[kv]) & (kv <= q)

    with doc = masks.document_ids(offsets, length), so padding (when `length` > offsets[-1]) is a
    segment of its own. Use it as `flex_attention(q, k, v, block_mask=flex_block_mask(cu))`
    with q, k, v of shape [1, H, L, D]. Built by
    `torch.nn.attention.flex_attention.create_block_mask`; `device` defaults to the offsets' own
    (cpu for numpy), `block_size` is FlexAttention's BLOCK_SIZE.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    device = device if device is not None else (offsets.device if isinstance(offsets, torch.Tensor) else "cpu")
    doc = torch.as_tensor(masks.document_ids(offsets, length)).to(device)

    def document_causal(b, h, q, kv):
        return (doc[q] == doc[kv]) & (kv <= q)

    n = len(doc)
    return create_block_mask(document_causal, None, None, n, n, device=device, BLOCK_SIZE=block_size)


def batch_flex_block_mask(offsets_list, length: int, *, device=None, block_size: int = 128):
    """A FlexAttention `BlockMask` [B, 1, L, L] for a padded batch (q, k, v of shape [B, H, L, D]):
    `flex_block_mask` per row, the mask_mod reading doc[b, q] == doc[b, kv] & kv <= q."""
    from torch.nn.attention.flex_attention import create_block_mask

    first = offsets_list[0]
    device = device if device is not None else (first.device if isinstance(first, torch.Tensor) else "cpu")
    doc_BL = torch.as_tensor(masks.batch_document_ids(offsets_list, length)).to(device)

    def document_causal(b, h, q, kv):
        return (doc_BL[b, q] == doc_BL[b, kv]) & (kv <= q)

    return create_block_mask(document_causal, len(offsets_list), None, length, length, device=device,
                             BLOCK_SIZE=block_size)
