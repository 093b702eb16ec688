"""The public attention API: exact per-document attention over packed rows (implemented in packer/train/attention/).

    out = varlen_attention(q, k, v, batch["cu_seqlens"], batch["max_seqlen"])   # q [T, H, D]
"""

from packer.train.attention import PackedSelfAttention, available_backends, pick_backend, varlen_attention
from packer.train.attention.flex import batch_flex_block_mask, flex_block_mask

__all__ = ["PackedSelfAttention", "available_backends", "batch_flex_block_mask", "flex_block_mask", "pick_backend",
           "varlen_attention"]
