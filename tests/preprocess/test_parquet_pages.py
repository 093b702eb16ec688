"""packer's own Parquet page reader (readers/parquet/pages.py) against pyarrow's path: for every
codec, encoding, page version, nullability and text type pyarrow writes, the same texts, skips and
examples row for row, huge values as Utf8Text; what it does not read falls back untouched; and a
build gives the same shard bytes either way."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TOKENIZER, sample_texts

from packer.config import BuildConfig, Job
from packer.io.utf8 import Utf8Text
from packer.preprocess.pipeline import build
from packer.preprocess.readers import SkipLog, columns, plan_units, read_records, read_unit
from packer.preprocess.readers.parquet import page_headers, page_levels, page_streams, reader, snappy_pieces
from packer.preprocess.readers.parquet import pages as parquet_pages

HUGE = 2000  # HUGE_TEXT_BYTES in these tests
MAX_DOC_BYTES = 9000


@pytest.fixture
def small_huge(monkeypatch):
    monkeypatch.setattr(columns, "HUGE_TEXT_BYTES", HUGE)
    monkeypatch.setattr(parquet_pages, "HUGE_TEXT_BYTES", HUGE)


def _text(rng: random.Random, n_bytes: int) -> str:
    """Sample prose of about n_bytes (within a few bytes: cut between characters), multi-byte characters included."""
    texts = sample_texts()
    out = ""
    while len(out.encode()) < n_bytes:
        out += rng.choice(texts) + " \u00e9\u3000\U0001F600 "
    return out.encode()[:n_bytes].decode("utf-8", "ignore")


def _values(seed: int, nullable: bool, binary: bool) -> list:
    """Small and huge values, around the threshold and over MAX_DOC_BYTES, empties, blanks and repeats."""
    rng = random.Random(seed)
    values = [_text(rng, n) for n in (10, HUGE - 1, HUGE, HUGE + 1, 5000, 300, 20_000, 8000, 40, 2500)]
    values += ["", " " * 3000, "short", values[4], values[0], "\u3000" * 900, values[6]]
    if nullable:
        values += [None, None]
    rng.shuffle(values)
    values = values * 3
    if binary:
        values = [None if v is None else v.encode() for v in values]
        values[3:3] = [b"caf\xe9", b"\xff" * 4000, b"", b"ok"]
    return values


def _read(path, max_doc_bytes=MAX_DOC_BYTES):
    """(texts as str, their types, skip counts, skip examples) of reading `path` whole."""
    skips = SkipLog.empty()
    texts = [t for u in plan_units([str(path)], 1 << 30) for t in read_unit(u, skips, max_doc_bytes=max_doc_bytes)]
    return [str(t) for t in texts], [type(t).__name__ for t in texts], dict(skips.counts), skips.examples


def _page_chunks(path) -> int:
    """How many row groups of `path` packer reads page by page."""
    with pa.memory_map(str(path)) as f:
        meta = pq.ParquetFile(f).metadata
        column = parquet_pages.column_index(meta, "text")
        return sum(parquet_pages.page_chunk(f, meta, i, column) is not None for i in range(meta.num_row_groups))


def _n_pages(path) -> int:
    with pa.memory_map(str(path)) as f:
        meta = pq.ParquetFile(f).metadata
        column = parquet_pages.column_index(meta, "text")
        return sum(len(parquet_pages.page_chunk(f, meta, i, column).pages) for i in range(meta.num_row_groups))


KINDS = {"string": pa.string(), "large_string": pa.large_string(), "binary": pa.binary()}


def _count_calls(monkeypatch, module) -> list:
    """Patch module.decompress to note each result that is not None."""
    done, decompress = [], module.decompress

    def counted(*args):
        data = decompress(*args)
        done.extend([1] if data is not None else [])
        return data

    monkeypatch.setattr(module, "decompress", counted)
    return done


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "gzip", "brotli"])
@pytest.mark.parametrize("kind", KINDS)
def test_pages_read_as_pyarrow_reads_them(tmp_path, monkeypatch, small_huge, compression, kind):
    """Every combination pyarrow writes reads the same; huge pages of snappy, zstd, gzip and brotli
    are decompressed a piece at a time (snappy_pieces, page_streams)."""
    cases = n_pages = 0
    pieces, streams = _count_calls(monkeypatch, snappy_pieces), _count_calls(monkeypatch, page_streams)
    for dictionary in (True, False):
        for version in ("1.0", "2.0"):
            for nullable in (True, False):
                values = _values(len(kind) + cases, nullable, kind == "binary")
                table = pa.table({"id": pa.array(range(len(values))),
                                  "text": pa.array(values, KINDS[kind])},
                                 schema=pa.schema([("id", pa.int64()), pa.field("text", KINDS[kind], nullable)]))
                path = tmp_path / f"{dictionary}-{version}-{nullable}.parquet"
                pq.write_table(table, path, compression=compression, use_dictionary=dictionary,
                               data_page_version=version, data_page_size=3000, write_batch_size=4,
                               row_group_size=len(values) // 3 + 1)
                new = _read(path)
                with monkeypatch.context() as m:
                    m.setattr(reader, "huge_chunks", lambda *a: {})  # pyarrow's path alone
                    old = _read(path)
                assert new[0] == old[0] and new[2:] == old[2:], (dictionary, version, nullable)
                assert "Utf8Text" in new[1] and "Utf8Text" in old[1]
                assert _page_chunks(path) == 3  # every row group read page by page
                n_pages += _n_pages(path)
                expected = {"empty_text", "too_large"} | ({"null_text"} if nullable else set())
                assert expected | ({"invalid_utf8"} if kind == "binary" else set()) == set(new[2])
                cases += 1
    assert cases == 8 and n_pages > 8 * 3 * 3  # several pages a chunk
    assert (len(pieces) > 20) == (compression == "snappy") and (len(streams) > 20) == (compression in ("zstd", "gzip", "brotli"))


def test_a_chunk_without_a_huge_page_and_odd_chunks_go_to_pyarrow(tmp_path, monkeypatch, small_huge):
    """Pages all under HUGE_TEXT_BYTES, DELTA_BYTE_ARRAY, LZ4 (its footer name covers Hadoop's framing) and
    a column inside a struct are pyarrow's: page_chunk declines them before reading a value."""
    values = _values(7, True, False)
    small = [v for v in values if v is None or len(v.encode()) <= HUGE // 2]
    cases = {"small-pages": (small, dict(use_dictionary=False, data_page_size=HUGE // 4, write_batch_size=1)),
             "delta": (values, dict(use_dictionary=False, column_encoding={"text": "DELTA_BYTE_ARRAY"})),
             "lz4": (values, dict(compression="lz4"))}
    for name, (texts, kw) in cases.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"text": texts}), path, **kw)
        assert _page_chunks(path) == 0, name
        with monkeypatch.context() as m:
            m.setattr(parquet_pages, "page_chunk", lambda *a: pytest.fail("read as a page chunk"))
            m.setattr(reader, "huge_chunks", lambda *a: {})
            old = _read(path)
        assert _read(path) == old
        assert old[0] == [v for v in texts if v and not v.isspace() and len(v.encode()) <= MAX_DOC_BYTES]
    nested = pa.table({"doc": pa.array([{"text": "x" * 5000}])})
    pq.write_table(nested, tmp_path / "nested.parquet")
    assert parquet_pages.column_index(pq.ParquetFile(tmp_path / "nested.parquet").metadata, "text") is None


def test_rows_are_numbered_across_groups_read_either_way(tmp_path, small_huge):
    """Row groups read by pyarrow and by pages in one unit: rows numbered across the file."""
    values = ["a", None, "b"] * 2 + ["x" * 5000, None, ""] + ["c", ""] * 3
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": values}), path, row_group_size=6)
    assert _page_chunks(path) == 1
    assert reader._runs(next(iter(plan_units([str(path)], 1 << 30))), {1: None}) == [(0, 1), (1, 2), (2, 3)]
    texts, kinds, counts, examples = _read(path)
    assert texts == ["a", "b", "a", "b", "x" * 5000, "c", "c", "c"] and kinds[4] == "Utf8Text"
    assert [e["where"] for e in examples] == [f"{path} row {r}" for r in (1, 4, 7, 8, 10)]
    assert counts == {"null_text": 3, "empty_text": 4}


def test_a_huge_value_is_a_view_of_the_page_not_a_copy(tmp_path, small_huge):
    for dictionary in (True, False):
        path = tmp_path / f"{dictionary}.parquet"
        pq.write_table(pa.table({"text": ["a", "y" * 5000]}), path, use_dictionary=dictionary, compression="none")
        (huge,) = [t for t in _read_raw(path) if isinstance(t, Utf8Text)]
        assert isinstance(huge.data.obj, bytes) and huge.n_bytes == 5000  # the page as read (stored uncompressed)
        assert len(huge.data.obj) > 5000  # the page's whole buffer underneath, not a copy of the value


def _read_raw(path):
    return [t for u in plan_units([str(path)], 1 << 30) for t in read_unit(u, SkipLog.empty(), max_doc_bytes=MAX_DOC_BYTES)]


def test_rle_hybrid_by_hand():
    rle = parquet_pages._rle_hybrid
    assert rle(b"\x02\x01", 1, 1, "f").tolist() == [1]
    assert rle(b"\x03\x05", 1, 5, "f").tolist() == [1, 0, 1, 0, 0]
    assert rle(b"\x06\x02\x03\x88\xc6\xfa", 3, 11, "f").tolist() == [2, 2, 2, 0, 1, 2, 3, 4, 5, 6, 7]
    assert rle(b"\x08", 0, 4, "f").tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="cut short"):
        rle(b"\x03", 1, 8, "f")


def test_page_header_fields_and_skipped_ones():
    """A header with fields packer skips (a CRC, statistics with binary min/max, an unknown list, map,
    bool and double) between the ones it reads; cut short anywhere it says Truncated."""
    def varint(n):
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out

    def i32(step, n):
        return bytes([step << 4 | page_headers.I32]) + varint(n << 1 if n >= 0 else (-n << 1) - 1)

    stats = bytes([1 << 4 | page_headers.BINARY]) + varint(3) + b"max" + bytes([page_headers.STOP])
    data_page = i32(1, 7) + i32(1, 0) + i32(1, 3) + i32(1, 3) + bytes([1 << 4 | page_headers.STRUCT]) + stats + b"\x00"
    header = (i32(1, 0) + i32(1, 123) + i32(1, 45) + i32(1, -9)  # type, sizes, crc
              + bytes([1 << 4 | page_headers.STRUCT]) + data_page
              + bytes([page_headers.LIST]) + varint(40 << 1)  # field 40 (long form): a list of 2 bools
              + bytes([2 << 4 | page_headers.TRUE]) + b"\x01\x02"
              + bytes([1 << 4 | page_headers.MAP]) + varint(1) + bytes([page_headers.BINARY << 4 | page_headers.DOUBLE])
              + varint(1) + b"k" + b"\x00" * 8
              + bytes([1 << 4 | page_headers.TRUE]) + b"\x00")
    got, n = page_headers.read_page_header(header + b"rest of the page")
    assert n == len(header)
    assert got == {"type": 0, "uncompressed_page_size": 123, "compressed_page_size": 45,
                   "data_page_header": {"num_values": 7, "encoding": 0, "definition_level_encoding": 3,
                                        "repetition_level_encoding": 3}}
    pyarrows = bytes.fromhex("15 00 15 a8 1f 15 e8 01 2c 15 04 15 00 15 06 15 06 1c 00 00 00")  # 2 PLAIN values, snappy
    assert page_headers.read_page_header(pyarrows) == ({
        "type": 0, "uncompressed_page_size": 2004, "compressed_page_size": 116,
        "data_page_header": {"num_values": 2, "encoding": 0, "definition_level_encoding": 3,
                              "repetition_level_encoding": 3}}, 21)
    for cut in range(len(header)):
        with pytest.raises(page_headers.Truncated):
            page_headers.read_page_header(header[:cut])
    with pytest.raises(ValueError):
        page_headers.read_page_header(bytes([1 << 4 | 13]))  # no such type


def test_a_build_gives_the_bytes_of_pyarrows_path(tmp_path, monkeypatch, small_huge):
    rng = random.Random(3)
    values = [_text(rng, n) for n in (100, 6000, 50, 3000, 200)] + [None, ""]
    for dictionary in (True, False):
        path = tmp_path / f"in-{dictionary}" / "a.parquet"
        path.parent.mkdir()
        pq.write_table(pa.table({"text": values * 2}), path, use_dictionary=dictionary, row_group_size=5)
        assert _page_chunks(path) >= 2
        manifests = {}
        for name in ("pages", "pyarrow"):
            with monkeypatch.context() as m:
                if name == "pyarrow":
                    m.setattr(reader, "huge_chunks", lambda *a: {})
                job = Job(inputs=(str(path),), tokenizer=TOKENIZER, output=str(tmp_path / f"{name}-{dictionary}"),
                          workers=1, config=BuildConfig(context_length=256, max_doc_bytes=MAX_DOC_BYTES))
                manifests[name] = build(job)["totals"]
        assert manifests["pages"] == manifests["pyarrow"] and manifests["pages"]["docs_accepted"] == 10
        shards = [{p.name: p.read_bytes() for p in sorted((tmp_path / f"{name}-{dictionary}").glob("shard-*"))}
                  for name in ("pages", "pyarrow")]
        assert shards[0] == shards[1] and shards[0]


def test_a_huge_snappy_page_is_decompressed_in_pieces(tmp_path, monkeypatch, small_huge):
    """A Snappy page over HUGE_TEXT_BYTES goes through snappy_pieces (here cut at every 64 KiB block),
    and reads as pyarrow reads it; where that declines, the page is decompressed whole, the same."""
    monkeypatch.setattr(snappy_pieces, "PIECE_BYTES", 1)
    rng = random.Random(5)
    values = ["a", _text(rng, 300_000), None, _text(rng, 70_000), ""]
    calls = []
    decompress = snappy_pieces.decompress
    monkeypatch.setattr(snappy_pieces, "decompress", lambda *a: calls.append(a[-1]) or decompress(*a))
    for dictionary in (True, False):
        for version in ("1.0", "2.0"):
            path = tmp_path / f"{dictionary}-{version}.parquet"
            pq.write_table(pa.table({"text": values}), path, use_dictionary=dictionary, data_page_version=version)
            new = _read(path, max_doc_bytes=1 << 20)
            with monkeypatch.context() as m:
                m.setattr(reader, "huge_chunks", lambda *a: {})
                assert new == _read(path, max_doc_bytes=1 << 20)
            with monkeypatch.context() as m:
                m.setattr(snappy_pieces, "decompress", lambda *a: None)
                assert new == _read(path, max_doc_bytes=1 << 20)
            assert new[1] == ["str", "Utf8Text", "Utf8Text"]
    assert len(calls) == 4 and min(calls) > 370_000


def _records(path) -> list:
    """(where, {field: (type name, str)}) of each record of `path`, and whether any came as a Utf8Text."""
    out = []
    for u in plan_units([str(path)], 1 << 30):
        for where, record in read_records(u, SkipLog.empty(), ("prompt", "completion")):
            out.append((where, {k: (type(v).__name__, str(v)) for k, v in record.items()}))
    return out


def test_records_read_as_pyarrow_reads_them(tmp_path, monkeypatch, small_huge):
    """Prompt/completion string columns with a huge value: the same records, huge values a Utf8Text
    where pyarrow gives a str; a binary column leaves the row group to pyarrow (list columns:
    test_parquet_lists.py)."""
    rng = random.Random(11)
    prompts = [_text(rng, n) for n in (30, 2500, 10)] + [None, "", "p"] * 2
    completions = [_text(rng, n) for n in (3000, 20, 40_000)] + ["c", None, " "] * 2
    for compression in ("none", "snappy", "zstd"):
        for dictionary in (True, False):
            for version in ("1.0", "2.0"):
                path = tmp_path / f"{compression}-{dictionary}-{version}.parquet"
                pq.write_table(pa.table({"id": list(range(9)), "completion": completions, "prompt": prompts}), path,
                               compression=compression, use_dictionary=dictionary, data_page_version=version,
                               row_group_size=4, data_page_size=1000, write_batch_size=2)
                read, real = [], reader.huge_record_chunks
                with monkeypatch.context() as m:
                    m.setattr(reader, "huge_record_chunks", lambda *a: read.append(real(*a)) or read[-1])
                    new = _records(path)
                with monkeypatch.context() as m:
                    m.setattr(reader, "huge_record_chunks", lambda *a: {})
                    old = _records(path)
                assert [(w, {k: t for k, (_, t) in r.items()}) for w, r in new] == [
                    (w, {k: t for k, (_, t) in r.items()}) for w, r in old]
                kinds = [k for _, r in new for k, _ in r.values()]
                # pyarrow's path hands huge values on as Utf8Text too (columns._huge_records): the page reader ran
                assert kinds.count("Utf8Text") == 3 and kinds == [k for _, r in old for k, _ in r.values()]
                assert any(read)
                assert new[3] == (f"{path} row 3", {"completion": ("str", "c")})  # nulls left out
    assert list(_records(path)[0][1]) == ["prompt", "completion"]  # the fields' order, not the file's
    binary = tmp_path / "binary.parquet"
    pq.write_table(pa.table({"prompt": [p.encode() if p else p for p in prompts], "completion": completions}), binary)
    with monkeypatch.context() as m:
        m.setattr(page_levels, "chunk_records", lambda *a: pytest.fail("read by pages"))
        assert len(_records(binary)) == 9


def test_a_prompt_completion_build_gives_the_bytes_of_pyarrows_path(tmp_path, monkeypatch, small_huge):
    rng = random.Random(4)
    path = tmp_path / "in" / "a.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"prompt": ["Say it: ", _text(rng, 3000), None, "q"],
                             "completion": [_text(rng, 9000), "short", "x", " "]}), path, row_group_size=2)
    totals, groups, read_groups = {}, [], reader.huge_record_chunks
    for name in ("pages", "pyarrow"):
        with monkeypatch.context() as m:
            if name == "pyarrow":
                m.setattr(reader, "huge_record_chunks", lambda *a: {})
            else:
                m.setattr(reader, "huge_record_chunks", lambda *a: groups.append(read_groups(*a)) or groups[-1])
            job = Job(inputs=(str(path),), tokenizer=TOKENIZER, output=str(tmp_path / name), workers=1,
                      config=BuildConfig(context_length=256, input_kind="prompt-completion", max_doc_bytes=1 << 20))
            totals[name] = build(job)["totals"]
    assert totals["pages"] == totals["pyarrow"] and totals["pages"]["docs_accepted"] == 2
    assert [list(g) for g in groups] == [[0]]  # row group 0 read by pages, group 1 by pyarrow
    shards = [{p.name: p.read_bytes() for p in sorted((tmp_path / name).glob("shard-*"))} for name in ("pages", "pyarrow")]
    assert shards[0] == shards[1] and shards[0]


def test_headers_packer_cannot_read_leave_the_chunk_to_pyarrow(tmp_path, small_huge):
    """A page header that does not parse, or a page type or count that does not fit the footer: page_chunk
    declines the chunk (pyarrow then reads it, or reports it) before a value is read."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["a", "x" * 5000]}), path, use_dictionary=False, compression="none")
    assert _page_chunks(path) == 1
    data = path.read_bytes()
    at = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    assert data[at:at + 2] == b"\x15\x00"  # field 1 (type): DATA_PAGE
    for name, header in (("index-page", b"\x15\x02"), ("no-such-type", b"\x1d\x00"), ("bad-varint", b"\x15\xff")):
        bad = tmp_path / f"{name}.parquet"
        bad.write_bytes(data[:at] + header + data[at + 2:])
        assert _page_chunks(bad) == 0, name
    fewer = tmp_path / "fewer.parquet"  # num_values 2 -> 1: the pages no longer add up to the rows
    i = data.index(b"\x15\x04", at)
    fewer.write_bytes(data[:i] + b"\x15\x02" + data[i + 2:])
    assert _page_chunks(fewer) == 0
