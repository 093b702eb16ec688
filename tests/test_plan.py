"""Plan: long-document splitting, policies, shuffled bins, shard boundaries."""

from __future__ import annotations

import numpy as np

from packer.plan import plan_bins, split_documents


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
