"""The shard-format seam: the registry is the one list of formats, and every format writes its
files under the names and manifest keys it declares and reads back exactly the rows it was given."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from packer import config
from packer.preprocess.writer import write_rows
from packer.store import checksums, formats
from packer.store.formats import FORMATS
from packer.store.rows import ROWS_PER_BATCH, Layout


def test_config_lists_exactly_the_registered_formats():
    assert config.FORMATS == tuple(FORMATS)
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
