"""Varlen (per-document) attention behind one call, with several backends, and PackedSelfAttention.

Legend: T total tokens of a packed batch, H query heads, K key/value heads (H % K == 0), D head
dim, N documents, B documents in one length bucket, L padded length of a bucket.

A packed row of 6 tokens holding documents of lengths 3, 2, 1:

    q, k, v      [T=6, H, D] / [T=6, K, D]    (flash-attn layout, no batch axis)
    cu_seqlens   int32 [0, 3, 5, 6]           (document boundaries, from packer.masks / packer.data)
    position_ids [0, 1, 2, 0, 1, 0]           (drive the rotary embedding, so it restarts per document)

    causal mask (query i sees key j)          window=1 (itself and 1 previous token of its document)
        1 . . . . .                               1 . . . . .
        1 1 . . . .                               1 1 . . . .
        1 1 1 . . .                               . 1 1 . . .
        . . . 1 . .                               . . . 1 . .
        . . . 1 1 .                               . . . 1 1 .
        . . . . . 1                               . . . . . 1

Backends (`available_backends()` says which run, and which can train, on a device; the table
name -> Backend is in backends.py, each backend's function in its own module):

    flash_attn    flash_attn.flash_attn_varlen_func           CUDA, fp16/bf16                   cuda.py
    torch_varlen  torch.nn.attention.varlen.varlen_attn       CUDA, fp16/bf16 (signature read)  cuda.py
    flex          FlexAttention with a document block mask    CUDA; CPU forward only            flex.py
    bucketed      one batched SDPA per length group; exact    any device                        bucketed.py
    sdpa          one SDPA per document: the exact reference  any device                        sdpa.py

varlen.py checks the arguments and dispatches through the table; layer.py holds rotary and
PackedSelfAttention.

A role policy (packer.masks.RolePolicy, with a chat dataset's role_ids) reaches a backend as one
window per key: sdpa, bucketed and flex run it exactly (their table entries say roles=True; auto
picks bucketed on CPU, flex on CUDA), flash_attn and torch_varlen refuse it (docs/role_masks.md).

`bucketed` is the fast exact CPU path: documents sorted by length, cut into groups within a
factor of each other, each group one right-padded causal SDPA call (exact: with right padding and
a causal mask no real query sees a padding key; bucketed.py draws it).
Measured 2026-11-29 on a busy 2-core CPU (1 thread), context 4096, 8 heads x 64, three packed
rows of web-like lengths (flop ratio L^2 / sum(l^2) = 2.9x), against SDPA with a dense
block-causal mask: bucketed forward 8.0x, forward+backward 5.0x faster, 6.7x less peak memory;
flex (compiled, forward only) 6.1x; sdpa per document 3.7x. CPU SDPA's backward costs about 3x
its forward, which is what holds forward+backward below the forward ratio.
On an H200 (bf16, 32 rows of 4096, one batched dense-mask SDPA call as the baseline), forward+
backward: torch_varlen 3.1x, flex 1.6x, bucketed 0.2x (its many small calls are a CPU design).
"""

from packer.train.attention.backends import BACKENDS, Backend, available_backends, pick_backend
from packer.train.attention.layer import PackedSelfAttention, rotary
from packer.train.attention.varlen import varlen_attention

__all__ = ["BACKENDS", "Backend", "PackedSelfAttention", "available_backends", "pick_backend", "rotary",
           "varlen_attention"]
