"""Offsets -> position ids, document ids, labels, cu_seqlens and block-causal masks.

A row of 6 tokens holding documents of lengths 3, 2, 1 has

    offsets       [0, 3, 5, 6]
    position_ids  [0, 1, 2, 0, 1, 0]
    document_ids  [0, 0, 0, 1, 1, 2]
    labels        [-100, t1, t2, -100, t4, -100]   (input_ids, -100 at each document's first token)
    with a loss mask [1, 0, 1, 1, 1, 1] (token 1 untrained): [-100, -100, t2, -100, t4, -100]
    mask_TT       block-causal: query i sees key j iff j <= i and both are in the same document

        1 . . . . .
        1 1 . . . .
        1 1 1 . . .
        . . . 1 . .
        . . . 1 1 .
        . . . . . 1

Padded to L = 8 the padding is one more segment (offsets [0, 3, 5, 6, 8]): position ids
[... 0, 0, 1], document id 3, labels -100, and padding rows attend only to padding, so no
row of the mask is empty.

Every function is vectorized (no Python loop over tokens) and follows its input: numpy in,
numpy out; torch tensor in, torch tensor out on the same device (this module never imports torch:
a tensor's own library is taken from the tensor, so it works, and stays cheap, without it). The
FlexAttention block masks built from these are packer/train/attention/flex.py's. Lists are treated as numpy.

Batch versions (`batch_*`) take a list of per-row offsets and a common length L and return
[B, L] arrays (`mask_BLL` for the dense mask): the padded layout. A varlen batch (rows
concatenated into one) needs no batch version: `merge_offsets` gives its cu_seqlens, and the
single-row functions apply to those.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from packer.config import role_table

IGNORE_INDEX = -100


# -- numpy / torch dispatch ----------------------------------------------------------------


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _torch():
    """torch, already loaded by whoever made the tensor we were given (never imported here)."""
    return sys.modules["torch"]


def _as_int64(x):
    if _is_torch(x):
        torch = _torch()
        return x.to(torch.int64)
    return np.asarray(x, dtype=np.int64)


def _arange(n: int, like):
    if _is_torch(like):
        torch = _torch()
        return torch.arange(n, dtype=torch.int64, device=like.device)
    return np.arange(n, dtype=np.int64)


def _segment_of_tokens(offsets):
    """int64 [offsets[-1]]: the index of the segment each token is in."""
    n = int(offsets[-1])
    if _is_torch(offsets):  # searchsorted, not repeat_interleave: that one stalls in torch's thread
        torch = _torch()  # pool on a busy machine (15 ms for 8 tokens, torch 2.13, 2 loaded cores)
        return torch.searchsorted(offsets[1:], _arange(n, offsets), right=True)
    return np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))


def _concat(parts):
    if _is_torch(parts[0]):
        torch = _torch()
        return torch.cat(parts)
    return np.concatenate(parts)


def _padded(offsets, length):
    """offsets with the padding segment [offsets[-1], length) appended when length is longer."""
    offsets = _as_int64(offsets)
    if length is None or int(offsets[-1]) == length:
        return offsets
    if length < int(offsets[-1]):
        raise ValueError(f"length {length} is shorter than the row's {int(offsets[-1])} tokens; "
                         "pass a length >= the row length")
    end = _arange(1, offsets) + length
    return _concat([offsets, end])


# -- one row -------------------------------------------------------------------------------


def position_ids(offsets, length: int | None = None):
    """int64 [T]: each token's position inside its document; with `length`, padding restarts at 0."""
    offsets = _padded(offsets, length)
    return _arange(int(offsets[-1]), offsets) - offsets[_segment_of_tokens(offsets)]


def document_ids(offsets, length: int | None = None):
    """int64 [T]: the segment index of each token (0, 1, ...); padding is one more segment."""
    return _segment_of_tokens(_padded(offsets, length))


def cu_seqlens(offsets, length: int | None = None):
    """int32 [n_segments + 1]: flash-attn `cu_seqlens`; with `length`, padding is the last segment."""
    offsets = _padded(offsets, length)
    if _is_torch(offsets):
        torch = _torch()
        return offsets.to(torch.int32)
    return offsets.astype(np.int32)


def padded_segments(cu_seqlens, cu_seqlens_padded):
    """int32: the segments of a layout whose documents are padded apart (Transformer Engine's THD
    convention: cu_seqlens counts each document's real tokens, cu_seqlens_padded where each one lies),
    every document's padding a segment of its own, empty ones left out: what flash-attn's varlen
    `cu_seqlens` (and packer's attention backends) take for that layout, padding attending only to itself.

        cu_seqlens [0, 3, 5]   cu_seqlens_padded [0, 4, 8]   (tokens a a a p b b p p)
        -> [0, 3, 4, 6, 8]

    Leaving the empty ones out is a data-dependent size: on a GPU one device read, so make it once a
    batch (packer.hf's batch does, on the host), not in every layer.
    """
    real, padded = _as_int64(cu_seqlens), _as_int64(cu_seqlens_padded)
    if len(real) != len(padded):
        raise ValueError(f"cu_seqlens has {len(real)} boundaries and cu_seqlens_padded {len(padded)}; give the "
                         "pair of one batch (one boundary more than documents, each)")
    ends = padded[:-1] + (real[1:] - real[:-1])  # each document's last real token + 1
    bounds = _concat([padded[:1], _stack_columns(ends, padded[1:])])
    keep = bounds[1:] > bounds[:-1]
    return _as_int32(_concat([bounds[:1], bounds[1:][keep]]))


def _stack_columns(a, b):
    """[a0, b0, a1, b1, ...]."""
    if _is_torch(a):
        torch = _torch()
        return torch.stack([a, b], 1).reshape(-1)
    return np.stack([a, b], 1).reshape(-1)


def _as_int32(offsets):
    if _is_torch(offsets):
        torch = _torch()
        return offsets.to(torch.int32)
    return np.asarray(offsets).astype(np.int32)


def labels(input_ids, offsets, loss_mask=None):
    """int64 [T or L]: input_ids with -100 at each document's first token, past offsets[-1] (padding)
    and, given a loss mask (one value per token of the row, 0 = untrained), at every untrained token.

    With these labels and the usual shift (position t predicts labels[t + 1]) the last token of a
    document is never trained to predict the first token of the next one, and an untrained token is
    never a target (it stays an input).
    """
    out = _as_int64(input_ids).clone() if _is_torch(input_ids) else np.array(input_ids, dtype=np.int64)
    offsets = _as_int64(offsets)
    out[offsets[:-1]] = IGNORE_INDEX
    out[int(offsets[-1]):] = IGNORE_INDEX
    if loss_mask is not None:
        _mask_untrained(out, loss_mask, int(offsets[-1]))
    return out


def next_token_labels(labels):
    """labels [.., T] moved left by one, -100 last: each position's own target, the convention of trainers whose
    loss takes no shift (Megatron, torchtitan), where packer's labels[t] is position t - 1's target.

        labels             [-100, t1, t2, -100, t4, -100]
        next_token_labels  [t1, t2, -100, t4, -100, -100]
    """
    if _is_torch(labels):
        out = _torch().full_like(labels, IGNORE_INDEX)
    else:
        labels = np.asarray(labels, dtype=np.int64)
        out = np.full_like(labels, IGNORE_INDEX)
    out[..., :-1] = labels[..., 1:]
    return out


def _mask_untrained(out, loss_mask, n: int):
    """-100 in out[:n] (a row's n tokens) where loss_mask is 0."""
    if len(loss_mask) != n:
        raise ValueError(f"a loss mask of {len(loss_mask)} values for a row of {n} tokens; give one value per token")
    if _is_torch(out):
        torch = _torch()
        out[:n][torch.as_tensor(loss_mask, device=out.device) == 0] = IGNORE_INDEX
    else:
        out[:n][np.asarray(loss_mask) == 0] = IGNORE_INDEX


def block_causal_mask(offsets, length: int | None = None):
    """bool [T, T], True where query i may attend to key j (same segment, j <= i). O(T^2): opt-in."""
    doc = document_ids(offsets, length)
    t = _arange(len(doc), doc)
    return (doc[:, None] == doc[None, :]) & (t[None, :] <= t[:, None])


def merge_offsets(offsets_list, lengths=None):
    """cu_seqlens (int32) of rows concatenated into one: [[0, 3, 4], [0, 2]] -> [0, 3, 4, 6].

    `lengths` (one per row, each >= the row's offsets[-1]) pads every row to its length first,
    padding being a segment of its own, as in a varlen batch of padded items.
    """
    if lengths is None:
        lengths = [None] * len(offsets_list)
    rows = [_padded(o, None if n is None else int(n)) for o, n in zip(offsets_list, lengths)]
    parts, start = [rows[0]], int(rows[0][-1])
    for row in rows[1:]:  # a loop over rows, not tokens
        parts.append(row[1:] + start)
        start += int(row[-1])
    return cu_seqlens(_concat(parts))


# -- a batch of rows padded to one length L ------------------------------------------------


def _batch_merged(offsets_list, length: int):
    """Row offsets padded to `length` and shifted by b * length: the offsets of the flat [B * L] row."""
    return _as_int64(merge_offsets(offsets_list, [length] * len(offsets_list)))


def batch_position_ids(offsets_list, length: int):
    """int64 [B, L]: `position_ids` of each row, padding restarting at 0."""
    return position_ids(_batch_merged(offsets_list, length)).reshape(len(offsets_list), length)


def batch_document_ids(offsets_list, length: int):
    """int64 [B, L]: `document_ids` of each row (row-local: each row starts at 0)."""
    doc_BL = document_ids(_batch_merged(offsets_list, length)).reshape(len(offsets_list), length)
    return doc_BL - doc_BL[:, :1]


def batch_labels(input_ids_BL, offsets_list, loss_masks=None):
    """int64 [B, L]: `labels` of each row of a padded batch (row b's loss mask: loss_masks[b], or None)."""
    out = _as_int64(input_ids_BL).clone() if _is_torch(input_ids_BL) else np.array(input_ids_BL, dtype=np.int64)
    for b, offsets in enumerate(offsets_list):  # a loop over rows, not tokens
        offsets = _as_int64(offsets)
        out[b, offsets[:-1]] = IGNORE_INDEX
        out[b, int(offsets[-1]):] = IGNORE_INDEX
        if loss_masks is not None and loss_masks[b] is not None:
            _mask_untrained(out[b], loss_masks[b], int(offsets[-1]))
    return out


def batch_block_causal_mask(offsets_list, length: int):
    """bool [B, L, L]: `block_causal_mask` of each row, padding attending only to padding."""
    doc_BL = batch_document_ids(offsets_list, length)
    t = _arange(length, doc_BL)
    return (doc_BL[:, :, None] == doc_BL[:, None, :]) & (t[None, None, :] <= t[None, :, None])


# -- role policies: which keys of its document a query sees, by the key's role -------------------

UNLIMITED = 2**31 - 1  # the key window of a role seen at any distance (int32-safe for kernels)
N_ROLE_IDS = 256  # role ids are uint8
PAD_ROLE = 255  # the role id loaders give padding tokens (a segment of their own: any window is exact)
# the role table of a chat build with the default role names (a manifest's "roles"): the messages'
# roles system 0, user 1, assistant 2, tool 3, then template 4 (tokens the chat template writes
# outside every message) and other 5 (a message of a role not named)
DEFAULT_ROLES = role_table()


@dataclass(frozen=True, kw_only=True)
class RolePolicy:
    """A hybrid attention mask for chat data, as plain data. Inside one document, query i sees key
    j <= i when j's role is global, or when i - j <= the window of j's role (`role_windows`, else
    `window`; None: no window, always). Never across documents; every query sees itself.

        RolePolicy(role_windows={"user": 2}, global_roles={"system"})   roles S S U U U A A
                                                                        (S system, U user, A assistant)
        query  S S U U U A A   (keys)
          S    1 . . . . . .
          S    1 1 . . . . .
          U    1 1 1 . . . .
          U    1 1 1 1 . . .
          U    1 1 1 1 1 . .
          A    1 1 . 1 1 1 .      user key 2 is 3 back from query 5: outside its window of 2
          A    1 1 . . 1 1 1      the assistant (no window) sees all of its own turn

    A role the role table lacks is an error (a typo would silently train another mask); an id
    outside the table (padding, PAD_ROLE) takes `window`."""

    window: int | None = None
    role_windows: Mapping[str, int] = field(default_factory=dict)
    global_roles: frozenset = frozenset()

    def __post_init__(self):
        globals_ = {self.global_roles} if isinstance(self.global_roles, str) else set(self.global_roles)
        object.__setattr__(self, "global_roles", frozenset(globals_))
        object.__setattr__(self, "role_windows", dict(self.role_windows))
        for name, w in [("window", self.window), *((f"role_windows[{r!r}]", w) for r, w in self.role_windows.items())]:
            if w is not None and (isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0):
                raise ValueError(f"RolePolicy {name}={w!r}: a window is a whole number of tokens >= 0 (or None)")
        if both := sorted(self.global_roles & set(self.role_windows)):
            raise ValueError(f"RolePolicy: role {both[0]!r} is both global and windowed; give it one of the two")
        if not all(isinstance(r, str) for r in [*self.global_roles, *self.role_windows]):
            raise ValueError("RolePolicy: roles are named by strings, e.g. global_roles={'system'}")

    def __hash__(self):
        return hash((self.window, tuple(sorted(self.role_windows.items())), self.global_roles))

    def window_of(self, role: str) -> int | None:
        """The window of keys of `role` (None: seen at any distance)."""
        return None if role in self.global_roles else self.role_windows.get(role, self.window)

    def key_windows(self, roles: Mapping[str, int]) -> np.ndarray:
        """int64 [256]: the window of a key of each role id under the role table `roles` (name ->
        id, a manifest's "roles"), UNLIMITED for no window."""
        if unknown := sorted({*self.global_roles, *self.role_windows} - set(roles)):
            raise ValueError(f"RolePolicy names role {unknown[0]!r}, which the role table lacks "
                             f"({', '.join(roles)}); name roles of the dataset's manifest \"roles\"")
        default = UNLIMITED if self.window is None else self.window
        table = np.full(N_ROLE_IDS, default, np.int64)
        for name, role_id in roles.items():
            w = self.window_of(name)
            table[int(role_id)] = UNLIMITED if w is None else w
        return table

    @classmethod
    def parse(cls, text: str) -> RolePolicy:
        """From the command line: "system=global,user=64,*=none" (`*`: every other role's window)."""
        window, role_windows, global_roles = None, {}, set()
        for part in filter(None, (p.strip() for p in text.split(","))):
            role, eq, value = (x.strip() for x in part.partition("="))
            if not eq or not role or not (value in ("global", "none") or value.isdigit()):
                raise ValueError(f"--policy {text!r}: {part!r} is not ROLE=global, ROLE=none or ROLE=N (tokens); "
                                 "e.g. system=global,user=64")
            w = None if value in ("global", "none") else int(value)
            if role == "*":
                window = w
            elif value == "global":
                global_roles.add(role)
            elif w is not None:
                role_windows[role] = w
        return cls(window=window, role_windows=role_windows, global_roles=frozenset(global_roles))


def token_key_windows(role_ids, policy: RolePolicy, roles: Mapping[str, int]):
    """int64 [T]: the key window of each token (its role's), numpy or torch as `role_ids`."""
    table = policy.key_windows(roles)
    if _is_torch(role_ids):
        return _torch().as_tensor(table, device=role_ids.device)[role_ids.long()]
    return table[np.asarray(role_ids, dtype=np.int64)]


def hybrid_mask(offsets, role_ids, policy: RolePolicy, roles: Mapping[str, int]):
    """bool [T, T], True where query i may attend to key j under `policy` (RolePolicy): same
    document, j <= i, and i - j <= the window of j's role. The dense reference of one row: O(T^2)."""
    n = int(offsets[-1])
    if len(role_ids) != n:
        raise ValueError(f"{len(role_ids)} role ids for a row of {n} tokens; give one role id per token")
    window = token_key_windows(role_ids, policy, roles)
    t = _arange(n, window)
    return block_causal_mask(offsets) & (t[:, None] - t[None, :] <= window[None, :])
