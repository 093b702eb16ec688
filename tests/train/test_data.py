"""Items and collates against token-by-token references; PackedDataset's epoch order, rank and
worker partitions, drop_last, and mid-epoch resume (plain, per-worker, StatefulDataLoader)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from packer import masks  # noqa: E402
from packer.data import BlockShuffle, ItemFields, PackedDataset, collate_padded, collate_varlen, make_item, make_items  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.train import data  # noqa: E402
from packer.train import items as train_items  # noqa: E402


def _random_row(rng, max_docs=6, max_len=12):
    lengths = rng.integers(1, max_len, size=rng.integers(1, max_docs))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return rng.integers(0, 60000, size=int(offsets[-1])).astype(np.uint16), offsets


def _reference_item(tokens, offsets, pad_to, pad_id, with_mask=True):
    """The item built token by token, with plain Python lists."""
    n = len(tokens)
    length = n if pad_to is None else pad_to
    segments = [(int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:])] + ([(n, length)] if length > n else [])
    ids, labels, pos, doc = [], [], [], []
    for d, (a, b) in enumerate(segments):
        for t in range(a, b):
            token = int(tokens[t]) if t < n else pad_id
            ids.append(token)
            labels.append(-100 if t == a or t >= n else token)
            pos.append(t - a)
            doc.append(d)
    item = {"input_ids": ids, "labels": labels, "position_ids": pos, "document_ids": doc,
            "cu_seqlens": [a for a, _ in segments] + [length], "max_seqlen": max(b - a for a, b in segments)}
    if with_mask:
        item["attention_mask"] = [[doc[i] == doc[j] and j <= i for j in range(length)] for i in range(length)]
    return item


def _as_lists(item):
    return {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in item.items()}


def test_hand_item_with_padding():
    item = make_item(np.array([5, 6, 7, 8, 9], np.uint16), np.array([0, 3, 5], np.int32), pad_to=7, pad_id=1,
                     return_document_ids=True, return_attention_mask=True)
    assert _as_lists(item) == {
        "input_ids": [5, 6, 7, 8, 9, 1, 1],
        "labels": [-100, 6, 7, -100, 9, -100, -100],
        "position_ids": [0, 1, 2, 0, 1, 0, 1],
        "document_ids": [0, 0, 0, 1, 1, 2, 2],
        "cu_seqlens": [0, 3, 5, 7],
        "max_seqlen": 3,
        "attention_mask": _reference_item([5, 6, 7, 8, 9], [0, 3, 5], 7, 1)["attention_mask"],
    }
    assert item["input_ids"].dtype == item["labels"].dtype == item["position_ids"].dtype == torch.int64
    assert item["cu_seqlens"].dtype == torch.int32 and item["attention_mask"].dtype == torch.bool
    assert item["attention_mask"].any(dim=1).all()  # padding rows attend to padding: no empty row


def test_random_items_against_token_by_token_reference():
    rng = np.random.default_rng(0)
    padded = multi_doc = 0
    for _ in range(100):
        rows = [_random_row(rng) for _ in range(rng.integers(1, 6))]
        pad_to = None if rng.random() < 0.4 else max(len(t) for t, _ in rows) + int(rng.integers(0, 5))
        items = make_items([t for t, _ in rows], [o for _, o in rows], pad_to=pad_to, pad_id=3,
                           return_document_ids=True, return_attention_mask=True)
        for (tokens, offsets), item in zip(rows, items):
            assert _as_lists(item) == _reference_item(tokens, offsets, pad_to, 3)
            assert _as_lists(make_item(tokens, offsets, pad_to=pad_to, pad_id=3, return_document_ids=True,
                                       return_attention_mask=True)) == _as_lists(item)
            padded += pad_to is not None and pad_to > len(tokens)
            multi_doc += len(offsets) > 2
    assert padded > 50 and multi_doc > 100
    with pytest.raises(ValueError, match="pad_to=3 is shorter than a row of 5"):
        make_item(np.arange(5), [0, 5], pad_to=3)


def test_collate_varlen_flattens_and_merges():
    rng = np.random.default_rng(1)
    for order in ("block", "shuffled"):  # consecutive block items take the no-copy path
        rows = [_random_row(rng) for _ in range(6)]
        items = make_items([t for t, _ in rows], [o for _, o in rows], return_document_ids=True)
        if order == "shuffled":
            items = items[::-1]
        batch = collate_varlen(items)
        refs = [_reference_item(t, o, None, 0, False) for t, o in (rows[::-1] if order == "shuffled" else rows)]
        for key in ("input_ids", "labels", "position_ids"):
            assert batch[key].shape == (1, sum(len(r["input_ids"]) for r in refs))
            assert batch[key][0].tolist() == sum((r[key] for r in refs), [])
        boundaries, start = [0], 0
        for r in refs:
            boundaries += [start + c for c in r["cu_seqlens"][1:]]
            start += len(r["input_ids"])
        assert batch["cu_seqlens"].tolist() == boundaries and batch["cu_seqlens"].dtype == torch.int32
        assert batch["max_seqlen"] == max(r["max_seqlen"] for r in refs)
        doc = batch["document_ids"][0]
        assert doc.tolist() == [i for i in range(len(boundaries) - 1) for _ in range(boundaries[i + 1] - boundaries[i])]
    one = collate_varlen(items[:1])
    assert one["cu_seqlens"].tolist() == items[0]["cu_seqlens"].tolist()
    with pytest.raises(ValueError, match="collate_padded"):
        collate_varlen(make_items([rows[0][0]], [rows[0][1]], return_attention_mask=True))


def test_collate_padded_stacks_rows():
    rng = np.random.default_rng(2)
    rows = [_random_row(rng) for _ in range(4)]
    L = max(len(t) for t, _ in rows) + 2
    for items in (make_items([t for t, _ in rows], [o for _, o in rows], pad_to=L, return_attention_mask=True,
                             return_document_ids=True),
                  [make_item(t, o, pad_to=L, return_attention_mask=True, return_document_ids=True) for t, o in rows]):
        batch = collate_padded(items)
        refs = [_reference_item(t, o, L, 0) for t, o in rows]
        for key in ("input_ids", "labels", "position_ids", "document_ids", "attention_mask"):
            assert batch[key].tolist() == [r[key] for r in refs]
        assert batch["attention_mask"].shape == (4, L, L)
        assert batch["cu_seqlens"].tolist() == [0] + [b * L + c for b, r in enumerate(refs) for c in r["cu_seqlens"][1:]]
    with pytest.raises(ValueError, match="set pad_to"):
        collate_padded(make_items([t for t, _ in rows], [o for _, o in rows]))


def test_permute_is_a_seeded_bijection():
    for n in (1, 2, 3, 5, 64, 1000, 4097):
        order = data.permute(np.arange(n), n, seed=0, epoch=0)
        assert sorted(order.tolist()) == list(range(n))
        assert data.permute(np.arange(n)[::-1], n, 0, 0).tolist() == order[::-1].tolist()  # pointwise
    a, b, c = (data.permute(np.arange(5000), 5000, s, e) for s, e in ((0, 0), (0, 1), (1, 0)))
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert abs(np.corrcoef(np.arange(5000), a)[0, 1]) < 0.05  # no trace of the stored order


# -- PackedDataset on the sample build -----------------------------------------------------


def _keys_of(items):
    return [it["input_ids"].numpy().tobytes() for it in items]


def _all_keys(path):
    raw = open_dataset(path)
    keys = [raw[i][0].astype(np.int64).tobytes() for i in range(len(raw))]
    assert len(set(keys)) == len(keys)  # every stored row is distinct, so tokens identify it
    return keys


def test_items_follow_loader_semantics(sample_dataset):
    raw = open_dataset(sample_dataset)
    ds = PackedDataset(sample_dataset, shuffle=False, fields=ItemFields(pad_to=1024))
    seen_pad = 0
    for i, item in enumerate(ds):
        tokens, offsets = raw[i]
        assert _as_lists(item) == {k: v for k, v in _reference_item(tokens, offsets, 1024, ds.pad_id, False).items()
                                   if k in item}
        seen_pad += len(tokens) < 1024
    assert seen_pad > 0 and i == len(raw) - 1


def _collect(dataset, num_workers):
    loader = DataLoader(dataset, batch_size=16, num_workers=num_workers, collate_fn=_keys_of)
    return [key for batch in loader for key in batch]


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_ranks_and_workers_partition_the_epoch(sample_dataset, num_workers):
    keys = _all_keys(sample_dataset)
    for world in (1, 2, 3):
        for drop_last in (False, True):
            parts = [_collect(PackedDataset(sample_dataset, seed=3, rank=r, world_size=world, drop_last=drop_last),
                              num_workers) for r in range(world)]
            union = sum(parts, [])
            assert len(set(union)) == len(union)  # disjoint
            assert set(union) <= set(keys)
            if drop_last:
                assert len({len(p) for p in parts}) == 1 and len(keys) - len(union) < world
                assert len(keys) - len(union) == len(keys) % world
            else:
                assert sorted(union) == sorted(keys)
            for r, part in enumerate(parts):
                assert len(part) == len(PackedDataset(sample_dataset, rank=r, world_size=world, drop_last=drop_last))
    assert len(keys) % 3 != 0  # drop_last really dropped something at world size 3


def test_epochs_reshuffle_and_repeat(sample_dataset):
    ds = PackedDataset(sample_dataset, seed=3)
    first = _keys_of(ds)
    assert _keys_of(ds) == first  # same epoch, same order
    ds.set_epoch(1)
    second = _keys_of(ds)
    assert second != first and sorted(second) == sorted(first)
    assert _keys_of(PackedDataset(sample_dataset, seed=4)) != first
    stored = _keys_of(PackedDataset(sample_dataset, shuffle=False))
    assert stored == _all_keys(sample_dataset) and first != stored


def test_resume_after_k_items_yields_the_tail(sample_dataset):
    full = _keys_of(PackedDataset(sample_dataset, seed=5, epoch=2))
    for k in (0, 1, 37, len(full) - 1, len(full)):
        ds = PackedDataset(sample_dataset, seed=5, epoch=2)
        it = iter(ds)
        head = [next(it)["input_ids"].numpy().tobytes() for _ in range(k)]
        state = ds.state_dict()
        resumed = PackedDataset(sample_dataset, seed=5)  # epoch comes from the state
        resumed.load_state_dict(state)
        assert head + _keys_of(resumed) == full
        assert _keys_of(resumed) == full  # the resume applies once; the next pass is whole


def test_resume_per_worker_state(sample_dataset, monkeypatch):
    """Each DataLoader worker's copy saves and restores its own place (StatefulDataLoader's model)."""
    class Info:
        def __init__(self, i, n):
            self.id, self.num_workers = i, n

    n_workers = 3
    for worker in range(n_workers):
        monkeypatch.setattr(data, "get_worker_info", lambda: Info(worker, n_workers))
        full = _keys_of(PackedDataset(sample_dataset, seed=1, rank=1, world_size=2))
        ds = PackedDataset(sample_dataset, seed=1, rank=1, world_size=2)
        it = iter(ds)
        head = [next(it)["input_ids"].numpy().tobytes() for _ in range(10 + worker)]
        resumed = PackedDataset(sample_dataset, seed=1, rank=1, world_size=2)
        resumed.load_state_dict(ds.state_dict())
        assert head + _keys_of(resumed) == full
    monkeypatch.setattr(data, "get_worker_info", lambda: Info(0, 2))
    resumed = PackedDataset(sample_dataset, seed=1, rank=1, world_size=2)
    resumed.load_state_dict(ds.state_dict())
    with pytest.raises(ValueError, match="saved with worker=2, num_workers=3; this loader has worker=0, num_workers=2"):
        next(iter(resumed))


@pytest.mark.parametrize("batched", [False, True], ids=["items", "batch_size"])
def test_stateful_dataloader_resumes_with_workers(sample_dataset, batched):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader(ds):
        if batched:  # the dataset makes the batches (of its own items' keys, so they compare)
            return stateful.StatefulDataLoader(ds, batch_size=None, num_workers=2)
        return stateful.StatefulDataLoader(ds, batch_size=8, num_workers=2, collate_fn=_keys_of)

    def dataset():
        return PackedDataset(sample_dataset, seed=2, **({"batch_size": 8, "collate_fn": _keys_of} if batched else {}))

    full = [b for b in loader(dataset())]
    it = iter(first := loader(dataset()))
    head = [next(it) for _ in range(7)]
    state = first.state_dict()
    del it
    second = loader(dataset())
    second.load_state_dict(state)
    assert head + list(second) == full


def test_set_epoch_drops_a_state_of_another_epoch(sample_dataset):
    ds = PackedDataset(sample_dataset, seed=1)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    resumed = PackedDataset(sample_dataset, seed=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # same epoch: the resume stands
    assert len(_keys_of(resumed)) == len(ds) - 1
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    assert len(_keys_of(resumed)) == len(ds)


def test_views_path_equals_row_by_row(sample_dataset):
    """read_rows uses `ds.views` where the dataset has it, `ds[i]` otherwise: the same items."""
    raw = open_dataset(sample_dataset)

    class WithViews:
        def __getitem__(self, i):
            raise AssertionError("views should be used")

        def views(self, indices):
            return raw.views(indices)

    class RowByRow:
        def __getitem__(self, i):
            return raw[i]

    picks = np.array([5, 0, 700, 5, 13])
    expected = [_as_lists(make_item(*raw[i], pad_to=1024)) for i in picks]
    for ds in (WithViews(), RowByRow()):
        got = train_items.make_items(*data.read_rows(ds, picks), pad_to=1024)
        assert [_as_lists(it) for it in got] == expected


def test_bad_arguments_say_what_to_do(sample_dataset):
    with pytest.raises(ValueError, match="context length 1024"):
        PackedDataset(sample_dataset, fields=ItemFields(pad_to=1000))
    with pytest.raises(ValueError, match="rank and world_size together"):
        PackedDataset(sample_dataset, rank=1)
    with pytest.raises(ValueError, match=r"rank=2 must be in \[0, world_size=2\)"):
        PackedDataset(sample_dataset, rank=2, world_size=2)
    with pytest.raises(FileNotFoundError):
        PackedDataset(sample_dataset / "missing")


def test_buffer_pool_never_hands_out_memory_in_use():
    pool = train_items._BufferPool(size=2)
    a = pool.take(10)
    a[:] = 1
    b = pool.take(10)  # a is alive: a different buffer
    assert not np.shares_memory(a, b)
    t = torch.from_numpy(a[:5])  # a tensor view keeps it alive too
    del a
    c = pool.take(10)
    assert not np.shares_memory(c, t.numpy()) and not np.shares_memory(c, b)
    del t, c
    d = pool.take(10)  # now the first buffer is free again, and reused
    assert len(pool.buffers) == 2 and any(np.shares_memory(d, x) for x in pool.buffers)


def test_batches_cross_worker_processes_intact(sample_dataset):
    """Batches are views of pooled block buffers; moved to shared memory they must arrive whole."""
    def batches(num_workers):
        loader = DataLoader(PackedDataset(sample_dataset, seed=7, fields=ItemFields(pad_to=1024)), batch_size=8,
                            num_workers=num_workers,
                            collate_fn=collate_varlen)
        out = []
        for batch in loader:
            assert torch.equal(batch["position_ids"][0], masks.position_ids(batch["cu_seqlens"]))
            rows = zip(batch["input_ids"].view(-1, 1024), batch["labels"].view(-1, 1024))  # items padded to 1024
            out += [(ids.numpy().tobytes(), labels.numpy().tobytes()) for ids, labels in rows]
        return out

    local, remote = batches(0), batches(2)
    assert len(local) == len(PackedDataset(sample_dataset)) and sorted(local) == sorted(remote)


def _same_batches(got, expected):
    assert len(got) == len(expected) and len(got) > 0
    for g, e in zip(got, expected):
        assert g.keys() == e.keys()
        for key in e:
            if isinstance(e[key], torch.Tensor):
                assert g[key].dtype == e[key].dtype and torch.equal(g[key], e[key]), key
            else:
                assert g[key] == e[key], key


class _FromPlainDicts:
    """`collate` of the items as plain dicts: its item-by-item path (torch.cat, merged cu_seqlens),
    independent of the block slicing that PackedDataset(batch_size=...) uses."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, items):
        return self.collate([dict(it) for it in items])


def _by_a_function(items):  # not one of the two built-in collates: the items path
    return {"n": len(items), "ids": collate_varlen(items)["input_ids"]}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_size_yields_the_dataloaders_batches(sample_dataset, num_workers):
    """PackedDataset(batch_size=B) through DataLoader(batch_size=None, any num_workers) gives the batches
    that DataLoader(batch_size=B, collate_fn=...) makes of the items without workers: for both built-in collates (cut
    from blocks), another collate (built from items), document ids, padding and the short last batch."""
    cases = [(3, collate_varlen, {}), (8, collate_varlen, {"fields": ItemFields(document_ids=True)}),
             (5, collate_padded, {"fields": ItemFields(pad_to=1024, document_ids=True)}), (4, _by_a_function, {}),
             (2, collate_padded, {"fields": ItemFields(pad_to=1024, attention_mask=True), "shuffle": False})]
    if num_workers:
        cases = cases[:2]
    for size, collate, kw in cases:
        items = PackedDataset(sample_dataset, seed=7, **kw)
        batched = PackedDataset(sample_dataset, seed=7, batch_size=size, collate_fn=collate, **kw)
        n = 3 if "fields" in kw and kw["fields"].attention_mask else None  # dense masks: a prefix is enough
        # The rank's batches are its units of the global order, whichever worker cuts them: with workers too
        # they equal the item loader's batches without workers (item loaders with workers batch each
        # worker's own items, a different grouping).
        expected = list(itertools.islice(DataLoader(items, batch_size=size, collate_fn=_FromPlainDicts(collate)), n))
        got = list(itertools.islice(DataLoader(batched, batch_size=None, num_workers=num_workers), n))
        _same_batches(got, expected)
        if num_workers == 0 and n is None:
            assert len(batched) == len(got)
    assert len(items) % 8 != 0  # the last batch was short


def test_batch_size_padded_needs_equal_rows(sample_dataset):
    ds = PackedDataset(sample_dataset, batch_size=4, collate_fn=collate_padded)
    with pytest.raises(ValueError, match="item lengths differ .* set pad_to"):
        list(ds)
    with pytest.raises(ValueError, match="batch_size=0 must be at least 1"):
        PackedDataset(sample_dataset, batch_size=0)
    with pytest.raises(ValueError, match="collate_fn is used only with batch_size"):
        PackedDataset(sample_dataset, collate_fn=collate_padded)


def test_batch_size_resumes_after_k_batches(sample_dataset):
    full = list(PackedDataset(sample_dataset, seed=5, batch_size=6))
    for k in (0, 1, 17, len(full) - 1, len(full)):
        ds = PackedDataset(sample_dataset, seed=5, batch_size=6)
        it = iter(ds)
        head = [next(it) for _ in range(k)]
        state = ds.state_dict()
        assert state["yielded"] == min(6 * k, len(PackedDataset(sample_dataset)))
        resumed = PackedDataset(sample_dataset, seed=5, batch_size=6)
        resumed.load_state_dict(state)
        _same_batches(head + list(resumed), full)


# -- block shuffle and read-ahead hints ------------------------------------------------------


def test_block_order_is_a_bijection_reading_whole_blocks():
    from packer.train.order import block_order, spread

    for n, block, window in ((1, 4, 2), (10, 2, 2), (97, 8, 3), (1000, 16, 4), (1024, 16, 4), (5, 8, 4)):
        order = block_order(np.arange(n), n, block, window, seed=1, epoch=0)
        assert sorted(order.tolist()) == list(range(n))
        assert block_order(np.arange(n)[::-1], n, block, window, 1, 0).tolist() == order[::-1].tolist()  # pointwise
        blocks, seen, p = order // block, [], 0  # windows: runs of `window` blocks, each block whole
        while p < n:
            ids = {int(blocks[p])}
            q = p
            while q < n and (len(ids | {int(blocks[q])}) <= window):
                ids.add(int(blocks[q]))
                q += 1
            chunk = order[p:q]
            assert set(chunk.tolist()) == {r for b in ids for r in range(b * block, min((b + 1) * block, n))}
            seen += chunk.tolist()
            p = q
        assert sorted(seen) == list(range(n))
    n = 20_000
    full = data.permute(np.arange(n), n, 0, 0)
    blocked = block_order(np.arange(n), n, 64, 16, 0, 0)
    assert block_order(np.arange(n), n, 64, 16, 0, 1).tolist() != blocked.tolist()  # reshuffled per epoch
    assert abs(spread(full, n, 64) - 1) < 0.02
    assert abs(spread(blocked, n, 64) - (1 - 1 / 16)) < 0.03
    assert spread(np.arange(n), n, 64) < 0.01


def test_block_shuffle_loads_and_hints_reads(sample_dataset):
    keys = _all_keys(sample_dataset)
    ds = PackedDataset(sample_dataset, shuffle=BlockShuffle(block=8, window=4), seed=1)
    hints = []
    ds._open()[0].prefetch = lambda rows, reset, calls=None: hints.append((np.asarray(rows).copy(), reset))
    got = _keys_of(ds)
    assert sorted(got) == sorted(keys) and got != keys
    assert np.concatenate([rows for rows, _ in hints]).tolist() == ds.epoch_rows(ds.split()).tolist()  # in order
    assert [reset for _, reset in hints] == [True] + [False] * (len(hints) - 1)  # the epoch's first chunk starts anew
    stored = [keys.index(k) for k in got[:32]]  # the first window: 4 blocks of 8 stored rows
    assert len({r // 8 for r in stored}) == 4
    with pytest.raises(ValueError, match="is not an order"):
        PackedDataset(sample_dataset, shuffle="blocks")
    named = PackedDataset(sample_dataset, shuffle="block", seed=1)  # the name: BlockShuffle's default sizes
    assert _keys_of(named) == _keys_of(PackedDataset(sample_dataset, shuffle=BlockShuffle(), seed=1)) != got
    assert named.state_dict()["shuffle"] == ds.state_dict()["shuffle"] == "block"  # states keep their plain form
    with pytest.raises(ValueError, match="both must be at least 1"):
        BlockShuffle(block=0)


def test_item_fields_pad_id_overrides_the_manifests(sample_dataset):
    stored = PackedDataset(sample_dataset, shuffle=False, fields=ItemFields(pad_to=1030))
    own = PackedDataset(sample_dataset, shuffle=False, fields=ItemFields(pad_to=1030, pad_id=7))
    n_padded = 0
    for a, b in zip(stored, own):
        pad = a["input_ids"] != b["input_ids"]
        assert (a["input_ids"][pad] == stored.pad_id).all() and (b["input_ids"][pad] == 7).all()
        assert all(torch.equal(a[k], b[k]) for k in ("labels", "position_ids", "cu_seqlens"))
        n_padded += int(pad.sum() > 0)
    assert n_padded > 0 and stored.pad_id != 7
    with pytest.raises(ValueError, match="pad_to must be a number of tokens >= 1"):
        ItemFields(pad_to=0)
