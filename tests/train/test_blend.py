"""Blending: weighted sources interleaved with exact prefix proportions, per-source passes, resume, source ids."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import build_sample
from test_elastic import _keys_of, run_job, workers  # noqa: F401  (workers: a fixture)

from packer.data import ItemFields, PackedDataset
from packer.store.dataset import open_dataset
from packer.train import blend as blend_module
from packer.train.blend import Blend, Source, apportion, greedy_pattern


@pytest.fixture(scope="module")
def two_datasets(sample_dataset, tmp_path_factory):
    """The sample build (context 1024) and a second, different one (context 512)."""
    other = tmp_path_factory.mktemp("blend") / "short"
    build_sample(other, context_length=512)
    return {"long": sample_dataset, "short": other}


@pytest.fixture(scope="module")
def named_sources(sample_dataset, tmp_path_factory):
    """The sample build with its rows named as two sources, as a build with named sources records them."""
    out = tmp_path_factory.mktemp("named") / "ds"
    shutil.copytree(sample_dataset, out)
    manifest = json.loads((out / "manifest.json").read_text())
    n = manifest["totals"]["sequences"]
    manifest["sources"] = [{"name": "head", "sequences": [0, 100]}, {"name": "tail", "sequences": [100, n]}]
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def _prefix_error(picks: np.ndarray, weights: np.ndarray) -> float:
    """max over sources and prefixes n of |count_s(n) - w_s n|."""
    n = np.arange(1, len(picks) + 1)
    return max(float(np.abs(np.cumsum(picks == s) - w * n).max()) for s, w in enumerate(weights))


def test_greedy_keeps_every_prefix_within_one_sample():
    rng = np.random.default_rng(0)
    cases = [np.array([0.5, 0.3, 0.2]), np.array([0.5] + [0.05] * 10)] + [rng.dirichlet(np.ones(k)) for k in
                                                                         (2, 3, 5, 8, 13) for _ in range(3)]
    for weights in cases:
        counts = apportion(weights, 50_000)
        picks, occurrence = greedy_pattern(tuple(counts.tolist()))
        assert np.bincount(picks, minlength=len(counts)).tolist() == counts.tolist()
        assert _prefix_error(picks, counts / counts.sum()) <= 1  # every prefix of the whole period
        for s in range(len(counts)):  # occurrence numbers count each source's picks
            assert occurrence[picks == s].tolist() == list(range(counts[s]))


def test_tiled_periods_keep_the_bound_and_passes_repeat_only_across(monkeypatch):
    monkeypatch.setattr(blend_module, "PERIOD", 997)
    sources = [Source("a", 0, 0, 40), Source("b", 0, 40, 1040), Source("c", 1, 0, 7)]
    b = Blend(sources, [0.3, 0.5, 0.2], 10_000)  # 'c' upsampled ~285x, 'a' 75x, 'b' 5x
    positions = np.arange(b.length)
    source, k = b.samples(positions)
    assert _prefix_error(source, b.weights) <= 1  # over all 10 000 prefixes, ten periods
    assert np.abs(b.weights - [0.3, 0.5, 0.2]).max() <= 1 / 997
    for shuffle in ("full", "block", "none"):
        datasets, rows, src = b.rows(positions, shuffle, seed=1, epoch=0, block=4, window=2)
        for s, spec in enumerate(sources):
            mine = rows[src == s]
            assert (datasets[src == s] == spec.dataset).all() and ((mine >= spec.start) & (mine < spec.end)).all()
            n = spec.end - spec.start
            for p in range(len(mine) // n):  # each full pass: every row once
                assert sorted(mine[p * n:(p + 1) * n].tolist()) == list(range(spec.start, spec.end))
            tail = mine[len(mine) // n * n:]
            assert len(set(tail.tolist())) == len(tail)
            if shuffle != "none" and len(mine) >= 2 * n:
                assert mine[:n].tolist() != mine[n:2 * n].tolist()  # a fresh order each pass


def test_blended_order_is_one_global_order_over_ranks_and_workers(two_datasets, workers):  # noqa: F811
    weights = {"long": 0.7, "short": 0.3}

    def make(**kw):
        return PackedDataset(two_datasets, weights=weights, seed=1, batch_size=4, collate_fn=_keys_of,
                             fields=ItemFields(source_ids=False), **kw)

    whole, _ = run_job(make, 1, 1, None)
    assert len(whole) == make().n_sequences == sum(len(open_dataset(p)) for p in two_datasets.values())
    for world, n_workers in ((2, 2), (3, 1)):
        got, _ = run_job(make, world, n_workers, None)
        assert sorted(got) == sorted(whole)  # the union over ranks is the blend, exactly
        head, _ = run_job(make, world, n_workers, 5)
        assert sorted(head) == sorted(whole[:5 * 4 * world])  # a prefix of it
    again, _ = run_job(make, 1, 1, None)
    assert again == whole


def test_blend_resumes_mid_epoch_also_elastically(two_datasets, workers):  # noqa: F811
    def make(**kw):
        return PackedDataset(two_datasets, weights=[2, 1], num_samples=1500, seed=2, **kw)

    whole, _ = run_job(make, 1, 1, None)
    first, state = run_job(make, 2, 2, 40)
    rest, _ = run_job(make, 3, 1, None, resume=state)
    assert sorted(first + rest) == sorted(whole) and len(whole) == 1500
    ds = make()
    it = iter(ds)
    head = [next(it)["input_ids"].numpy().tobytes() for _ in range(333)]
    resumed = make()
    resumed.load_state_dict(ds.state_dict())
    assert head + [x["input_ids"].numpy().tobytes() for x in resumed] == whole
    changed = PackedDataset(two_datasets, weights=[1, 1], num_samples=1500, seed=2)
    with pytest.raises(ValueError, match="a changed order"):
        changed.load_state_dict(state)


def test_permute_groups_equals_one_permute_per_group():
    from packer.train.order import permute, permute_groups

    rng = np.random.default_rng(3)
    sizes = [1, 2, 7, 40, 1000, 2**20 + 3]
    epochs = [(0, s, p) for s, p in zip(range(len(sizes)), (0, 3, 1, 0, 2, 0))]
    group = rng.integers(0, len(sizes), 5000)
    positions = np.array([rng.integers(0, sizes[g]) for g in group.tolist()])
    got = permute_groups(positions, group, sizes, 5, epochs)
    for g, (n, e) in enumerate(zip(sizes, epochs)):
        assert got[group == g].tolist() == permute(positions[group == g], n, 5, e).tolist()
    assert permute_groups(np.zeros(0, np.int64), np.zeros(0, np.int64), [], 5, []).tolist() == []


def test_blend_rows_equal_one_order_per_source_and_pass(monkeypatch):
    """The vectorized map against its definition: sample k of source s is row k % n_s of pass k // n_s's order."""
    from packer.train.order import epoch_order

    monkeypatch.setattr(blend_module, "PERIOD", 997)
    sources = [Source("a", 0, 0, 40), Source("b", 0, 40, 1040), Source("c", 1, 0, 7)]
    b = Blend(sources, [0.3, 0.5, 0.2], 10_000)
    positions = np.random.default_rng(0).permutation(b.length)[:3000]
    source, k = b.samples(positions)
    for shuffle in ("full", "block", "none"):
        datasets, rows, src = b.rows(positions, shuffle, seed=2, epoch=4, block=4, window=2)
        assert src.tolist() == source.tolist()
        for i in range(0, len(positions), 7):
            s, spec = int(source[i]), sources[int(source[i])]
            n = spec.end - spec.start
            local = epoch_order(np.array([k[i] % n]), n, shuffle, 2, (4, s, int(k[i]) // n), 4, 2)
            assert (int(datasets[i]), int(rows[i])) == (spec.dataset, spec.start + int(local[0]))


def test_blended_read_puts_each_row_back_in_place(two_datasets):
    ds = PackedDataset(two_datasets, weights=[1, 1], num_samples=300)
    dss = [open_dataset(p) for p in two_datasets.values()]
    datasets, rows, _ = ds._rows_at(np.arange(300))
    tokens, offsets, masks = ds._read(datasets, rows)
    assert masks is None and len(tokens) == len(offsets) == 300
    for t, o, d, r in zip(tokens, offsets, datasets.tolist(), rows.tolist()):
        want_t, want_o = dss[d][r]
        assert t.tolist() == want_t.tolist() and o.tolist() == want_o.tolist()


def test_source_ids_name_the_dataset_of_each_token(two_datasets):
    keys = {name: {open_dataset(p)[i][0].astype(np.int64).tobytes() for i in range(len(open_dataset(p)))}
            for name, p in two_datasets.items()}
    ds = PackedDataset(two_datasets, weights={"long": 1, "short": 3}, num_samples=800,
                       fields=ItemFields(source_ids=True))
    assert ds.source_names == ["long", "short"]
    counts = [0, 0]
    for item in ds:
        sid = item["source_ids"]
        assert sid.dtype == torch.int64 and sid.shape == item["input_ids"].shape and (sid == sid[0]).all()
        assert item["input_ids"].numpy().tobytes() in keys[ds.source_names[int(sid[0])]]
        counts[int(sid[0])] += 1
    assert counts == [200, 600]
    batch = next(iter(PackedDataset(two_datasets, weights=[1, 1], batch_size=3, fields=ItemFields(source_ids=True))))
    assert batch["source_ids"].shape == batch["input_ids"].shape


def test_named_sources_of_one_dataset(named_sources):
    ds = PackedDataset(named_sources, weights={"head": 0.5, "tail": 0.5}, num_samples=600, batch_size=6,
                       collate_fn=lambda items: [(int(it["source_ids"][0]), it) for it in items],
                       fields=ItemFields(source_ids=True))
    assert ds.source_names == ["head", "tail"]
    raw = open_dataset(named_sources)
    head = {raw[i][0].astype(np.int64).tobytes() for i in range(100)}
    seen = [0, 0]
    for batch in ds:
        for s, item in batch:
            seen[s] += 1
            assert (item["input_ids"].numpy().tobytes() in head) == (s == 0)
    assert seen == [300, 300]  # 'head' (100 rows) three passes
    plain = PackedDataset(named_sources, shuffle=False, fields=ItemFields(source_ids=True))
    assert [int(it["source_ids"][0]) for it in plain][99:101] == [0, 1]
    with pytest.raises(ValueError, match="not sources of"):
        PackedDataset(named_sources, weights={"web": 1})


def test_hf_batches_over_a_blend(two_datasets):
    from packer.train.hf import HFBatches

    ds = PackedDataset(two_datasets, weights=[1, 1], num_samples=64, rank=0, world_size=2,
                       fields=ItemFields(source_ids=True))
    batches = list(HFBatches(ds, 4, return_row_ids=True))
    assert len(batches) == len(HFBatches(ds, 4)) and sum(len(b["row_ids"]) for b in batches) == 32
    assert all(b["source_ids"].shape == b["input_ids"].shape for b in batches)


def test_per_source_loss_example_logs_each_source(two_datasets, one_torch_thread):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "per_source_loss", Path(__file__).resolve().parents[2] / "examples" / "per_source_loss.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    lines = []
    losses = example.train(two_datasets, {"long": 0.5, "short": 0.5}, steps=3, batch_size=2, dim=32,
                           log=lines.append)
    assert set(losses) == {"long", "short"} and all(0 < v < 20 for v in losses.values())
    assert "long" in lines[0] and "short" in lines[0]
    # the per-source sums add up to the batch's loss
    torch.manual_seed(0)
    logits, labels = torch.randn(10, 7), torch.tensor([-100, 1, 2, 3, -100, 4, 5, 6, 1, 2])
    sources = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 0, 0])
    token_loss = torch.nn.functional.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="none")
    sums, counts = example.source_losses(token_loss, labels, sources, 2)
    assert counts.tolist() == [5, 3] and torch.isclose(sums.sum() / counts.sum(), token_loss[labels[1:] != -100].mean())
