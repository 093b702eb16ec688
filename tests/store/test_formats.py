"""The shard-format seam: the registry is the one list of formats, and every format writes its
files under the names and manifest keys it declares and reads back exactly the rows it was given."""

from __future__ import annotations

import hashlib
import types

import numpy as np
import pytest

from packer import config
from packer.preprocess.writer import write_rows
from packer.store import checksums, formats
from packer.store.formats import FORMATS
from packer.store.rows import ROWS_PER_BATCH, Layout


def test_config_lists_exactly_the_registered_formats():
    assert config.choices("format") == tuple(FORMATS)
    for fmt in FORMATS:
        config.BuildConfig(format=fmt)  # accepted by the config check


def _random_layout(rng, n_rows: int, dtype):
    """n_rows rows of 1-4 segments of 1-9 tokens, token values their global token index."""
    n_segments = rng.integers(1, 5, n_rows)
    lengths = rng.integers(1, 10, int(n_segments.sum()))
    offsets, token_starts, s = [], [0], 0
    for n in n_segments.tolist():
        row = lengths[s : s + n]
        offsets += [0, *np.cumsum(row).tolist()]
        token_starts.append(token_starts[-1] + int(row.sum()))
        s += n
    offset_starts = np.concatenate([[0], np.cumsum(n_segments + 1)]).astype(np.int64)
    doc_ids = rng.permutation(len(lengths)).astype(np.int64) * 7
    tokens = (np.arange(token_starts[-1]) % (2**15 if dtype == np.uint16 else 2**20)).astype(dtype)
    return Layout(np.array(token_starts, np.int64), np.array(offsets, np.int32), offset_starts, doc_ids), tokens


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n_rows", [0, 3, ROWS_PER_BATCH + 5])  # empty, one chunk, two chunks
def test_every_format_reads_back_what_it_wrote(tmp_path, fmt, n_rows):
    rng = np.random.default_rng(n_rows)
    for dtype in (np.uint16, np.uint32):
        out = tmp_path / np.dtype(dtype).name
        out.mkdir()
        layout, tokens = _random_layout(rng, n_rows, dtype)
        asked = []

        def tokens_of(r0, r1):
            asked.append((r0, r1))
            return tokens[layout.token_starts[r0] : layout.token_starts[r1]].copy()

        entry = write_rows(layout, tokens_of, out, 7, fmt)
        names = formats.file_names(fmt, 7) + [(*formats.CHECKSUMS[:2], "shard-00007" + formats.CHECKSUMS[2])]
        assert list(entry) == [k for name_key, sha_key, _ in names for k in (name_key, sha_key)]
        assert sorted(p.name for p in out.iterdir()) == sorted(name for _, _, name in names)
        for name, sha256 in formats.entry_files(fmt, entry):
            assert name.startswith("shard-00007.")
            assert sha256 == hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert [r1 for _, r1 in asked][-1] == n_rows and all(r1 - r0 <= ROWS_PER_BATCH for r0, r1 in asked)
        sums = checksums.read_sums(out / entry["checksums_file"], entry["checksums_sha256"], len(names) - 1)
        expected = [(tokens[a:b].tolist(), layout.offsets[o:p].tolist()) for a, b, o, p in
                    zip(layout.token_starts[:-1], layout.token_starts[1:], layout.offset_starts[:-1], layout.offset_starts[1:])]
        for by_checksums in (None, sums):  # the format's own reading, and by the checksummed ranges
            got_rows, got_ids = [], []
            for rows, doc_ids in formats.shard_blocks(out, entry, fmt, by_checksums):
                assert rows.tokens.dtype == dtype and rows.offsets.dtype == np.int32
                got_rows += [tuple(x.tolist() for x in rows.row(k)) for k in range(len(rows))]
                got_ids += doc_ids.tolist()
            assert got_rows == expected and got_ids == layout.doc_ids.tolist()


def test_arrow_and_memmap_entries_keep_their_keys():
    """Manifests of existing builds stay byte-identical: the same keys, in the same order."""
    assert [k for n, s, _ in formats.file_names("arrow", 0) for k in (n, s)] == ["file", "sha256"]
    assert [k for n, s, _ in formats.file_names("memmap", 0) for k in (n, s)] == [
        "file", "sha256", "index_file", "index_sha256"]
    assert [name for *_, name in formats.file_names("memmap", 12)] == ["shard-00012.bin", "shard-00012.idx"]


def test_a_manifest_names_only_files_in_its_directory():
    for bad in ("../shard-00000.arrow", "/etc/passwd", "a/b.arrow", "..", "", None):
        with pytest.raises(ValueError, match="expected a file name inside the dataset directory"):
            formats.entry_files("arrow", {"file": bad, "sha256": "0"})
    with pytest.raises(ValueError, match="index_file=None"):
        formats.entry_files("memmap", {"file": "shard-00000.bin", "sha256": "0"})
    with pytest.raises(ValueError, match=f"unknown shard format .parquet.; this packer reads and writes {', '.join(FORMATS)}$"):
        formats.get("parquet")


def test_every_format_fills_the_protocol_and_its_derived_files_are_reserved():
    """Each format names the files it keeps beside its shards and derives them from the entries alone;
    no shard entry may name one of them (nor packer's own files)."""
    shards = [{"file": "shard-00000.arrow", "sha256": "0" * 64, "sequences": 1}]
    for fmt, module in FORMATS.items():
        assert {"FILES", "EXTRA_FILES", "write", "blocks", "stream_index", "stream_block", "DERIVED_FILES",
                "derived_files"} <= set(dir(module)), fmt
        derived = formats.derived_files(fmt, shards)
        assert set(derived) == set(module.DERIVED_FILES) and formats.derived_files(fmt, [dict(shards[0])]) == derived
        for name in [*module.DERIVED_FILES, "manifest.json", "tokenizer.json"]:
            with pytest.raises(ValueError, match="one of packer's own files, not a shard"):
                formats.entry_files("arrow", {"file": name, "sha256": "0"})
    assert formats.derived_files("memmap", shards) == {} and set(formats.derived_files("arrow", shards)) == {
        "state.json", "dataset_info.json"}
    assert formats.manifest_format({}) == "arrow" and formats.manifest_format({"format": "memmap"}) == "memmap"


def _rows_format():
    """A new format as its module would be: memmap's bytes under its own suffixes, and one derived
    file (the shards and their row counts) beside them."""
    from packer.store.formats import memmap

    module = types.ModuleType("rows_format")
    module.FILES = (("file", "sha256", ".tok"), ("index_file", "index_sha256", ".tix"))
    module.EXTRA_FILES = {}
    module.write, module.blocks = memmap.write, memmap.blocks
    module.stream_index, module.stream_block = memmap.stream_index, memmap.stream_block
    module.DERIVED_FILES = ("rows.txt",)
    module.derived_files = lambda shards: {"rows.txt": "".join(f"{s['file']} {s['sequences']}\n" for s in shards).encode()}
    return module


def test_a_new_format_is_one_module_and_one_line_in_the_table(tmp_path, monkeypatch):
    """Registered in FORMATS and nowhere else, a format is a config choice, is built end to end (its
    derived file written by finalize and recorded as packer's own), verified (an edited derived file
    refused) and read back: the rows a memmap build of the same inputs stores."""
    from conftest import TOKENIZER, sample_heads

    from packer.config import BuildConfig, Job
    from packer.preprocess import owned
    from packer.preprocess.pipeline import build
    from packer.store.dataset import open_dataset
    from packer.store.verify import verify_dataset

    with pytest.raises(ValueError, match=f"format must be one of {', '.join(FORMATS)}; got 'rows'"):
        BuildConfig(format="rows")
    rows_format = _rows_format()
    monkeypatch.setitem(FORMATS, "rows", rows_format)
    (tmp_path / "in").mkdir()
    inputs = tuple(sample_heads(tmp_path / "in", 60_000))

    def job(fmt):
        return Job(inputs=inputs, tokenizer=TOKENIZER, output=str(tmp_path / fmt), workers=1,
                   config=BuildConfig(context_length=256, shard_size=20_000, format=fmt))

    manifest, reference = build(job("rows")), build(job("memmap"))
    out = tmp_path / "rows"
    assert len(manifest["shards"]) > 1 and manifest["config"]["format"] == "rows"
    assert [(e["file"], e["index_file"]) for e in manifest["shards"]] == [
        (f"shard-{k:05d}.tok", f"shard-{k:05d}.tix") for k in range(len(manifest["shards"]))]
    assert (out / "rows.txt").read_bytes() == rows_format.derived_files(manifest["shards"])["rows.txt"]
    assert "rows.txt" in owned.load(out)["files"] and not (tmp_path / "memmap" / "rows.txt").exists()
    assert verify_dataset(out)["sequences"] == reference["totals"]["sequences"]
    got, want = open_dataset(out), open_dataset(tmp_path / "memmap")
    assert len(got) == len(want) and all(
        all(np.array_equal(a, b) for a, b in zip(got[i], want[i])) for i in range(len(want)))
    (out / "rows.txt").write_bytes(b"edited\n")
    with pytest.raises(ValueError, match="rows.txt: not what this dataset's manifest gives"):
        verify_dataset(out)
