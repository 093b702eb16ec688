"""TinyGPT: a few pre-norm transformer blocks over PackedSelfAttention, for tests, benchmarks and examples.

It takes either a packed row or a padded batch:

    packed  input_ids [T]    position_ids [T] (restart per document)   cu_seqlens int32 [N + 1]
    padded  input_ids [B, L] position_ids [B, L] or None (0..L-1)      cu_seqlens None (each row one sequence)

and returns logits [T, vocab] (or [B, L, vocab]), plus the mean next-token loss when `labels` are
given. Labels follow packer.data: labels == input_ids except -100 at each document's first token and
on padding; the model shifts them itself, so position t predicts labels[t + 1]. Every layer but
attention acts on one token at a time, so a document gets exactly the same logits packed or alone.
With `policy` (a packer.masks.RolePolicy) in the config, forward takes the batch's `role_ids` ([T],
[1, T] or [B, L]) and every layer attends by the policy. A packed row whose documents are padded apart
(ItemFields(pad_multiple=K)) comes with the batch's `cu_seqlens_padded` beside its `cu_seqlens`, as
Transformer Engine takes them; each document's padding is then a segment of its own (masks.padded_segments).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from packer.masks import IGNORE_INDEX, RolePolicy, padded_segments
from packer.train.attention import PackedSelfAttention


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    vocab_size: int = 4096
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None
    window: int | None = None
    backend: str = "auto"
    policy: RolePolicy | None = None  # a role policy: forward then takes role_ids
    roles: Mapping[str, int] | None = None  # the dataset's role table (None: masks.DEFAULT_ROLES)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(cfg.dim), nn.RMSNorm(cfg.dim)
        self.attn = PackedSelfAttention(cfg.dim, cfg.n_heads, cfg.n_kv_heads, window=cfg.window, backend=cfg.backend,
                                        policy=cfg.policy, roles=cfg.roles)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim, bias=False), nn.GELU(),
                                 nn.Linear(4 * cfg.dim, cfg.dim, bias=False))

    def forward(self, x, position_ids, cu_seqlens, max_seqlen, role_ids=None):
        x = x + self.attn(self.norm1(x), position_ids, cu_seqlens, max_seqlen, role_ids)
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: GPTConfig = GPTConfig()):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        torch.nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, input_ids, position_ids=None, cu_seqlens=None, max_seqlen=None, labels=None, role_ids=None,
                cu_seqlens_padded=None):
        shape = input_ids.shape
        if input_ids.dim() == 2:  # padded batch: every row is one causal sequence
            B, L = shape
            if cu_seqlens is not None or cu_seqlens_padded is not None:
                raise ValueError("a 2-D (padded) batch takes no cu_seqlens; flatten it to one packed row instead")
            cu_seqlens = torch.arange(0, B * L + 1, L, dtype=torch.int32, device=input_ids.device)
            max_seqlen = L
            if position_ids is None:
                position_ids = torch.arange(L, device=input_ids.device).expand(B, L)
            input_ids, position_ids = input_ids.reshape(-1), position_ids.reshape(-1)
            labels = None if labels is None else labels.reshape(-1)
        elif cu_seqlens is None:
            raise ValueError("a packed row (1-D input_ids) needs cu_seqlens; pass the loader's cu_seqlens")
        elif cu_seqlens_padded is not None:  # real-token boundaries + where each document lies -> the layout's segments
            cu_seqlens = padded_segments(cu_seqlens, cu_seqlens_padded)
        if role_ids is not None:
            role_ids = role_ids.reshape(-1)  # [1, T] (a varlen batch) or [B, L]
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, position_ids, cu_seqlens, max_seqlen, role_ids)
        logits = self.head(self.norm(x))
        out = logits.view(*shape, -1)
        if labels is None:
            return out
        return out, next_token_loss(logits, labels)


def next_token_loss(logits, labels, reduction: str = "mean"):
    """Cross-entropy of logits[t] against labels[t + 1] over one flat row; -100 is ignored.

    A row's first label is always -100 (a document start), so shifting across concatenated rows
    never pairs the end of one row with the start of the next.
    """
    return F.cross_entropy(logits[:-1].float(), labels[1:], ignore_index=IGNORE_INDEX, reduction=reduction)
