"""PackedDataset(balance=Balance(...)): each step's rows dealt to ranks by cost, every row still once per epoch
over ranks x workers, the same on every rank, resumable mid-epoch and at another world size; balance=None is
today's order, byte for byte."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_elastic import _WORKER, _all_keys, _as, _check_once, _keys_of, run_job

from packer.data import Balance, CostModel, PackedDataset
from packer.store.dataset import open_dataset
from packer.train import data
from packer.train.order import epoch_order
from packer.train.partition import rank_units, unit_positions

ATTENTION = CostModel(per_token=1.0, per_pair=1.0)  # at context 1024, squared lengths dominate: uneven rows


def _costs(path) -> np.ndarray:
    """Every stored row's cost under ATTENTION, by a plain loop over its documents."""
    raw = open_dataset(path)
    out = []
    for i in range(len(raw)):
        docs = np.diff(raw[i][1].astype(np.int64))
        out.append(float(docs.sum()) + float((docs * docs).sum()))
    return np.array(out)


def _split(rank, world, worker=0, n_workers=1):
    return {"rank": rank, "world_size": world, "worker": worker, "num_workers": n_workers}


@pytest.fixture
def workers(monkeypatch):
    """Dataset copies run as DataLoader worker w of K in this process (test_elastic's `_as` sets which)."""
    monkeypatch.setattr(data, "get_worker_info", lambda: _WORKER["info"])
    yield
    _WORKER["info"] = None


def test_balance_none_is_todays_order_byte_for_byte(sample_dataset):
    """Without balance, items, batches and the state are those of the plain order: row epoch_order(p) at position
    p, striped batch-major (the code before balancing)."""
    raw = open_dataset(sample_dataset)
    n = len(raw)
    for world, batch in [(1, None), (3, None), (2, 4)]:
        unit = batch or 1
        for rank in range(world):
            ds = PackedDataset(sample_dataset, seed=7, epoch=1, rank=rank, world_size=world, batch_size=batch,
                               balance=None)
            positions, _ = unit_positions(np.arange(rank_units(n, unit, world, rank)), n, unit, world, rank)
            expected = epoch_order(positions, n, "full", 7, 1)
            assert ds.epoch_rows(_split(rank, world)).tolist() == expected.tolist()
            got = b"".join(it["input_ids"].numpy().tobytes() for it in ds) if batch is None else \
                b"".join(b["input_ids"].numpy().tobytes() for b in ds)
            assert got == b"".join(raw[int(r)][0].astype(np.int64).tobytes() for r in expected)
            assert ":balance:" not in ds.state_dict()["order"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(1, 6), n_workers=st.integers(1, 3), window=st.integers(1, 5), micro=st.integers(1, 3),
       batch=st.sampled_from([None, 1, 2]), drop_last=st.booleans())
def test_every_row_once_per_epoch_over_ranks_and_workers(sample_dataset, world, n_workers, window, micro, batch,
                                                         drop_last):
    rows = micro * (batch or 1)
    balance = Balance(cost=ATTENTION, rows_per_rank=rows, window=window)
    parts = []
    for rank in range(world):
        ds = PackedDataset(sample_dataset, seed=1, rank=rank, world_size=world, batch_size=batch, balance=balance,
                           drop_last=drop_last)
        parts += [ds.epoch_rows(_split(rank, world, w, n_workers)) for w in range(n_workers)]
    got = np.concatenate(parts)
    n = len(open_dataset(sample_dataset))
    assert len(set(got.tolist())) == len(got) == (n // world * world if drop_last else n)
    assert got.min() >= 0 and got.max() < n


def test_the_order_is_seeded_the_same_on_every_rank_and_moves_rows_within_windows(sample_dataset):
    balance = Balance(cost=ATTENTION, rows_per_rank=2, window=4)

    def rows(seed, **kw):
        ds = PackedDataset(sample_dataset, seed=seed, rank=0, world_size=1, balance=balance, **kw)
        return ds.epoch_rows(_split(0, 1))

    plain = PackedDataset(sample_dataset, seed=3, rank=0, world_size=1).epoch_rows(_split(0, 1))
    again, other = rows(3), rows(4)
    assert rows(3).tolist() == again.tolist() and other.tolist() != again.tolist()
    assert again.tolist() != plain.tolist()
    for start in range(0, len(plain), 8):  # a window: 4 steps x 1 rank x 2 rows, the same rows, dealt again
        assert sorted(again[start:start + 8].tolist()) == sorted(plain[start:start + 8].tolist())


def test_every_ranks_step_costs_about_the_same(sample_dataset):
    """Steps of 8 ranks x 1 row: each step's slowest rank over its mean, balanced against dealt in the shuffled
    order (the costs summed independently, from each row's offsets)."""
    costs = _costs(sample_dataset)
    world = 8

    def per_step(balance):
        parts = [PackedDataset(sample_dataset, seed=0, rank=r, world_size=world, balance=balance,
                               drop_last=True).epoch_rows(_split(r, world)) for r in range(world)]
        return np.stack([costs[p] for p in parts], axis=1)  # [step, rank]

    plain, balanced = per_step(None), per_step(Balance(cost=ATTENTION, window=16))
    busy = [float(x.mean(axis=1).sum() / x.max(axis=1).sum()) for x in (plain, balanced)]
    assert busy[0] < 0.85 and busy[1] > 0.95, busy


def test_micro_batches_are_dealt_by_cost_too(sample_dataset, workers):
    """rows_per_rank=4 in batches of 2: a rank's step is two batches (micro-batches). Their costs spread less than
    in the shuffled order, and the rank's steps far less (the rows of this sample are nearly two-valued at
    context 1024: one whole document, or many short ones, so a window cannot make every micro-batch alike)."""
    costs = _costs(sample_dataset)
    keys = {k: i for i, k in enumerate(_all_keys(sample_dataset))}

    def spreads(balance):
        ds = PackedDataset(sample_dataset, seed=2, rank=1, world_size=2, batch_size=2, collate_fn=_keys_of,
                           balance=balance)
        micro = np.array([sum(costs[keys[k]] for k in b) for b in ds])
        micro = micro[: len(micro) // 2 * 2]
        steps = micro.reshape(-1, 2).sum(axis=1)
        return micro.std() / micro.mean(), steps.std() / steps.mean()

    (micro, steps), (micro_before, steps_before) = spreads(Balance(cost=ATTENTION, rows_per_rank=4, window=8)), \
        spreads(None)
    assert micro < 0.8 * micro_before and steps < 0.4 * steps_before


def test_items_follow_epoch_rows_through_workers(sample_dataset, workers):
    keys = _all_keys(sample_dataset)
    balance = Balance(cost=ATTENTION, rows_per_rank=3, window=2)
    for w in range(2):
        _as(w, 2)
        ds = PackedDataset(sample_dataset, rank=1, world_size=3, balance=balance)
        got = [it["input_ids"].numpy().tobytes() for it in ds]
        assert got == [keys[r] for r in ds.epoch_rows(_split(1, 3, w, 2))]


def test_small_chunks_deal_the_same_windows(sample_dataset, workers, monkeypatch):
    """Blocks of 4 rows and chunks of one block: windows straddle chunks, and each chunk reads only the windows
    it needs; the items are still those of the whole epoch's balanced order."""
    keys = _all_keys(sample_dataset)
    balance = Balance(cost=ATTENTION, rows_per_rank=2, window=3)
    whole = [PackedDataset(sample_dataset, rank=r, world_size=3, balance=balance).epoch_rows(_split(r, 3))
             for r in range(3)]
    monkeypatch.setattr(data, "BLOCK_TOKENS", 4 * 1024)
    monkeypatch.setattr(data, "BALANCE_SPAN", 8)
    for r in range(3):
        ds = PackedDataset(sample_dataset, rank=r, world_size=3, balance=balance)
        assert [it["input_ids"].numpy().tobytes() for it in ds] == [keys[k] for k in whole[r]]


@pytest.mark.parametrize("batch_size", [None, 2], ids=["items", "batch_size"])
def test_resume_mid_epoch_is_exact(sample_dataset, batch_size):
    balance = Balance(cost=ATTENTION, rows_per_rank=4, window=3)
    extra = {"batch_size": batch_size, "collate_fn": _keys_of} if batch_size else {}

    def make():
        return PackedDataset(sample_dataset, seed=5, rank=1, world_size=2, balance=balance, **extra)

    whole = list(make())
    ds = make()
    it = iter(ds)
    head = [next(it) for _ in range(37)]
    state = ds.state_dict()
    again = make()
    again.load_state_dict(state)
    rest = list(again)
    flat = (lambda xs: [x["input_ids"].numpy().tobytes() for x in xs]) if batch_size is None else (lambda xs: xs)
    assert flat(head) + flat(rest) == flat(whole)


@pytest.mark.parametrize("batch_size, group", [(None, 1), (3, 1), (None, 4)], ids=["items", "batches", "holes"])
def test_elastic_resume_reads_every_row_once(sample_dataset, workers, batch_size, group):
    """(2x2) -> (3x1) -> (1x3) -> (2x2) ranks x workers, each job dealing its own windows: no row twice, none
    skipped; with items grouped per worker the consumed set has holes inside a window."""
    keys = _all_keys(sample_dataset)
    balance = Balance(cost=ATTENTION, rows_per_rank=batch_size or 2, window=3)

    def make(**kw):
        extra = {"batch_size": batch_size, "collate_fn": _keys_of} if batch_size else {}
        return PackedDataset(sample_dataset, seed=3, balance=balance, **extra, **kw)

    parts, state = [], None
    for (world, n_workers), take in zip([(2, 2), (3, 1), (1, 3), (2, 2)], [7, 5, 6, None]):
        got, state = run_job(make, world, n_workers, take, resume=state, group=group if take else 1)
        parts.append(got)
    _check_once(parts, keys)
    with pytest.raises(ValueError, match="balance"):  # another balance is another order: at an epoch boundary
        PackedDataset(sample_dataset, seed=3, rank=0, world_size=2).load_state_dict(state)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3)), min_size=2, max_size=3),
       takes=st.lists(st.integers(1, 9), min_size=2, max_size=2), window=st.integers(1, 6), micro=st.integers(1, 3))
def test_any_chain_of_elastic_resumes_reads_every_row_once(sample_dataset, workers, shapes, takes, window, micro):
    """Jobs of any ranks x workers, each stopped after a few batches and resumed by the next: with balancing no
    row is read twice or skipped over the chain."""
    keys = _all_keys(sample_dataset)
    balance = Balance(cost=ATTENTION, rows_per_rank=2 * micro, window=window)

    def make(**kw):
        return PackedDataset(sample_dataset, seed=8, batch_size=2, collate_fn=_keys_of, balance=balance, **kw)

    parts, state = [], None
    for (world, n_workers), take in zip(shapes, takes[: len(shapes) - 1] + [None]):
        got, state = run_job(make, world, n_workers, take, resume=state)
        parts.append(got)
    _check_once(parts, keys)


def test_a_blend_keeps_its_samples(sample_dataset):
    """Over a blend (upsampled: rows repeat) balancing deals the same samples: the epoch's multiset is unchanged."""
    def rows(balance):
        parts = []
        for rank in range(3):
            ds = PackedDataset([sample_dataset, sample_dataset], weights=[0.7, 0.3], num_samples=1000, seed=2,
                               rank=rank, world_size=3, balance=balance)
            parts.append(ds.epoch_rows(_split(rank, 3)))
        return np.concatenate(parts)

    plain, balanced = rows(None), rows(Balance(cost=ATTENTION, window=4))
    assert sorted(plain.tolist()) == sorted(balanced.tolist()) and plain.tolist() != balanced.tolist()
    assert len(plain) == 1000 and balanced.max() >= len(open_dataset(sample_dataset))  # both datasets read


def test_stateful_dataloader_workers_with_balancing(sample_dataset):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    keys = _all_keys(sample_dataset)
    balance = Balance(cost=ATTENTION, rows_per_rank=4, window=4)

    def make(**kw):
        return PackedDataset(sample_dataset, seed=2, batch_size=4, collate_fn=_keys_of, balance=balance, **kw)

    loader = stateful.StatefulDataLoader(make(rank=0, world_size=1), batch_size=None, num_workers=2)
    head = list(itertools.islice(iter(loader), 5))
    parts = [sum(head, [])]
    state = loader.state_dict()
    for rank in range(2):
        ds = make(rank=rank, world_size=2)
        ds.load_state_dict(state)
        parts.append(sum(ds, []))
    _check_once(parts, keys)


def test_rows_per_rank_must_be_whole_batches(sample_dataset):
    with pytest.raises(ValueError, match="batch_size=3: .* use rows_per_rank=3"):
        PackedDataset(sample_dataset, batch_size=3, balance=Balance(rows_per_rank=2))
    with pytest.raises(ValueError, match="Balance"):
        PackedDataset(sample_dataset, balance="yes")


def test_a_streamed_dataset_is_dealt_as_the_local_one(sample_dataset, s3_uri):
    """Over S3 (moto) the costs come from the streamed rows: the same balanced batches as the local copy, and a
    mid-epoch resume of the streamed loader continues them."""
    from packer.io import fs

    uri = s3_uri("balance/ds")
    for file in sorted(sample_dataset.iterdir()):
        fs.upload(file, fs.location(uri) / file.name)
    balance = Balance(cost=ATTENTION, rows_per_rank=4, window=4)

    def make(path):
        return PackedDataset(path, seed=6, rank=1, world_size=2, batch_size=4, collate_fn=_keys_of, balance=balance)

    local = list(make(sample_dataset))
    assert list(make(uri)) == local
    streamed = make(uri)
    it = iter(streamed)
    head = [next(it) for _ in range(11)]
    again = make(uri)
    again.load_state_dict(streamed.state_dict())
    assert head + list(again) == local
