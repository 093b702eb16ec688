"""Shard writers and readers: the byte layouts by hand, both formats against a slow reference,
get_many against ds[i], plain-pyarrow reading (Arrow streams, and the older IPC files), and verify
catching each kind of damage."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from packer.io import atomic
from packer.io.hashed import HashedFile
from packer.preprocess.plan import plan_bins
from packer.preprocess.writer import write_rows, write_shard
from packer.store.dataset import Rows, open_dataset
from packer.store.formats import FORMATS, arrow, memmap
from packer.store.rows import Layout
from packer.store.verify import verify_dataset


def _two_rows(dtype=np.uint16):
    """[a a a | b b] and [c c c c] with a=1, b=2, c=3."""
    tokens = np.array([1, 1, 1, 2, 2, 3, 3, 3, 3], dtype=dtype)
    rows = Rows(tokens, np.array([0, 5, 9]), np.array([0, 3, 5, 0, 4], np.int32), np.array([0, 3, 5]))
    return rows, np.array([17, 4, 230], np.int64)


def _write(rows, doc_ids, out, shard, fmt):
    layout = Layout(rows.token_starts, rows.offsets, rows.offset_starts, doc_ids)
    ts = rows.token_starts
    return write_rows(layout, lambda r0, r1: rows.tokens[ts[r0] : ts[r1]].copy(), out, shard, fmt)


def test_memmap_bytes_match_the_documented_layout(tmp_path):
    rows, doc_ids = _two_rows()
    entry = _write(rows, doc_ids, tmp_path, 0, "memmap")
    assert entry["file"] == "shard-00000.bin" and entry["index_file"] == "shard-00000.idx"
    assert (tmp_path / "shard-00000.bin").read_bytes() == struct.pack("<9H", 1, 1, 1, 2, 2, 3, 3, 3, 3)
    idx = (tmp_path / "shard-00000.idx").read_bytes()
    expected = (
        b"PACKIDX1" + struct.pack("<IIQQ", 1, 2, 2, 3)
        + struct.pack("<3q", 0, 5, 9) + struct.pack("<3q", 0, 3, 5)
        + struct.pack("<3q", 17, 4, 230) + struct.pack("<5i", 0, 3, 5, 0, 4)
    )
    assert idx == expected
    import hashlib

    assert entry["sha256"] == hashlib.sha256((tmp_path / "shard-00000.bin").read_bytes()).hexdigest()
    assert entry["index_sha256"] == hashlib.sha256(idx).hexdigest()


def test_arrow_shard_reads_with_plain_pyarrow(tmp_path):
    """An Arrow shard is an IPC stream: the schema message first (continuation marker ff ff ff ff), the
    end-of-stream marker last, and pyarrow's open_stream reads its rows."""
    rows, doc_ids = _two_rows(np.uint32)
    _write(rows, doc_ids, tmp_path, 3, "arrow")
    data = (tmp_path / "shard-00003.arrow").read_bytes()
    assert data[:4] == b"\xff\xff\xff\xff" and data[-8:] == arrow.END_OF_STREAM
    table = ipc.open_stream(pa.memory_map(str(tmp_path / "shard-00003.arrow"))).read_all()
    assert table.schema.field("input_ids").type == pa.list_(pa.uint32())
    assert table.schema.field("offsets").type == pa.list_(pa.int32())
    assert table.to_pylist() == [
        {"input_ids": [1, 1, 1, 2, 2], "offsets": [0, 3, 5], "doc_ids": [17, 4]},
        {"input_ids": [3, 3, 3, 3], "offsets": [0, 4], "doc_ids": [230]},
    ]


def _as_ipc_file(shard) -> bytes:
    """A stream shard rewritten as the IPC file packer wrote before 2026-12 (same batches)."""
    batches = list(ipc.open_stream(pa.memory_map(str(shard))))
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, batches[0].schema) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def _random_dataset(tmp_path, rng, fmt, dtype, context_length=64, shard_size=300, doc_ids_out=None):
    """Random unit files -> plan -> every shard written -> a manifest; return the reference
    rows built naively (python lists) from the same plan and units."""
    work = tmp_path / "_work"
    (work / "units").mkdir(parents=True)
    high = 2**16 if dtype == np.uint16 else 2**20
    unit_tokens, unit_lengths = [], []
    for u in range(int(rng.integers(1, 4))):
        lengths = rng.integers(1, 2 * context_length, size=int(rng.integers(0, 30)))
        tokens = rng.integers(0, high, size=int(lengths.sum())).astype(dtype)
        np.save(work / "units" / f"unit-{u:06d}.tokens.npy", tokens)
        unit_tokens.append(tokens.tolist())
        unit_lengths.append(lengths.astype(np.int64))
    plan = plan_bins(unit_lengths, context_length=context_length, seed=int(rng.integers(100)), shard_size=shard_size)
    atomic.save_npz(work / "plan.npz", **{k: getattr(plan, k) for k in plan.__dataclass_fields__})
    entries = [
        write_shard(work / "plan.npz", k, work, tmp_path, np.dtype(dtype).name, fmt)
        for k in range(plan.n_shards)
    ]
    reference = []
    for s in range(plan.n_sequences):
        row, offsets = [], [0]
        for p in range(plan.seq_starts[s], plan.seq_starts[s + 1]):
            u, a, n = plan.piece_unit[p], plan.piece_start[p], plan.piece_len[p]
            row += unit_tokens[u][a : a + n]
            offsets.append(len(row))
        reference.append((row, offsets))
    if doc_ids_out is not None:
        doc_ids_out[:] = plan.piece_doc.tolist()  # pieces in plan order = segments in stored order
    manifest = {
        "config": {"format": fmt, "context_length": context_length, "token_dtype": np.dtype(dtype).name},
        "tokenizer": {"vocab_size": high},
        "shards": entries,
        "totals": {"sequences": plan.n_sequences, "tokens_out": int(plan.piece_len.sum())},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return reference


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_datasets_read_back_exactly(tmp_path, fmt):
    rng = np.random.default_rng(5)
    n_multi = n_shards_seen = 0
    n_blocks_seen = set()
    for trial in range(12):
        dtype = (np.uint16, np.uint32)[trial % 2]
        reference_doc_ids = []
        shard_size = 10**6 if trial % 4 == 0 else 300  # one shard (one block to read) now and then
        reference = _random_dataset(tmp_path / str(trial), rng, fmt, dtype, shard_size=shard_size,
                                    doc_ids_out=reference_doc_ids)
        ds = open_dataset(tmp_path / str(trial))
        assert len(ds) == len(reference)
        assert [(t.tolist(), o.tolist()) for t, o in ds] == reference  # iteration, stored order
        for i in range(len(ds)):
            tokens, offsets = ds[i]
            assert tokens.dtype == dtype and offsets.dtype == np.int32
            assert (tokens.tolist(), offsets.tolist()) == reference[i]
            n_multi += len(offsets) > 2
        if len(ds):
            assert ds[-1][0].tolist() == reference[-1][0]
            picks = rng.integers(-len(ds), len(ds), size=20)
            batch = ds.get_many(picks)
            assert len(batch) == 20 and batch.token_starts[0] == 0 and batch.tokens.dtype == dtype
            for k, i in enumerate(picks):
                assert tuple(x.tolist() for x in batch.row(k)) == reference[i]
            tokens, offsets = ds.views(picks)
            assert [(t.tolist(), o.tolist()) for t, o in zip(tokens, offsets)] == [reference[i] for i in picks]
            n_blocks_seen.add(min(len(ds._blocks), 2))
        assert verify_dataset(tmp_path / str(trial))["sequences"] == len(reference)
        assert ds.doc_ids().tolist() == reference_doc_ids
        n_shards_seen = max(n_shards_seen, len(ds.manifest["shards"]))
    assert n_multi > 0 and n_shards_seen > 2  # multi-document rows and several shards were exercised
    assert n_blocks_seen == {1, 2}  # views: its one-block path and its block lookup


def test_out_of_range_and_empty_batch(tmp_path):
    _random_dataset(tmp_path, np.random.default_rng(1), "memmap", np.uint16)
    ds = open_dataset(tmp_path)
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(IndexError):
        ds.get_many([0, len(ds)])
    empty = ds.get_many([])
    assert len(empty) == 0 and empty.tokens.size == 0


def test_arrow_shards_load_with_hf_datasets(tmp_path, monkeypatch):
    """`load_dataset("arrow", ...)` reads the shards (a copy into its cache), `Dataset.from_file` maps them
    (tests/store/test_hf_datasets.py measures that one on a built dataset)."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    reference = _random_dataset(tmp_path / "ds", np.random.default_rng(2), "arrow", np.uint16)
    files = sorted(str(p) for p in (tmp_path / "ds").glob("shard-*.arrow"))
    hf = datasets.load_dataset("arrow", data_files=files, split="train", cache_dir=str(tmp_path / "cache"))
    assert len(files) > 1 and len(hf) == len(reference)
    assert [(r["input_ids"], r["offsets"]) for r in hf] == reference
    view = datasets.concatenate_datasets([datasets.Dataset.from_file(f) for f in files])
    assert [(r["input_ids"], r["offsets"]) for r in view] == reference


def test_arrow_reads_shards_in_the_older_ipc_file_form(tmp_path):
    """Datasets built before 2026-12 hold IPC files: the same stream between an 8-byte header and a
    footer (and no checksums file: they came before those too). open_dataset and verify read them as before."""
    reference_doc_ids = []
    reference = _random_dataset(tmp_path, np.random.default_rng(4), "arrow", np.uint16, doc_ids_out=reference_doc_ids)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    for entry in manifest["shards"][::2]:  # every other shard old: a dataset may mix both (a resumed build)
        shard = tmp_path / entry["file"]
        stream, old = shard.read_bytes(), _as_ipc_file(shard)
        assert old[:8] == b"ARROW1\0\0" and old[8 : 8 + len(stream)] == stream
        shard.write_bytes(old)
        entry["sha256"] = hashlib.sha256(old).hexdigest()
        (tmp_path / entry.pop("checksums_file")).unlink()
        del entry["checksums_sha256"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    ds = open_dataset(tmp_path)
    assert len(manifest["shards"]) > 2 and [(t.tolist(), o.tolist()) for t, o in ds] == reference
    assert ds.doc_ids().tolist() == reference_doc_ids
    assert verify_dataset(tmp_path)["sequences"] == len(reference)
    first = tmp_path / manifest["shards"][0]["file"]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 1
    first.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{first.name}: sha256 does not match"):
        verify_dataset(tmp_path)


@pytest.mark.parametrize("cut", ["the end-of-stream marker", "every record batch", "nothing, bytes added"])
def test_a_cut_or_extended_arrow_stream_is_refused(tmp_path, cut):
    """A stream cut at a record batch boundary is still a readable stream: the shard's checksums file
    (its size) tells a whole shard at open, and the end-of-stream marker at the last byte for the quick
    verify, which reads no checksums."""
    manifest = _damaged(tmp_path, "arrow")
    shard = tmp_path / manifest["shards"][0]["file"]
    data = shard.read_bytes()
    schema_end = len(ipc.open_stream(pa.memory_map(str(shard))).schema.serialize())  # then the first batch
    assert data[-8:] == arrow.END_OF_STREAM and data[schema_end : schema_end + 4] == b"\xff\xff\xff\xff"
    damaged, stream_end = {
        "the end-of-stream marker": (data[:-8], len(data) - 8),
        "every record batch": (data[:schema_end], schema_end),  # only the schema: a stream of no rows
        "nothing, bytes added": (data + arrow.END_OF_STREAM, len(data)),
    }[cut]
    shard.write_bytes(damaged)
    with pytest.raises(ValueError, match=f"{shard.name}: {len(damaged)} bytes, its checksums file says {len(data)}"):
        open_dataset(tmp_path)
    with pytest.raises(ValueError, match=f"{shard.name}: the Arrow stream ends at byte {stream_end} of {len(damaged)} "
                                         "without its end-of-stream marker"):
        verify_dataset(tmp_path, checksums=False)


def _damaged(tmp_path, fmt):
    _random_dataset(tmp_path, np.random.default_rng(3), fmt, np.uint16)
    assert verify_dataset(tmp_path)["sequences"] > 0
    return json.loads((tmp_path / "manifest.json").read_text())


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_names_a_missing_or_changed_file(tmp_path, fmt):
    manifest = _damaged(tmp_path, fmt)
    last = tmp_path / manifest["shards"][-1].get("index_file", manifest["shards"][-1]["file"])
    data = bytearray(last.read_bytes())
    data[-1] ^= 1
    last.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{last.name}: sha256 does not match"):
        verify_dataset(tmp_path)
    last.unlink()
    with pytest.raises(ValueError, match=f"shard missing: .*{last.name}"):
        verify_dataset(tmp_path, checksums=False)


def test_quick_verify_catches_truncation_and_bad_offsets(tmp_path):
    manifest = _damaged(tmp_path, "memmap")
    bin_file = tmp_path / manifest["shards"][0]["file"]
    good = bin_file.read_bytes()
    bin_file.write_bytes(good[:-2])
    with pytest.raises(ValueError, match="truncated"):
        verify_dataset(tmp_path, checksums=False)
    bin_file.write_bytes(good)
    idx_file = tmp_path / manifest["shards"][0]["index_file"]
    _, n_rows, n_segments = memmap.read_header(idx_file)
    idx = bytearray(idx_file.read_bytes())
    first_offsets = memmap.HEADER.size + 8 * (2 * (n_rows + 1) + n_segments)
    idx[first_offsets + 4 : first_offsets + 8] = struct.pack("<i", 0)  # row 0: offsets [0, 0, ...]
    idx_file.write_bytes(bytes(idx))
    with pytest.raises(ValueError, match="row 0: offsets"):
        verify_dataset(tmp_path, checksums=False)
    with pytest.raises(ValueError, match="sha256"):
        verify_dataset(tmp_path)


def test_verify_catches_count_mismatch(tmp_path):
    manifest = _damaged(tmp_path, "arrow")
    manifest["shards"][0]["documents"] += 1
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="documents, the manifest says"):
        verify_dataset(tmp_path)


class _DiskFull:
    """A file whose every write fails as a full disk does."""

    def __init__(self, f):
        self.f = f

    def write(self, buf):
        raise OSError(28, "No space left on device")

    def close(self):
        self.f.close()


def _full_disk(monkeypatch):
    import packer.io.hashed as hashed

    real_open = open
    monkeypatch.setattr(hashed, "open", lambda *a, **k: _DiskFull(real_open(*a, **k)), raising=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_failed_write_raises_and_leaves_no_shard(tmp_path, monkeypatch, fmt):
    _full_disk(monkeypatch)
    rows, doc_ids = _two_rows()
    with pytest.raises(OSError, match="No space left"):
        _write(rows, doc_ids, tmp_path, 0, fmt)
    assert not list(tmp_path.glob("shard-00000.*[!0-9]"))  # no file under a final name
    assert all(atomic.is_tmp(p) for p in tmp_path.iterdir())  # only leftovers the next run removes


@pytest.mark.parametrize("threads", [True, False])
def test_hashed_file_writes_and_hashes_every_byte(tmp_path, monkeypatch, threads):
    """Both modes (the writer's two threads, and the calling thread alone) give the bytes and
    the sha256 of hashlib over the same buffers, small writes coalesced among large ones."""
    import hashlib

    rng = np.random.default_rng(0)
    bufs = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(0, 3 * HashedFile.SMALL, 40)]
    final = tmp_path / "out.bin"
    f = HashedFile(final, threads=threads)
    for b in bufs:
        assert f.write(memoryview(b)) == len(b)
    f.close()
    assert f.tell() == sum(map(len, bufs)) and not final.exists()
    atomic.publish(f.tmp, final)
    assert final.read_bytes() == b"".join(bufs)
    assert f.hexdigest() == hashlib.sha256(b"".join(bufs)).hexdigest()
    assert any(len(b) < HashedFile.SMALL for b in bufs) and any(len(b) >= HashedFile.SMALL for b in bufs)
    _full_disk(monkeypatch)
    g = HashedFile(tmp_path / "full.bin", threads=threads)
    with pytest.raises(OSError, match="No space left"):
        try:
            g.write(bytes(2 * HashedFile.SMALL))  # raises here without threads, at close with them
        finally:
            g.close()
