"""Streamed planning: groups and buckets as tasks, one plan file per shard, against the in-memory plan_bins."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE_INPUTS, TOKENIZER, undated

from packer.binpack import pack, split_documents
from packer.config import BuildConfig
from packer.io import failpoints
from packer.preprocess.executors import make_executor
from packer.preprocess.plan import Plan, plan_bins
from packer.preprocess.plan_groups import (
    GROUP_BYTES_PER_DOC,
    PLAN_DIR,
    group_size,
    plan_streamed,
    plan_tasks,
    stable_order,
)

ROOT = Path(__file__).resolve().parents[2]


def _units(tmp_path, unit_lengths):
    units = tmp_path / "work" / "units"
    units.mkdir(parents=True, exist_ok=True)
    for u, x in enumerate(unit_lengths):
        np.save(units / f"unit-{u:06d}.lengths.npy", np.asarray(x, dtype=np.int64))
    return tmp_path / "work"


def _streamed(tmp_path, unit_lengths, workers=1, source_units=(0,), **config):
    work = _units(tmp_path, unit_lengths)
    cfg = BuildConfig(**{"context_length": 8, "shard_size": 16, **config})
    executor = make_executor(workers)
    try:
        index = plan_streamed([len(x) for x in unit_lengths], cfg, work, executor, source_units)
    finally:
        executor.close()
    plans = [Plan.load(index.shard_path(work / PLAN_DIR, k)) for k in range(index.n_shards)]
    return index, plans


def _rows(plans):
    """Every sequence in output order as a tuple of (doc, unit, start, len) pieces."""
    return [tuple(zip(p.piece_doc[a:b].tolist(), p.piece_unit[a:b].tolist(), p.piece_start[a:b].tolist(),
                      p.piece_len[a:b].tolist()))
            for p in plans for a, b in zip(p.seq_starts[:-1], p.seq_starts[1:])]


def _random_units(seed, n_units=5, top=30):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, top, size=int(rng.integers(0, 60))) for _ in range(n_units)]


def test_plan_tasks_hand_case():
    groups, buckets = plan_tasks([3, 4, 2], [0, 2], 4)
    assert [(g.source, g.d0, g.d1, g.units) for g in groups] == [
        (0, 0, 4, ((0, 0, 3), (1, 0, 1))), (0, 4, 7, ((1, 1, 4),)), (1, 7, 9, ((2, 0, 2),))]
    assert [(b.source, b.bucket, b.local, b.groups, b.group_docs) for b in buckets] == [
        (0, 0, 0, (0, 1), (0, 4)), (0, 1, 1, (0, 1), (0, 4)), (1, 2, 0, (2,), (7,))]
    assert [g.n_buckets for g in groups] == [2, 2, 1]


@pytest.mark.parametrize("case", range(8))
def test_one_group_is_exactly_plan_bins(tmp_path, case):
    """No group size: the same sequences in the same order, and the same shards, as the in-memory plan."""
    units = _random_units(case)
    cfg = {"seed": case, "algorithm": ("ffd", "bfd")[case % 2], "long_docs": ("split", "truncate", "drop")[case % 3],
           "shard_size": (16, 40)[case % 2]}
    index, plans = _streamed(tmp_path, units, **cfg)
    ref = plan_bins([np.asarray(x, np.int64) for x in units], context_length=8, **cfg)
    ref_plans = [Plan(ref.piece_unit, ref.piece_start, ref.piece_len, ref.piece_doc, ref.seq_starts,
                      ref.shard_starts[k : k + 2])
                 for k in range(ref.n_shards)]
    ref_rows = [tuple(zip(ref.piece_doc[a:b].tolist(), ref.piece_unit[a:b].tolist(), ref.piece_start[a:b].tolist(),
                          ref.piece_len[a:b].tolist())) for a, b in zip(ref.seq_starts[:-1], ref.seq_starts[1:])]
    assert _rows(plans) == ref_rows
    assert index.n_shards == ref.n_shards and index.shard_sequences.tolist() == np.diff(ref.shard_starts).tolist()
    assert len(ref_plans) == len(plans)
    assert (index.n_truncated_tokens, index.n_dropped_docs) == (ref.n_truncated_tokens, ref.n_dropped_docs)
    assert index.n_tokens == int(ref.piece_len.sum()) and index.n_pieces == len(ref.piece_len)


@pytest.mark.parametrize("group", [4, 9, 25, 60])
def test_many_groups_keep_every_token_once(tmp_path, group):
    units = _random_units(100 + group, n_units=6)
    lengths = np.concatenate(units)
    index, plans = _streamed(tmp_path, units, pack_group=group, seed=group)
    covered = {u: np.zeros(int(x.sum()), dtype=int) for u, x in enumerate(units)}
    first_doc = np.concatenate([[0], np.cumsum([len(x) for x in units])])
    rows = _rows(plans)
    for row in rows:
        assert sum(n for *_, n in row) <= 8
        assert len({d // group for d, *_ in row}) == 1  # a sequence is one group's bin
        for d, u, start, n in row:
            assert first_doc[u] <= d < first_doc[u + 1]
            covered[u][start : start + n] += 1
    assert all((c == 1).all() for c in covered.values())
    assert index.n_tokens == int(lengths.sum()) == sum(n for row in rows for *_, n in row)
    for p in plans:  # each plan file is one shard, within the shard size (or one sequence)
        assert p.n_shards == 1 and (p.piece_len.sum() <= 16 or p.n_sequences == 1)
    assert index.n_sequences == len(rows) and len(rows) >= 2 * (lengths.sum() // 8) // 2


@pytest.mark.parametrize("long_docs", ["split", "truncate", "drop"])
def test_sequence_stats_are_the_rows_sums(tmp_path, long_docs):
    """Each sequence's summary (what stats.json and its step-balance table read) against its pieces in the
    shard plans: tokens, pieces, and the sum of the pieces' squared lengths (a split long document's pieces
    each count as a document of the row); several groups and buckets, long documents included."""
    units = [np.random.default_rng(7).integers(1, 20, size=int(n)) for n in (90, 0, 130, 70)]
    index, plans = _streamed(tmp_path, units, pack_group=60, seed=4, long_docs=long_docs)
    got = index.sequence_stats(tmp_path / "work" / PLAN_DIR)
    rows = _rows(plans)
    assert index.n_buckets > 1 and any(len(row) > 1 for row in rows) and max(np.concatenate(units)) > 8
    assert got["seq_tokens"].tolist() == [sum(n for *_, n in row) for row in rows]
    assert got["seq_docs"].tolist() == [len(row) for row in rows]
    assert got["seq_sq"].tolist() == [sum(n * n for *_, n in row) for row in rows]
    assert int(got["seq_sq"].sum()) == index.piece_sq_sum
    parts = list(index.bucket_stats(tmp_path / "work" / PLAN_DIR))
    assert len(parts) == index.n_buckets and all(p["seq_sq"].dtype == np.int64 for p in parts)


def test_a_plan_without_squares_gives_stats_without_the_table(tmp_path, monkeypatch):
    """A resumed build whose buckets were planned by a packer before seq_sq: stats.json as before, no
    step-balance table, on both of finalize's paths (the other buckets' squares are not half used)."""
    from packer.stats import streamed

    units = [np.random.default_rng(8).integers(1, 20, size=int(n)) for n in (90, 130, 70)]
    index, _ = _streamed(tmp_path, units, pack_group=60, seed=4)
    plan_dir = tmp_path / "work" / PLAN_DIR

    def stats():
        return streamed.finalize_stats(lambda: iter(units), index, plan_dir, 8, algorithm="ffd", seed=4,
                                       n_documents=290)

    assert len(stats()["step_balance"]["cases"]) == 3  # 8 and 64 ranks, 64 x 4 rows: not 512 ranks
    with np.load(plan_dir / "bucket-000001.stats.npz") as z:
        old = {k: z[k] for k in z.files if k != "seq_sq"}
    np.savez(plan_dir / "bucket-000001.stats.npz", **old)
    assert sorted(index.sequence_stats(plan_dir)) == ["seq_docs", "seq_split", "seq_tokens"]
    arrays = stats()
    monkeypatch.setattr(streamed, "STREAM_ABOVE", 0)
    assert "step_balance" not in arrays and "step_balance" not in stats() and arrays["packing"]["sequences"] > 64


def test_shuffle_is_a_bijection_of_the_grouped_bins(tmp_path):
    """The bins are exactly those of packing each group alone (pack_groups), each once, in an
    order that mixes the groups: the first shard already holds bins of several groups."""
    units = [np.random.default_rng(5).integers(1, 8, size=400)]
    index, plans = _streamed(tmp_path, units, pack_group=50, seed=3)
    piece_doc, _, piece_len = split_documents(units[0], 8)
    from packer.preprocess.plan import pack_groups

    bins = pack_groups(piece_len, piece_doc, 8, "ffd", 50)
    expected = sorted(tuple(sorted(piece_doc[bins == b].tolist())) for b in range(int(bins.max()) + 1))
    got = [tuple(sorted(d for d, *_ in row)) for row in _rows(plans)]
    assert sorted(got) == expected and len(got) == len(expected)
    first_groups = {row[0][0] // 50 for row in _rows(plans)[:10]}  # the first ten sequences
    assert len(first_groups) >= 3
    group_of_row = [row[0][0] // 50 for row in _rows(plans)]
    assert group_of_row != sorted(group_of_row)


def test_order_is_independent_of_the_worker_count(tmp_path):
    units = _random_units(9, n_units=8)
    one = _rows(_streamed(tmp_path / "a", units, workers=1, pack_group=20)[1])
    two = _rows(_streamed(tmp_path / "b", units, workers=2, pack_group=20)[1])
    assert one == two and len(one) > 10
    a = sorted(p.name for p in (tmp_path / "a" / "work" / PLAN_DIR).iterdir())
    assert a == sorted(p.name for p in (tmp_path / "b" / "work" / PLAN_DIR).iterdir())
    for name in a:
        assert (tmp_path / "a" / "work" / PLAN_DIR / name).read_bytes() == (tmp_path / "b" / "work" / PLAN_DIR / name).read_bytes()


def test_sources_are_planned_apart(tmp_path):
    units = _random_units(11, n_units=6)
    first_doc = np.concatenate([[0], np.cumsum([len(x) for x in units])])
    index, plans = _streamed(tmp_path, units, source_units=(0, 2, 5), pack_group=15)
    ranges = index.source_ranges()
    assert [r["shards"] for r in ranges][0][0] == 0 and ranges[-1]["shards"][1] == index.n_shards
    seq = 0
    for s, r in enumerate(ranges):
        lo, hi = first_doc[(0, 2, 5)[s]], first_doc[(2, 5, 6)[s]]
        shard_rows = [_rows([plans[k]]) for k in range(*r["shards"])]
        n = sum(len(x) for x in shard_rows)
        assert r["sequences"] == [seq, seq + n]
        seq += n
        docs = sorted(d for rows in shard_rows for row in rows for d, *_ in row)
        assert set(docs) == set(range(lo, hi))  # every document of the source, none of another
    assert seq == index.n_sequences
    # One source is the whole corpus: the same plan as without sources.
    one = _rows(_streamed(tmp_path / "one", units, source_units=(0,), pack_group=15)[1])
    assert one == _rows(_streamed(tmp_path / "none", units, pack_group=15)[1])


def test_single_source_of_many_is_its_own_plan(tmp_path):
    """A source alone, ungrouped, holds the bins plan_bins packs for its documents."""
    units = _random_units(12, n_units=4)
    index, plans = _streamed(tmp_path, units, source_units=(0, 2))
    r = index.source_ranges()[1]
    got = sorted(tuple(sorted(d for d, *_ in row)) for k in range(*r["shards"]) for row in _rows([plans[k]]))
    base = sum(len(x) for x in units[:2])
    lengths = np.concatenate(units[2:])
    piece_doc, _, piece_len = split_documents(lengths, 8)
    bins = pack(piece_len, 8)
    assert got == sorted(tuple(sorted((base + piece_doc[bins == b]).tolist())) for b in range(int(bins.max()) + 1))


def test_group_size_and_config():
    assert group_size(None, None) is None and group_size(10, None) == 10
    assert group_size(None, 2_000_000) == 2_000_000 // GROUP_BYTES_PER_DOC and group_size(None, 1) == 1
    assert BuildConfig(plan_memory=10**9).plan_memory == 10**9
    assert "plan_memory" not in BuildConfig().to_dict()
    with pytest.raises(ValueError, match="give one of them"):
        BuildConfig(pack_group=5, plan_memory=10**9)
    with pytest.raises(ValueError, match="plan_memory must be a whole number of bytes"):
        BuildConfig(plan_memory=0)


def test_bad_source_units_are_refused(tmp_path):
    with pytest.raises(ValueError, match="source_units must ascend from 0"):
        _streamed(tmp_path, _random_units(1, n_units=3), source_units=(1, 2))


def _build(out, extra=(), kill_at=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(failpoints.ENV, None)
    if kill_at:
        env[failpoints.ENV] = f"{kill_at}=kill"
    cmd = [sys.executable, "-m", "packer", "build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--output", str(out),
           "--context-length", "512", "--shard-size", "40000", "--pack-group", "400", "--workers", "1", *extra]
    with tempfile.TemporaryFile("w+") as log:
        code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=300).returncode
        log.seek(0)
        return code, log.read()


def _files(out):
    import json

    found = {}
    for p in sorted(out.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "manifest.json":
                m = json.loads(data)
                m.pop("created_unix"), m.pop("build_seconds")
                data = json.dumps(m, sort_keys=True).encode()
            if p.name == ".packer-owned.json":  # packer's record of its files: without their modification times,
                record = json.loads(data)       # nor the manifest's size and sha256 (its timestamps change them)
                for name, entry in record["files"].items():
                    entry.pop("mtime_ns")
                    if name in ("manifest.json", "report.html"):  # the page's date changes it too
                        del entry["sha256"], entry["bytes"]
                data = json.dumps(record, sort_keys=True).encode()
            if p.name == "report.html":
                data = undated(data)
            found[str(p.relative_to(out))] = data
    return found


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["group:3", "bucket:2", "planned:5"])
def test_resume_after_a_kill_during_planning(tmp_path, kill_at):
    code, _ = _build(tmp_path / "whole")
    assert code == 0
    code, log = _build(tmp_path / "killed", kill_at=kill_at)
    assert code != 0, log
    work = tmp_path / "killed" / "_work" / PLAN_DIR
    assert any(work.glob("group-*.json")) and not (tmp_path / "killed" / "manifest.json").exists()
    code, log = _build(tmp_path / "killed")
    assert code == 0, log
    assert _files(tmp_path / "killed") == _files(tmp_path / "whole")


def test_stable_order_is_a_stable_argsort():
    rng = np.random.default_rng(4)
    for top in (3, 2**16, 2**20, 2**31, 2**40):
        key = rng.integers(0, top, size=5000)
        assert stable_order(key).tolist() == np.argsort(key, kind="stable").tolist()
    assert stable_order(np.zeros(0, np.int64)).tolist() == []
