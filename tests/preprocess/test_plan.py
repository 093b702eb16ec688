"""Plan: long-document splitting, policies, shuffled bins, shard boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from packer.binpack import pack, split_documents
from packer.config import BuildConfig
from packer.preprocess.plan import _shard_boundaries, pack_groups, plan_bins


def test_split_documents_hand_case():
    doc, offset, length = split_documents([3, 10], 4)
    assert doc.tolist() == [0, 1, 1, 1]
    assert offset.tolist() == [0, 0, 4, 8]
    assert length.tolist() == [3, 4, 4, 2]


def _plan(unit_lengths, **kw):
    args = {"context_length": 8, "seed": 0, "shard_size": 16, **kw}
    return plan_bins([np.asarray(x, dtype=np.int64) for x in unit_lengths], **args)


def test_plan_covers_every_token_once():
    rng = np.random.default_rng(1)
    units = [rng.integers(1, 30, size=n) for n in (5, 0, 9, 3)]
    plan = _plan(units)
    # Rebuild (unit, token) coverage from the plan and compare with the unit files' extents.
    covered = {u: np.zeros(int(x.sum()), dtype=int) for u, x in enumerate(units)}
    for u, start, n in zip(plan.piece_unit, plan.piece_start, plan.piece_len):
        covered[int(u)][start : start + n] += 1
    assert all((c == 1).all() for c in covered.values())
    seq_tokens = np.add.reduceat(plan.piece_len, plan.seq_starts[:-1])
    assert seq_tokens.max() <= 8
    shard_tokens = [seq_tokens[a:b].sum() for a, b in zip(plan.shard_starts[:-1], plan.shard_starts[1:])]
    assert max(shard_tokens) <= 16 and plan.shard_starts[-1] == plan.n_sequences


def test_truncate_and_drop_report_what_they_removed():
    units = [[3, 12, 8, 20]]
    t = _plan(units, long_docs="truncate")
    assert t.n_truncated_tokens == (12 - 8) + (20 - 8)
    assert t.piece_len.sum() == 3 + 8 + 8 + 8
    d = _plan(units, long_docs="drop")
    assert d.n_dropped_docs == 2
    assert sorted(d.piece_doc.tolist()) == [0, 2]


def test_seed_changes_order_not_bins():
    units = [np.random.default_rng(2).integers(1, 8, size=200)]
    a, b = _plan(units, seed=0), _plan(units, seed=1)

    def rows(p):
        return [tuple(sorted(p.piece_doc[s:e].tolist())) for s, e in zip(p.seq_starts[:-1], p.seq_starts[1:])]

    assert rows(a) != rows(b)
    assert sorted(rows(a)) == sorted(rows(b))


def _shard_boundaries_loop(seq_tokens, shard_size):
    """Reference: the per-sequence greedy loop the vectorized version replaced."""
    starts, filled = [0], 0
    for s, n in enumerate(seq_tokens):
        if filled and filled + n > shard_size:
            starts.append(s)
            filled = 0
        filled += n
    return starts + [len(seq_tokens)] if len(seq_tokens) else starts


def test_shard_boundaries_hand_case_and_loop_reference():
    assert _shard_boundaries(np.array([5, 5, 5, 5]), 12).tolist() == [0, 2, 4]
    assert _shard_boundaries(np.array([], dtype=np.int64), 12).tolist() == [0]
    assert _shard_boundaries(np.array([20, 1, 20]), 12).tolist() == [0, 1, 2, 3]  # oversized: alone
    rng = np.random.default_rng(3)
    multi = 0
    for _ in range(300):
        seq_tokens = rng.integers(1, 40, size=int(rng.integers(0, 60)))
        shard_size = int(rng.integers(1, 200))
        got = _shard_boundaries(seq_tokens, shard_size).tolist()
        assert got == _shard_boundaries_loop(seq_tokens.tolist(), shard_size)
        multi += any(b - a > 1 for a, b in zip(got[:-1], got[1:]))
    assert multi > 100  # shards of several sequences were exercised


def test_pack_groups_packs_each_group_alone_and_numbers_on():
    piece_doc = np.array([0, 0, 1, 2, 3, 3, 4])
    piece_len = np.array([8, 2, 5, 3, 8, 1, 6])
    bins = pack_groups(piece_len, piece_doc, 8, "ffd", 2)
    # groups: docs {0,1} = pieces [0, 3), docs {2,3} = [3, 6), doc {4} = [6, 7); each packed alone
    assert bins[:3].tolist() == pack(piece_len[:3], 8).tolist()
    assert bins[3:6].tolist() == (pack(piece_len[3:6], 8) + 2).tolist()
    assert bins[6:].tolist() == (pack(piece_len[6:], 8) + 4).tolist()
    assert pack_groups(piece_len, piece_doc, 8, "bfd", 5).tolist() == pack(piece_len, 8, "bfd").tolist()
    assert pack_groups(piece_len, piece_doc, 8, "ffd", None).tolist() == pack(piece_len, 8).tolist()


def test_grouped_plan_keeps_groups_apart_and_covers_every_token():
    rng = np.random.default_rng(4)
    units = [rng.integers(1, 30, size=n) for n in (40, 0, 35, 25)]
    global_plan = _plan(units, shard_size=64)
    for group in (1, 7, 30, 100, 1000):
        plan = _plan(units, shard_size=64, pack_group=group)
        for a, b in zip(plan.seq_starts[:-1], plan.seq_starts[1:]):
            assert len(set((plan.piece_doc[a:b] // group).tolist())) == 1  # one group per sequence
        assert plan.piece_len.sum() == global_plan.piece_len.sum()
        assert plan.n_sequences >= global_plan.n_sequences - 1
        covered = {u: np.zeros(int(x.sum()), dtype=int) for u, x in enumerate(units)}
        for u, start, n in zip(plan.piece_unit, plan.piece_start, plan.piece_len):
            covered[int(u)][start : start + n] += 1
        assert all((c == 1).all() for c in covered.values())
    assert _plan(units, shard_size=64, pack_group=1).n_sequences > global_plan.n_sequences


def test_pack_group_is_validated():
    assert BuildConfig(pack_group=10_000).pack_group == 10_000
    for bad in (0, -5, 2.5, True, "100"):
        with pytest.raises(ValueError, match="pack_group must be a whole number of documents >= 1"):
            BuildConfig(pack_group=bad)


def test_build_passes_pack_group_to_the_plan(tmp_path, sample_dataset):
    from conftest import build_sample

    from packer.store.manifest import read_manifest

    grouped = build_sample(tmp_path / "grouped", pack_group=20, shard_size=200_000)
    whole = read_manifest(sample_dataset)  # the same corpus and context, packed all at once
    assert grouped["config"]["pack_group"] == 20 and whole["config"]["pack_group"] is None
    assert grouped["totals"]["tokens_out"] == whole["totals"]["tokens_out"]
    assert grouped["totals"]["sequences"] > whole["totals"]["sequences"]  # groups of 20 docs waste room
