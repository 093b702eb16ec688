"""Megatron shards: the byte layout by hand, Megatron-Core's own IndexedDataset reading a sample
build row for row, the same rows as the Arrow build, packer's reader, verify, stats and loader on
it, and verify catching a flipped byte or a truncation in each of its three files."""

from __future__ import annotations

import hashlib
import json
import struct
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import build_sample

from packer.cli import main
from packer.preprocess.writer import write_rows
from packer.stats import figures as st
from packer.store.dataset import Rows, open_dataset
from packer.store.formats import megatron
from packer.store.rows import Layout
from packer.store.verify import verify_dataset


def _two_rows(dtype=np.uint16):
    """[a a a | b b] and [c c c c] with a=1, b=2, c=3; doc_ids 17, 4, 230."""
    tokens = np.array([1, 1, 1, 2, 2, 3, 3, 3, 3], dtype=dtype)
    rows = Rows(tokens, np.array([0, 5, 9]), np.array([0, 3, 5, 0, 4], np.int32), np.array([0, 3, 5]))
    return rows, np.array([17, 4, 230], np.int64)


def _write(tmp_path, dtype=np.uint16):
    rows, doc_ids = _two_rows(dtype)
    layout = Layout(rows.token_starts, rows.offsets, rows.offset_starts, doc_ids)
    ts = rows.token_starts
    return write_rows(layout, lambda r0, r1: rows.tokens[ts[r0] : ts[r1]].copy(), tmp_path, 0, "megatron")


@pytest.fixture(scope="module")
def IndexedDataset():
    """Megatron-Core's reader (CPU is enough; it warns that Transformer Engine and Apex are absent)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    return module.IndexedDataset


@pytest.mark.parametrize("dtype, code", [(np.uint16, 8), (np.uint32, 4)])
def test_bytes_match_the_documented_layout(tmp_path, dtype, code):
    entry = _write(tmp_path, dtype)
    assert list(entry) == ["file", "sha256", "index_file", "index_sha256", "doc_ids_file", "doc_ids_sha256",
                           "checksums_file", "checksums_sha256"]
    assert (entry["file"], entry["index_file"], entry["doc_ids_file"]) == (
        "shard-00000.bin", "shard-00000.idx", "shard-00000.docids.npy")
    size = np.dtype(dtype).itemsize
    fmt = "<9H" if size == 2 else "<9I"
    assert (tmp_path / "shard-00000.bin").read_bytes() == struct.pack(fmt, 1, 1, 1, 2, 2, 3, 3, 3, 3)
    expected = (
        b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, 3, 3)
        + struct.pack("<3i", 3, 2, 4) + struct.pack("<3q", 0, 3 * size, 5 * size) + struct.pack("<3q", 0, 2, 3)
    )
    assert (tmp_path / "shard-00000.idx").read_bytes() == expected
    doc_ids = np.load(tmp_path / "shard-00000.docids.npy", allow_pickle=False)
    assert doc_ids.dtype == np.dtype("<i8") and doc_ids.tolist() == [17, 4, 230]
    for name_key, sha_key in (("file", "sha256"), ("index_file", "index_sha256"), ("doc_ids_file", "doc_ids_sha256")):
        assert entry[sha_key] == hashlib.sha256((tmp_path / entry[name_key]).read_bytes()).hexdigest()
    (rows, ids), = megatron.blocks([tmp_path / entry[k] for k in ("file", "index_file", "doc_ids_file")])
    assert rows.tokens.dtype == dtype and [r.tolist() for r in rows.row(0)] == [[1, 1, 1, 2, 2], [0, 3, 5]]
    assert [r.tolist() for r in rows.row(1)] == [[3, 3, 3, 3], [0, 4]] and ids.tolist() == [17, 4, 230]


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_megatron_reads_the_hand_written_shard(tmp_path, IndexedDataset, dtype):
    _write(tmp_path, dtype)
    ds = IndexedDataset(str(tmp_path / "shard-00000"))
    assert len(ds) == 3 and ds.document_indices.tolist() == [0, 2, 3]
    assert [ds[i].tolist() for i in range(3)] == [[1, 1, 1], [2, 2], [3, 3, 3, 3]]
    assert ds.sequence_lengths.tolist() == [3, 2, 4]


@pytest.fixture(scope="module")
def megatron_dataset(tmp_path_factory):
    """The sample corpus built as the session's Arrow `sample_dataset` is, in the Megatron format."""
    out = tmp_path_factory.mktemp("megatron") / "ds"
    build_sample(out, workers=2, shard_size=200_000, format="megatron")
    return out


def test_every_megatron_document_is_one_row(megatron_dataset, IndexedDataset):
    ours = open_dataset(megatron_dataset)
    shards = ours.manifest["shards"]
    assert len(shards) > 1 and ours.format == "megatron"
    i = n_multi = 0
    for entry in shards:
        theirs = IndexedDataset(str(megatron_dataset / entry["file"][: -len(".bin")]))
        docs = theirs.document_indices
        assert len(theirs) == entry["documents"] and len(docs) - 1 == entry["sequences"]
        assert int(theirs.sequence_lengths.sum()) == entry["tokens"]
        for s in range(len(docs) - 1):
            tokens, offsets = ours[i]
            pieces = [theirs[j] for j in range(docs[s], docs[s + 1])]
            assert np.array_equal(np.concatenate(pieces), tokens)
            assert np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).tolist() == offsets.tolist()
            n_multi += len(pieces) > 1
            i += 1
    assert i == len(ours) and n_multi > 0  # every row, and rows of several documents among them


def test_megatron_build_holds_the_arrow_build_rows(megatron_dataset, sample_dataset):
    ours, arrow = open_dataset(megatron_dataset), open_dataset(sample_dataset)
    assert len(ours) == len(arrow) > 0
    for (t, o), (ta, oa) in zip(ours, arrow):
        assert np.array_equal(t, ta) and np.array_equal(o, oa) and t.dtype == ta.dtype
    assert np.array_equal(ours.doc_ids(), arrow.doc_ids())
    picks = np.random.default_rng(0).integers(0, len(ours), 50)
    a, b = ours.get_many(picks), arrow.get_many(picks)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert ours.manifest["totals"] == arrow.manifest["totals"]


def test_verify_stats_and_loader_work_on_a_megatron_build(megatron_dataset, sample_dataset):
    totals = verify_dataset(megatron_dataset)
    assert totals == verify_dataset(sample_dataset)
    runner = CliRunner()
    result = runner.invoke(main, ["verify", str(megatron_dataset)])
    assert result.exit_code == 0 and f"ok: {totals['sequences']:,} sequences" in result.output
    result = runner.invoke(main, ["stats", str(megatron_dataset)])
    assert result.exit_code == 0, result.output
    figures = st.dataset_stats(open_dataset(megatron_dataset), batch_size=4)
    reference = st.dataset_stats(open_dataset(sample_dataset), batch_size=4)
    assert figures["source"]["documents_from"] == "doc_ids"
    for key in ("lengths", "strategies", "packing", "attention"):
        assert figures[key] == reference[key], key
    pytest.importorskip("torch")
    from packer.data import PackedDataset

    ours = list(PackedDataset(str(megatron_dataset), seed=3))
    theirs = list(PackedDataset(str(sample_dataset), seed=3))
    assert len(ours) == len(theirs) == totals["sequences"]
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _copy(src, dst):
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return json.loads((dst / "manifest.json").read_text())


@pytest.mark.parametrize("which", ["file", "index_file", "doc_ids_file"])
def test_verify_catches_a_flipped_byte_and_a_truncation(megatron_dataset, tmp_path, which):
    manifest = _copy(megatron_dataset, tmp_path / "ds")
    target = tmp_path / "ds" / manifest["shards"][1][which]
    good = target.read_bytes()
    for where in (0, len(good) // 2, len(good) - 1):
        data = bytearray(good)
        data[where] ^= 0x10
        target.write_bytes(bytes(data))
        with pytest.raises(ValueError, match=f"{target.name}: sha256 does not match"):
            verify_dataset(tmp_path / "ds")
    for keep in (0, 20, len(good) - 8):  # quick verify (no sha256): the format's own checks see it
        target.write_bytes(good[:keep])
        with pytest.raises(ValueError, match=f"{target.name}: .*(truncated|shorter|not a readable|bytes)"):
            verify_dataset(tmp_path / "ds", checksums=False)
    target.write_bytes(good)
    assert verify_dataset(tmp_path / "ds", checksums=False)["sequences"] == manifest["totals"]["sequences"]


def test_quick_verify_catches_an_inconsistent_index(megatron_dataset, tmp_path):
    manifest = _copy(megatron_dataset, tmp_path / "ds")
    idx = tmp_path / "ds" / manifest["shards"][0]["index_file"]
    good = bytearray(idx.read_bytes())
    n_sequences = struct.unpack_from("<Q", good, 18)[0]
    for patch, match in (
        ((0, b"MMIDIDY"), "not a Megatron index"),
        ((17, b"\x05"), "dtype code 5"),
        ((34, struct.pack("<i", 7)), "sequence_pointers are not the running sum"),  # first length 7
        ((34 + 12 * n_sequences, struct.pack("<q", 1)), "document_indices must rise from 0"),
    ):
        data = bytearray(good)
        at, value = patch
        data[at : at + len(value)] = value
        idx.write_bytes(bytes(data))
        with pytest.raises(ValueError, match=match):
            verify_dataset(tmp_path / "ds", checksums=False)
    idx.write_bytes(bytes(good))
    doc_ids = tmp_path / "ds" / manifest["shards"][0]["doc_ids_file"]
    np.save(doc_ids, np.load(doc_ids)[:-1])  # a well-formed .npy with one doc_id too few
    with pytest.raises(ValueError, match="one per Megatron sequence"):
        verify_dataset(tmp_path / "ds", checksums=False)


def test_remote_megatron_dataset_reads_the_same_rows(megatron_dataset):
    pytest.importorskip("fsspec")
    import uuid

    from packer.io import fs

    uri = f"memory://packer-test-{uuid.uuid4().hex}/ds"
    root = fs.location(uri)
    try:
        for p in megatron_dataset.iterdir():
            if p.is_file():
                (root / p.name).write_bytes(p.read_bytes())
        remote, local = open_dataset(uri), open_dataset(megatron_dataset)
        assert len(remote) == len(local)
        assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(remote, local))
        assert np.array_equal(remote.doc_ids(), local.doc_ids())
        assert verify_dataset(uri)["sequences"] == len(local)
    finally:
        if root.parent.exists():
            fs.rmtree(root.parent)


def test_megatron_bytes_do_not_depend_on_workers(megatron_dataset, tmp_path):
    out = tmp_path / "one"
    build_sample(out, workers=1, shard_size=200_000, format="megatron")
    names = sorted(p.name for p in megatron_dataset.iterdir() if p.name.startswith("shard-"))
    assert names == sorted(p.name for p in out.iterdir() if p.name.startswith("shard-")) and len(names) > 3
    for name in [*names, "manifest.json"]:
        a, b = (megatron_dataset / name).read_bytes(), (out / name).read_bytes()
        if name == "manifest.json":  # the build's timestamp aside
            a, b = (json.loads(x) for x in (a, b))
            for m in (a, b):
                del m["created_unix"], m["build_seconds"]
        assert a == b, name
