"""PackedSelfAttention: projections, rotary embeddings driven by per-document position ids, varlen_attention."""

from __future__ import annotations

import torch
from torch import nn

from packer.train.attention.varlen import varlen_attention


def rotary(x, position_ids, base: float = 10000.0):
    """Rotate x [T, heads, D] by angles position_ids [T] * base^(-2i/D) (half-split layout)."""
    D = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    angles = position_ids.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class PackedSelfAttention(nn.Module):
    """Self-attention over a packed row: x [T, dim] -> [T, dim], each document attending only to itself.

    Rotary embeddings read `position_ids`, which restart at 0 per document, so a document sees the
    same positions as when run alone. With `policy` (packer.masks.RolePolicy; `roles` the dataset's
    role table, default masks.DEFAULT_ROLES) forward takes `role_ids` and attends by the policy.
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int | None = None, rope: bool = True,
                 window: int | None = None, backend: str = "auto", policy=None, roles=None):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if dim % n_heads or n_heads % n_kv_heads or (dim // n_heads) % 2:
            raise ValueError(f"dim={dim}, n_heads={n_heads}, n_kv_heads={n_kv_heads}: need dim divisible by "
                             "n_heads into an even head_dim, and n_heads divisible by n_kv_heads")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        if policy is not None and window is not None:
            raise ValueError("PackedSelfAttention: give the window in the policy (RolePolicy(window=W)), not both")
        self.rope, self.window, self.backend, self.policy, self.roles = rope, window, backend, policy, roles
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wkv = nn.Linear(dim, 2 * n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x, position_ids, cu_seqlens, max_seqlen, role_ids=None):
        T = x.shape[0]
        q = self.wq(x).view(T, self.n_heads, self.head_dim)
        k, v = self.wkv(x).view(T, 2, self.n_kv_heads, self.head_dim).unbind(1)
        if self.rope:
            q, k = rotary(q, position_ids), rotary(k, position_ids)
        if (role_ids is None) != (self.policy is None):
            raise ValueError("PackedSelfAttention: role_ids go with a policy; make the layer with policy=RolePolicy(...) "
                             "and pass the batch's role_ids (or neither)")
        roles = {} if self.policy is None else {"role_ids": role_ids, "policy": self.policy, "roles": self.roles}
        o = varlen_attention(q, k, v, cu_seqlens, max_seqlen, window=self.window, backend=self.backend, **roles)
        return self.wo(o.reshape(T, -1))
