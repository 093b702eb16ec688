"""Loaders never yield a byte the manifest does not attest (issue 28, items 1-2): every shard carries an
xxh3_64 per read block (packer/store/checksums.py), every reader checks a block before any row of it is
used, and a reader pins the dataset generation it opened. Each case damages a real build the way a disk,
a store, a cache or a second `packer build --overwrite` would, and asserts that no wrong row comes out:
the read raises one line naming the shard and the byte range (or the replaced dataset), or gives the
right rows."""

from __future__ import annotations

import json
import pickle
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import xxhash
from click.testing import CliRunner
from conftest import SAMPLE_INPUTS, TOKENIZER, build_sample

from packer.cli import main
from packer.io import fs
from packer.store import checksums
from packer.store.dataset import open_dataset
from packer.store.formats import arrow
from packer.store.manifest import DatasetReplaced, sha256_file
from packer.store.stream import StreamDataset
from packer.store.verify import verify_dataset

FORMATS = ("arrow", "memmap", "megatron")
CONTEXT = 1024
VOCAB = 16384  # the sample tokenizer's
MISMATCH = r"shard-00000\.(arrow|bin) bytes \d+-\d+: checksum mismatch"
REPLACED = "was replaced after this loader opened it; restart from a checkpoint"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """fmt -> a sample build in that format (several shards; Arrow: record batches of 20 rows, so a shard
    has several blocks), made once; tests damage copies."""
    from packer.store import rows as rows_module

    root = tmp_path_factory.mktemp("sums")
    saved = rows_module.ROWS_PER_BATCH
    try:
        for fmt in FORMATS:
            rows_module.ROWS_PER_BATCH = 20 if fmt == "arrow" else saved
            build_sample(root / fmt, format=fmt, shard_size=200_000, context_length=CONTEXT)
    finally:
        rows_module.ROWS_PER_BATCH = saved
    return root


@pytest.fixture(params=FORMATS)
def ds_dir(request, built, tmp_path):
    out = tmp_path / request.param
    shutil.copytree(built / request.param, out)
    return out


def _all_rows(ds):
    tokens, offsets = ds.views(np.arange(len(ds)))
    return [t.copy() for t in tokens], [o.copy() for o in offsets]


def _token_bytes(d):
    """(file, byte offset, itemsize) of the token stream of shard 0: the .bin, or the values of the Arrow
    shard's input_ids column in its first record batch (found by address in a map of the file)."""
    manifest = json.loads((d / "manifest.json").read_text())
    entry, itemsize = manifest["shards"][0], np.dtype(manifest["config"]["token_dtype"]).itemsize
    file = d / entry["file"]
    if manifest["config"]["format"] != "arrow":
        return file, 0, itemsize
    whole = pa.memory_map(str(file)).read_buffer()
    batch = next(iter(ipc.open_stream(pa.BufferReader(whole))))
    values = batch.column("input_ids").values.buffers()[1]
    return file, values.address - whole.address, itemsize


def _change_a_token(d, how) -> int:
    """Change one token of shard 0 (its 37th) so its id stays inside the vocabulary; return the old id."""
    file, at, itemsize = _token_bytes(d)
    data = bytearray(file.read_bytes())
    pos = at + 37 * itemsize
    old = int.from_bytes(data[pos : pos + itemsize], "little")
    new = how(old)
    assert new != old and 0 <= new < VOCAB
    data[pos : pos + itemsize] = new.to_bytes(itemsize, "little")
    file.write_bytes(bytes(data))
    return old


DAMAGES = {"+1 on a token": lambda t: t + 1 if t + 1 < VOCAB else t - 1, "a flipped low bit": lambda t: t ^ 1}


def _cli(*args) -> str:
    result = CliRunner().invoke(main, list(map(str, args)))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


# -- the checksums the build writes ------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_file_of_every_shard_is_covered_block_by_block(built, fmt):
    """The checksums file holds, for each other file of the shard, byte ranges from 0 to its size
    whose xxh3_64 (computed here from the file's bytes) it records; row blocks lie on row starts of
    the .bin (memmap, Megatron) or on the record batches' messages (Arrow); its sha256 is the entry's."""
    d = built / fmt
    manifest = json.loads((d / "manifest.json").read_text())
    n_multi = 0
    for entry in manifest["shards"]:
        sums_file = d / entry["checksums_file"]
        assert sha256_file(sums_file) == entry["checksums_sha256"]
        names = [entry[k] for k in ("file", "index_file", "doc_ids_file") if k in entry]
        sums = checksums.parse_sums(sums_file.read_bytes(), str(sums_file), len(names))
        assert sums.rows[0] == 0 and sums.rows[-1] == entry["sequences"]
        for name, file_sums in zip(names, sums.files):
            data = (d / name).read_bytes()
            cuts = file_sums.cuts.tolist()
            assert cuts[0] == 0 and cuts[-1] == len(data)
            assert file_sums.digests.tolist() == [xxhash.xxh3_64_intdigest(data[a:b]) for a, b in zip(cuts, cuts[1:])]
        first, shard = sums.files[0], (d / entry["file"]).read_bytes()
        if fmt == "arrow":  # the schema message, one message per batch, the end-of-stream marker
            messages, _ = arrow._messages(lambda p, a, b: shard[a:b], lambda p: len(shard), d / entry["file"])
            assert first.first == 1
            assert first.cuts.tolist() == [0] + [stop for _, _, stop, _ in messages] + [len(shard)]
            assert np.diff(sums.rows).tolist() == [m[3] for m in messages[1:]]
        else:  # row blocks cut at row starts, each within about checksums.BLOCK_BYTES of .bin
            itemsize = np.dtype(manifest["config"]["token_dtype"]).itemsize
            idx = (d / entry["index_file"]).read_bytes()
            if fmt == "memmap":
                row_starts = np.frombuffer(idx, "<i8", entry["sequences"] + 1, 32) * itemsize
            else:  # Megatron: the sequence pointers at each document's first sequence, then the end
                n = entry["documents"]
                pointers = np.frombuffer(idx, "<i8", n, 34 + 4 * n)
                documents = np.frombuffer(idx, "<i8", entry["sequences"] + 1, 34 + 12 * n)
                row_starts = np.append(pointers, len(shard))[documents]
            assert first.first == 0 and first.cuts.tolist() == row_starts[sums.rows].tolist()
            assert (np.diff(first.cuts) <= checksums.BLOCK_BYTES + CONTEXT * itemsize).all()
            assert all(f.first == -1 and len(f.digests) == 1 for f in sums.files[1:])  # .idx, .docids.npy: whole
        n_multi += sums.n_blocks > 1
    assert n_multi  # several blocks in a shard: the property was exercised


def test_block_sink_cuts_where_told_whatever_the_writes():
    """BlockSink against slicing: random writes and cuts (given before and while bytes arrive) give
    the ranges and digests of the joined bytes."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        data = rng.integers(0, 256, int(rng.integers(0, 5000)), dtype=np.uint8).tobytes()
        cuts = sorted(set(rng.integers(0, len(data) + 1, int(rng.integers(0, 8))).tolist()))
        got = bytearray()

        class Sink:
            closed = False

            def write(self, b):
                got.extend(b)
                return len(b)

        sink = checksums.BlockSink(Sink())
        early = [c for c in cuts if c < len(data) // 3]
        sink.cut_at(early)
        pos = 0
        for size in rng.integers(0, 700, 40).tolist():
            sink.cut_at([c for c in cuts if c not in early and pos <= c <= pos + size and c > (early or [0])[-1]])
            sink.write(data[pos : pos + size])
            pos = min(len(data), pos + size)
        sink.write(data[pos:])
        sums = sink.sums()
        want = [0] + [c for c in cuts if 0 < c < len(data)] + ([len(data)] if data else [])
        assert bytes(got) == data
        assert sums.cuts.tolist() == want
        assert sums.digests.tolist() == [xxhash.xxh3_64_intdigest(data[a:b]) for a, b in zip(want, want[1:])]


# -- a token changed inside the vocabulary: never yielded ---------------------------------------


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_token_changed_inside_the_vocabulary_is_never_yielded(ds_dir, damage):
    """+1 on a token, or a flipped low bit: ids stay below the vocabulary, so only the checksum can
    tell. open_dataset's read of the block, verify, PackedDataset and `packer inspect` each refuse in one
    line naming the shard and the byte range; the other shards still read as built."""
    clean_tokens, _ = _all_rows(open_dataset(ds_dir))
    _change_a_token(ds_dir, DAMAGES[damage])
    ds = open_dataset(ds_dir)
    with pytest.raises(ValueError, match=MISMATCH):
        ds.views(np.arange(len(ds)))
    with pytest.raises(ValueError, match=MISMATCH):
        ds[0]
    last = len(ds) - 1  # in the last shard: untouched, read as built
    assert np.array_equal(ds[last][0], clean_tokens[last])
    with pytest.raises(ValueError, match=r"sha256 does not match|checksum mismatch"):
        verify_dataset(ds_dir)
    from packer.data import PackedDataset

    with pytest.raises(ValueError, match=MISMATCH):
        list(PackedDataset(ds_dir, shuffle=False))
    assert "checksum mismatch" in _cli("inspect", ds_dir, "--seq", 0, "--raw")


def test_checksums_that_disagree_with_the_shard_fail_verify(built, tmp_path):
    """A checksums file rewritten with a wrong digest (and its sha256 in the manifest updated to match)
    fails `packer verify`: verify checks the blocks too, not only the files' sha256."""
    d = tmp_path / "memmap"
    shutil.copytree(built / "memmap", d)
    manifest = json.loads((d / "manifest.json").read_text())
    entry = manifest["shards"][0]
    raw = bytearray((d / entry["checksums_file"]).read_bytes())
    raw[-1] ^= 0x40  # the last digest of the last file
    (d / entry["checksums_file"]).write_bytes(bytes(raw))
    entry["checksums_sha256"] = sha256_file(d / entry["checksums_file"])
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="checksum mismatch"):
        verify_dataset(d)
    with pytest.raises(ValueError, match="checksum mismatch"):
        open_dataset(d)


# -- datasets built before checksums ----------------------------------------------------------


def _strip_checksums(d):
    manifest = json.loads((d / "manifest.json").read_text())
    for entry in manifest["shards"]:
        (d / entry.pop("checksums_file")).unlink()
        entry.pop("checksums_sha256")
    (d / "manifest.json").write_text(json.dumps(manifest))


def test_a_dataset_without_checksums_loads_checked_by_sha256(ds_dir):
    """A dataset of a packer before block checksums opens and reads as built (its files' sha256
    checked at open); a token changed in one is refused at open, in one line."""
    want = _all_rows(open_dataset(ds_dir))
    _strip_checksums(ds_dir)
    got = _all_rows(open_dataset(ds_dir))
    assert all(np.array_equal(a, b) for a, b in zip(got[0], want[0]))
    verify_dataset(ds_dir)
    _change_a_token(ds_dir, DAMAGES["+1 on a token"])
    with pytest.raises(ValueError, match=r"shard-00000\.(arrow|bin): sha256 does not match the manifest"):
        open_dataset(ds_dir)


# -- one generation per reader ------------------------------------------------------------------


def _rebuild(d, **config):
    from packer.config import BuildConfig, Job
    from packer.preprocess.pipeline import build

    job = Job(inputs=SAMPLE_INPUTS, tokenizer=TOKENIZER, output=str(d), workers=1,
              config=BuildConfig(**{"context_length": CONTEXT, "shard_size": 200_000, **config}))
    build(job, overwrite=True, progress="off")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_replaced_after_the_loader_opened_it_raises(built, tmp_path, workers):
    """`packer build --overwrite` between PackedDataset's construction and its iteration (the DataLoader's
    workers open the shards then): the epoch raises naming the dataset, instead of mixing rows of two builds."""
    import torch

    from packer.data import PackedDataset

    d = tmp_path / "ds"
    shutil.copytree(built / "memmap", d)
    loader = torch.utils.data.DataLoader(PackedDataset(d, shuffle=False), batch_size=None, num_workers=workers)
    _rebuild(d, format="memmap", seed=7)
    with pytest.raises(ValueError, match=REPLACED):
        for _ in loader:
            pass


def test_open_dataset_pins_a_generation_and_pickles_with_it(built, tmp_path):
    """open_dataset(generation=...) refuses another manifest; a reader pickled (to a DataLoader worker)
    reopens only the dataset it was opened on."""
    d = tmp_path / "ds"
    shutil.copytree(built / "arrow", d)
    ds = open_dataset(d)
    assert open_dataset(d, generation=ds.generation).generation == ds.generation
    with pytest.raises(DatasetReplaced, match=REPLACED):
        open_dataset(d, generation="0" * 64)
    blob = pickle.dumps(ds)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["created_unix"] += 1  # another build of the same command: another generation
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetReplaced, match=REPLACED):
        pickle.loads(blob)


# -- remote: the store, the cache -----------------------------------------------------------------


def _upload(src, uri):
    for file in sorted(src.iterdir()):
        if file.is_file():
            fs.upload(file, fs.location(uri) / file.name)
    return uri


@pytest.fixture
def quick_retries(monkeypatch):
    from packer.io import retry

    monkeypatch.setattr(retry, "BASE_SECONDS", 0.001)


@pytest.mark.parametrize("fmt", ["memmap", "megatron"])
def test_a_shrunk_remote_object_is_never_yielded(built, s3_uri, fmt, quick_retries):
    """A shard object cut to half its size after the loader opened it (and read from it): pyarrow's S3
    reads of an open file may pad the missing tail, but no row of it comes out: the read raises naming
    the shard (a block's checksum, read twice, or the short read)."""
    uri = _upload(built / fmt, s3_uri(f"sums/shrunk-{fmt}"))
    ds, ref = StreamDataset(uri, read_ahead=0, block_bytes=64 << 10), open_dataset(built / fmt)
    assert np.array_equal(ds[0][0], ref[0][0])  # the shard's file is open now, at its old size (one block read)
    data = (built / fmt / "shard-00000.bin").read_bytes()
    with (fs.location(uri) / "shard-00000.bin").open_output() as out:
        out.write(data[: len(data) // 2])
    first_shard = int(json.loads((built / fmt / "manifest.json").read_text())["shards"][0]["sequences"])
    tail = np.arange(first_shard // 2, first_shard)
    with pytest.raises((ValueError, OSError), match=r"shard-00000\.bin"):
        got = ds.views(tail)
        assert all(np.array_equal(a, b) for a, b in zip(got[0], ref.views(tail)[0]))  # never reached


def test_a_flipped_remote_byte_is_read_twice_then_refused(built, s3_uri):
    """A byte flipped in the stored object (same size): the block is read again once, still wrong,
    and the read raises naming the shard and the byte range; the rows of other blocks still come."""
    uri = _upload(built / "memmap", s3_uri("sums/flipped"))
    data = bytearray((built / "memmap" / "shard-00000.bin").read_bytes())
    data[100] ^= 0x01
    with (fs.location(uri) / "shard-00000.bin").open_output() as out:
        out.write(bytes(data))
    ds, ref = StreamDataset(uri, read_ahead=0), open_dataset(built / "memmap")
    with pytest.raises(ValueError, match=r"shard-00000\.bin\S* bytes 0-\d+: checksum mismatch"):
        ds[0]
    assert ds.stats["checksum retries"] == 1
    last = len(ds) - 1
    assert np.array_equal(ds[last][0], ref[last][0])


def test_a_damaged_cache_block_is_read_again_from_the_store(built, s3_uri, tmp_path):
    """PACKER_CACHE_DIR blocks are checked like the store's: a damaged one is dropped and read again,
    so every row is as built, and the cache holds the right bytes after."""
    uri = _upload(built / "memmap", s3_uri("sums/cached"))
    cache = tmp_path / "cache"
    ref = open_dataset(built / "memmap")
    everything = np.arange(len(ref))
    first = StreamDataset(uri, cache_dir=str(cache))
    first.views(everything)
    blocks = sorted(cache.rglob("*.blk"), key=lambda p: -p.stat().st_size)
    damaged = blocks[0]
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    damaged.write_bytes(bytes(raw))
    second = StreamDataset(uri, cache_dir=str(cache))
    got = second.views(everything)
    assert all(np.array_equal(a, b) for a, b in zip(got[0], ref.views(everything)[0]))
    assert second.stats["checksum retries"] == 1 and second.stats["cache hits"] > 0
    assert damaged.read_bytes() != bytes(raw)  # replaced by the store's bytes


def test_a_replaced_remote_dataset_raises(built, s3_uri, tmp_path):
    """Another build uploaded over a streamed dataset after the loader opened it: PackedDataset's
    iteration and an open reader's next block raise naming the replaced dataset."""
    from packer.data import PackedDataset

    uri = _upload(built / "memmap", s3_uri("sums/replaced"))
    streamed = StreamDataset(uri, read_ahead=0)
    packed = PackedDataset(uri, shuffle=False)
    _rebuild(tmp_path / "other", format="memmap", seed=7)
    _upload(tmp_path / "other", uri)  # other bytes under the same names, another manifest
    with pytest.raises(ValueError, match=REPLACED):
        list(packed)
    with pytest.raises(ValueError, match=REPLACED):
        streamed.views(np.arange(len(streamed)))


def test_a_remote_dataset_without_checksums_warns_once(built, s3_uri, tmp_path):
    d = tmp_path / "old"
    shutil.copytree(built / "memmap", d)
    _strip_checksums(d)
    uri = _upload(d, s3_uri("sums/old"))
    with pytest.warns(UserWarning, match="without block checksums"):
        ds = StreamDataset(uri)
    ref = open_dataset(d)
    assert np.array_equal(ds[3][0], ref[3][0])
