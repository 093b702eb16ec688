"""HF `datasets` maps a built Arrow dataset as it is: `Dataset.from_file(shard)` and, with the two small
files `arrow.derived_files` gives, `load_from_disk(DIR)`; nothing allocated, nothing in datasets' cache,
and every row (input_ids, offsets, doc_ids) equal to open_dataset's and to PackedDataset's items."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from conftest import build_sample

from packer.store.dataset import open_dataset
from packer.store.formats import arrow
from packer.store.verify import verify_dataset

datasets = pytest.importorskip("datasets")

COPY_SLACK_BYTES = 4096  # what "no copy" allows: the rows themselves are megabytes


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sample corpus at context 1024 in 4 shards, with state.json and dataset_info.json next to them
    (the files the build's finalize writes)."""
    out = tmp_path_factory.mktemp("hfds") / "ds"
    manifest = build_sample(out, workers=1, shard_size=200_000)
    for name, data in arrow.derived_files(manifest["shards"]).items():
        (out / name).write_bytes(data)
    return out


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """datasets' cache directory for this test, empty; the test asserts it stays so."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return cache


def _shards(path) -> list[str]:
    return [str(path / s["file"]) for s in json.loads((path / "manifest.json").read_text())["shards"]]


def _stored(path) -> list[tuple[list, list, list]]:
    """(input_ids, offsets, doc_ids) of every row as open_dataset reads it, in stored order."""
    ds = open_dataset(path)
    rows, doc_ids, d = [], ds.doc_ids().tolist(), 0
    for tokens, offsets in ds:
        n = len(offsets) - 1
        rows.append((tokens.tolist(), offsets.tolist(), doc_ids[d : d + n]))
        d += n
    return rows


def _hf_rows(view) -> list[tuple[list, list, list]]:
    return [(r["input_ids"], r["offsets"], r["doc_ids"]) for r in view]


def _opened_and_read(open_view):
    """(view, bytes pyarrow allocated) for opening a view and reading a row of it as numpy."""
    before = pa.total_allocated_bytes()
    view = open_view()
    row = view.with_format("numpy")[len(view) // 2]
    assert len(row["input_ids"]) == row["offsets"][-1] > 0  # (the numpy formatter widens ids to int64)
    return view, pa.total_allocated_bytes() - before


def test_from_file_maps_each_shard_without_a_copy(built, empty_cache):
    stored, rows, cached = _stored(built), [], []
    for shard in _shards(built):
        view, allocated = _opened_and_read(lambda: datasets.Dataset.from_file(shard))
        assert allocated < COPY_SLACK_BYTES
        cached += view.cache_files
        rows += _hf_rows(view)
    assert cached == [{"filename": f} for f in _shards(built)]  # the shards themselves, mapped
    assert len(cached) == 4 and rows == stored and any(len(r[2]) > 1 for r in rows)
    assert not empty_cache.exists()


def test_load_from_disk_maps_the_whole_dataset_in_stored_order(built, empty_cache):
    view, allocated = _opened_and_read(lambda: datasets.load_from_disk(str(built)))
    assert allocated < COPY_SLACK_BYTES
    assert view.cache_files == [{"filename": f} for f in _shards(built)]
    assert view.features == datasets.Features({"input_ids": datasets.List(datasets.Value("uint16")),
                                               "offsets": datasets.List(datasets.Value("int32")),
                                               "doc_ids": datasets.List(datasets.Value("int64"))})
    assert _hf_rows(view) == _stored(built)
    assert not empty_cache.exists()
    assert verify_dataset(built)["sequences"] == len(view)  # the two JSON files change nothing packer reads
    _, copied = _opened_and_read(lambda: datasets.load_from_disk(str(built), keep_in_memory=True))
    assert copied > 1_000_000  # the measure sees a copy: keep_in_memory reads the 1.5 MB of shards into memory


def test_hf_rows_equal_packed_dataset_items(built):
    """PackedDataset (stored order) and load_from_disk give the same rows: input_ids, and offsets as cu_seqlens."""
    torch = pytest.importorskip("torch")
    from packer.data import PackedDataset

    view = datasets.load_from_disk(str(built)).with_format("numpy")
    items = list(PackedDataset(built, shuffle=False))
    assert len(items) == len(view) > 100
    for item, row in zip(items, view):
        assert item["input_ids"].dtype == torch.int64
        assert np.array_equal(item["input_ids"].numpy(), row["input_ids"])
        assert np.array_equal(item["cu_seqlens"].numpy(), row["offsets"])


def test_derived_files_list_the_shards_and_only_depends_on_them():
    shards = [{"file": f"shard-{i:05d}.arrow", "sha256": f"{i:064x}", "sequences": 3} for i in range(3)]
    files = arrow.derived_files(shards)
    assert list(files) == ["state.json", "dataset_info.json"]
    state = json.loads(files["state.json"])
    assert state["_data_files"] == [{"filename": "shard-00000.arrow"}, {"filename": "shard-00001.arrow"},
                                    {"filename": "shard-00002.arrow"}]
    assert len(state["_fingerprint"]) == 16 and json.loads(files["dataset_info.json"])["features"] is None
    assert arrow.derived_files([dict(s) for s in shards]) == files  # the same bytes for the same shards
    changed = [*shards[:2], {**shards[2], "sha256": "f" * 64}]
    assert json.loads(arrow.derived_files(changed)["state.json"])["_fingerprint"] != state["_fingerprint"]
    assert arrow.derived_files([]) == {}
