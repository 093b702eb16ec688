"""Elastic resume: a state saved by one rank of a W x K job resumes a W' x K' job on the same global order,
every sequence of the epoch exactly once over the whole job (before + after)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from packer.data import PackedDataset
from packer.store.dataset import open_dataset
from packer.train import data
from packer.train.partition import Progress, job_progress, rank_items, rank_units, unit_positions

_WORKER = {"info": None}


class _Info:
    def __init__(self, i, n):
        self.id, self.num_workers = i, n


@pytest.fixture
def workers(monkeypatch):
    """Run dataset copies as DataLoader worker w of K in this process (what their get_worker_info says)."""
    monkeypatch.setattr(data, "get_worker_info", lambda: _WORKER["info"])
    yield
    _WORKER["info"] = None


def _as(worker, n_workers):
    _WORKER["info"] = _Info(worker, n_workers) if n_workers > 1 else None


def _keys(unit) -> list:
    """Row keys of one unit: a batch's items (collate_fn=_keys_of gives a list) or one item."""
    if isinstance(unit, list):
        return unit
    return [unit["input_ids"].numpy().tobytes()]


def _keys_of(items):
    return [it["input_ids"].numpy().tobytes() for it in items]


def _all_keys(path):
    raw = open_dataset(path)
    return [raw[i][0].astype(np.int64).tobytes() for i in range(len(raw))]


def run_job(make, world, n_workers, take, resume=None, group=1):
    """A synchronous job: every rank takes `take` units (None: all) from its workers round-robin, `group`
    at a time (a DataLoader batching `group` items of one worker). Returns (keys consumed by all ranks,
    the states of rank 0's workers, as a StatefulDataLoader would save them)."""
    consumed, states = [], None
    for rank in range(world):
        copies = []
        for w in range(n_workers):
            ds = make(rank=rank, world_size=world)
            if resume is not None:
                ds.load_state_dict(resume)
            copies.append((ds, iter(ds)))
        live, taken, turn = set(range(n_workers)), 0, 0
        while live and (take is None or taken < take):
            w = turn % n_workers
            turn += 1
            if w not in live:
                continue
            _as(w, n_workers)
            for _ in range(group):
                try:
                    consumed += _keys(next(copies[w][1]))
                    taken += 1
                except StopIteration:
                    live.discard(w)
                    break
        if rank == 0:
            states = []
            for w, (ds, _) in enumerate(copies):
                _as(w, n_workers)
                states.append(ds.state_dict())
    return consumed, states


def _check_once(parts, keys, dropped=0):
    union = sum(parts, [])
    assert len(set(union)) == len(union), "a sequence repeated"
    assert set(union) <= set(keys)
    assert len(keys) - len(union) == dropped, "a sequence skipped"


@pytest.mark.parametrize("batch_size", [None, 4], ids=["items", "batch_size"])
def test_resume_across_world_sizes_reads_every_sequence_once(sample_dataset, workers, batch_size):
    keys = _all_keys(sample_dataset)

    def make(**kw):
        extra = {"batch_size": batch_size, "collate_fn": _keys_of} if batch_size else {}
        return PackedDataset(sample_dataset, seed=3, **extra, **kw)

    global_order, _ = run_job(make, 1, 1, None)
    parts, state = [], None
    for (world, n_workers), take in zip([(2, 2), (3, 1), (1, 3), (2, 2)], [7, 5, 6, None]):
        got, state = run_job(make, world, n_workers, take, resume=state)
        parts.append(got)
        done = sum(map(len, parts))
        assert sorted(sum(parts, [])) == sorted(global_order[:done])  # the consumed set is a prefix
    _check_once(parts, keys)
    assert [len(p) for p in parts[:3]] == [7 * 2 * (batch_size or 1), 5 * 3 * (batch_size or 1),
                                           6 * 1 * (batch_size or 1)]


def test_items_batched_per_worker_leave_holes_that_resume_fills(sample_dataset, workers):
    """Items grouped 5 at a time per worker (DataLoader(batch_size=5) over items): the consumed set is not
    a prefix, but the states of one rank's workers say exactly which positions are taken."""
    keys = _all_keys(sample_dataset)

    def make(**kw):
        return PackedDataset(sample_dataset, seed=4, **kw)

    parts, state = [], None
    for (world, n_workers), take, group in zip([(2, 3), (3, 2), (1, 1)], [20, 15, None], [5, 3, 1]):
        got, state = run_job(make, world, n_workers, take, resume=state, group=group)
        parts.append(got)
    _check_once(parts, keys)


def test_drop_last_resume_drops_less_than_a_world(sample_dataset, workers):
    keys = _all_keys(sample_dataset)

    def make(**kw):
        return PackedDataset(sample_dataset, seed=5, drop_last=True, batch_size=3, collate_fn=_keys_of, **kw)

    first, state = run_job(make, 2, 2, 9)
    rest, _ = run_job(make, 3, 1, None, resume=state)
    union = first + rest
    assert len(set(union)) == len(union) and set(union) <= set(keys)
    remaining = len(keys) - len(first)
    assert len(keys) - len(union) == remaining % 3  # only the new world's drop_last cut


def test_stateful_dataloader_state_resumes_another_shape(sample_dataset):
    """The StatefulDataLoader's own state_dict (every worker's state) goes to PackedDataset.load_state_dict."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    keys = _all_keys(sample_dataset)

    def make(**kw):
        return PackedDataset(sample_dataset, seed=2, batch_size=8, collate_fn=_keys_of, **kw)

    loader = stateful.StatefulDataLoader(make(rank=0, world_size=1), batch_size=None, num_workers=2)
    head = list(itertools.islice(iter(loader), 5))
    state = loader.state_dict()
    parts = [sum(head, [])]
    for rank in range(3):
        ds = make(rank=rank, world_size=3)
        ds.load_state_dict(state)
        parts.append(sum(stateful.StatefulDataLoader(ds, batch_size=None, num_workers=1), []))
    _check_once(parts, keys)
    one = make(rank=0, world_size=1)
    assert sorted(parts[0]) == sorted(sum(list(one)[:5], []))  # the prefix of the global order


def test_one_workers_state_of_many_cannot_resume_elsewhere(sample_dataset, workers):
    _, states = run_job(lambda **kw: PackedDataset(sample_dataset, **kw), 2, 2, 3)
    ds = PackedDataset(sample_dataset, rank=0, world_size=3)
    ds.load_state_dict(states[1])
    with pytest.raises(ValueError, match="pass every worker's state"):
        next(iter(ds))
    ds = PackedDataset(sample_dataset, rank=0, world_size=3, seed=9)
    with pytest.raises(ValueError, match="seed=0"):
        ds.load_state_dict(states)


def test_striping_reads_the_prefix_after_k_units():
    """Pure arithmetic: W ranks x K workers, units of B; after k units per rank the positions read are
    exactly [0, k B W); over the whole epoch each position once, rank_items / rank_units agree."""
    for n, unit, world, k_workers in itertools.product((1, 7, 50, 97), (1, 3, 8), (1, 2, 3), (1, 2, 3)):
        seen = []
        for r in range(world):
            units = np.arange(rank_units(n, unit, world, r))
            pos, sizes = unit_positions(units, n, unit, world, r)
            assert len(pos) == rank_items(n, unit, world, r) and (sizes > 0).all()
            seen += pos.tolist()
            k = len(units) // 2
            head = unit_positions(units[:k], n, unit, world, r)[0]
            assert set(head) == {p for p in range(min(k * unit * world, n)) if p in set(pos)}
        assert sorted(seen) == list(range(n))


def test_progress_maps_and_merges():
    p = Progress(10, 3, ((5, 7),))
    assert len(p) == 5 and p.position(np.arange(5)).tolist() == [3, 4, 7, 8, 9]
    assert p.ranges(1, 4) == [(4, 5), (7, 9)]
    q = p.after(2, [(3, 4)])  # indices 0, 1 (positions 3, 4) and index 3 (position 8)
    assert (q.done, q.holes) == (7, ((8, 9),))
    assert Progress(10).with_holes([(0, 2), (2, 5), (6, 8)]) == Progress(10, 5, ((6, 8),))
    state = {"num_workers": 2, "unit": 2, "world_size": 1, "progress": [10, 0, []], "order_length": 10}
    got = job_progress([{**state, "worker": 0, "units": 2}, {**state, "worker": 1, "units": 0}])
    assert (got.done, got.holes) == (2, ((4, 6),))  # units 0 and 2 of worker 0; unit 1 not yet


def test_a_resumed_worker_saves_its_new_place_before_it_starts(sample_dataset, workers):
    """A worker of the new job that has yielded nothing yet (StatefulDataLoader's startup snapshot) already
    reports the new job's split and the loaded progress, so saving again right away resumes right."""
    _, states = run_job(lambda **kw: PackedDataset(sample_dataset, batch_size=2, **kw), 2, 2, 5)
    _as(0, 1)  # the new job's worker: the main process here
    ds = PackedDataset(sample_dataset, batch_size=2, rank=1, world_size=3)
    ds.load_state_dict(states)
    fresh = ds.state_dict()
    assert (fresh["rank"], fresh["world_size"], fresh["num_workers"], fresh["units"]) == (1, 3, 1, 0)
    assert job_progress([fresh]) == job_progress(states) and job_progress(states).done == 5 * 2 * 2
