"""The show-mask picture in bounded memory: its pixel bands equal a brute-force downsample of the dense
mask (block-causal and a role policy's hybrid mask) at small contexts, its memory stays a few
pixels-squared arrays at a context of 131,072, and show-mask picks a row with several documents."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from packer.masks import RolePolicy, block_causal_mask, hybrid_mask
from packer.stats import mask_image


def _random_offsets(rng, context_length: int) -> np.ndarray:
    n = int(rng.integers(1, context_length + 1))
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(int(rng.integers(0, 6)), n - 1), replace=False)) if n > 1 else []
    return np.array([0, *cuts, n], dtype=np.int64)


def _brute(dense_nn, n: int, edges):
    """(some, all) of each band pair, from the dense mask padded (False) to the context."""
    length = int(edges[-1])
    dense = np.zeros((length, length), bool)
    dense[:n, :n] = dense_nn
    p = len(edges) - 1
    some, every = np.zeros((p, p), bool), np.zeros((p, p), bool)
    for q in range(p):
        for k in range(p):
            block = dense[edges[q]:edges[q + 1], edges[k]:edges[k + 1]]
            some[q, k], every[q, k] = block.any(), block.all()
    return some, every


def test_block_causal_bands_equal_a_brute_force_downsample():
    rng = np.random.default_rng(0)
    partial = 0
    for _ in range(150):
        context = int(rng.integers(1, 50))
        offsets = _random_offsets(rng, context)
        pixels = int(rng.integers(1, context + 4))
        some, every, doc, edges = mask_image.block_causal_bands(offsets, context, pixels)
        dense = block_causal_mask(offsets)
        b_some, b_every = _brute(dense, int(offsets[-1]), edges)
        assert np.array_equal(some, b_some) and np.array_equal(every, b_every), (offsets.tolist(), context, pixels)
        docs = np.searchsorted(offsets, np.arange(int(offsets[-1])), side="right") - 1
        for q, k in zip(*np.nonzero(some)):  # the colour is a document with an attending pair in the band
            qs, ks = np.arange(edges[q], min(edges[q + 1], offsets[-1])), np.arange(edges[k], min(edges[k + 1], offsets[-1]))
            pairs = dense[np.ix_(qs, ks)]
            assert doc[q, k] in set(docs[ks][pairs.any(axis=0)].tolist())
        assert (doc[~some] == -1).all()
        partial += int((some & ~every).sum())
    assert partial > 20  # bands with only some pairs attending were exercised


def test_role_mask_bands_equal_a_brute_force_downsample(monkeypatch):
    rng = np.random.default_rng(1)
    roles = {"system": 1, "user": 2, "assistant": 3}
    policies = [RolePolicy(role_windows={"user": 2}, global_roles={"system"}), RolePolicy(window=3),
                RolePolicy(role_windows={"assistant": 1, "user": 4})]
    for trial in range(120):
        context = int(rng.integers(2, 50))
        offsets = _random_offsets(rng, context)
        n = int(offsets[-1])
        role_ids = rng.integers(1, 4, size=n)
        policy = policies[trial % len(policies)]
        pixels = int(rng.integers(1, context + 3))
        monkeypatch.setattr(mask_image, "KEY_CHUNK", (2, 5, 8192)[trial // 3 % 3])  # key bands cut into several chunks
        some, every, role, edges = mask_image.role_mask_bands(offsets, role_ids, policy, roles, context, pixels)
        dense = hybrid_mask(offsets, role_ids, policy, roles)
        b_some, b_every = _brute(dense, n, edges)
        assert np.array_equal(some, b_some) and np.array_equal(every, b_every), (offsets.tolist(), context, pixels)
        for q, k in zip(*np.nonzero(some)):  # coloured by the role of a key some query of the band sees
            qs, ks = np.arange(edges[q], min(edges[q + 1], n)), np.arange(edges[k], min(edges[k + 1], n))
            assert role[q, k] in set(role_ids[ks][dense[np.ix_(qs, ks)].any(axis=0)].tolist())
        assert (role[~some] == -1).all()


def test_the_picture_of_a_131072_context_stays_in_bounded_memory(tmp_path):
    pytest.importorskip("matplotlib")
    context = 131_072
    lengths = [40_000, 3, 17_000, 1, 25_000, 9_000, 30_000]  # 121,004 tokens, then padding
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    tracemalloc.start()
    try:
        some, every, doc, edges = mask_image.block_causal_bands(offsets, context)
        _, peak_bands = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        mask_image.write_mask_png(offsets, context, tmp_path / "m.png", title="131,072")
        _, peak_png = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert some.shape == (mask_image.MASK_PIXELS,) * 2
    assert peak_bands < 64 * 2**20 and peak_png < 256 * 2**20, (peak_bands, peak_png)  # the dense mask: 16 GiB
    assert (tmp_path / "m.png").stat().st_size > 0
    assert every[-1, 0] == False and some[10, 0] and not some[10, 11]  # noqa: E712 (numpy bool)


def test_pick_row_prefers_a_typical_row_with_several_documents():
    assert mask_image.pick_row([1, 1, 1, 3, 1, 2, 4, 1]) == 3  # rows of 2 or more: [3, 2, 4], median 3
    assert mask_image.pick_row([1, 1, 1]) == 0  # no row of 2: the first
    assert mask_image.pick_row([9, 2, 3, 3, 3, 8]) == 2  # median 3: not the busiest row 0
