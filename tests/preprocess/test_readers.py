"""Readers: every format yields the same documents; unit planning at any byte size yields every
record once; bad records are counted by reason; file discovery is sorted, skips hidden entries
and refuses symlink loops."""

from __future__ import annotations

import gzip
import json
import os
import random
import types

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLE_INPUTS, sample_texts

from packer.preprocess import readers
from packer.preprocess.readers import FileError, SkipLog, expand_inputs, file_format, plan_units, read_unit
from packer.preprocess.readers.common import decode, open_lines, where, whole_file


def _docs(n=60, seed=0):
    """Real sample texts, cut short, plus unicode, the EOS string and a NUL byte."""
    rng = random.Random(seed)
    texts = [t[: rng.randint(1, 400)] for t in sample_texts()[:n]]
    return texts + ["café ünïcode 日本語 🙂", "has <|endoftext|> inside", "nul \x00 byte", "  "]


def _read_all(files, unit_bytes=10**9, **kw):
    skips = SkipLog.empty()
    split = kw.get("text_split", "file")
    texts = [t for u in plan_units(files, unit_bytes, text_split=split) for t in read_unit(u, skips, **kw)]
    return texts, skips


def _jsonl_bytes(texts, field="text"):
    return "".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)).encode()


def write_format(tmp_path, fmt, texts):
    """Write `texts` in one input format; return the input paths (one doc per file for txt)."""
    if fmt == "jsonl":
        (tmp_path / "a.jsonl").write_bytes(_jsonl_bytes(texts))
    elif fmt == "jsonl.gz":
        (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(_jsonl_bytes(texts)))
    elif fmt == "jsonl.zst":
        with pa.output_stream(str(tmp_path / "a.jsonl.zst"), compression="zstd") as f:
            f.write(_jsonl_bytes(texts))
    elif fmt == "parquet":
        pq.write_table(pa.table({"id": range(len(texts)), "text": texts}), tmp_path / "a.parquet", row_group_size=7)
    elif fmt == "arrow":
        table = pa.table({"text": texts})
        with ipc.new_file(str(tmp_path / "a.arrow"), table.schema) as w:
            for batch in table.to_batches(max_chunksize=9):
                w.write_batch(batch)
    elif fmt == "hf":
        write_hf_dataset(tmp_path / "hf", texts)
    elif fmt == "txt":
        for i, t in enumerate(texts):
            (tmp_path / f"doc{i:04d}.txt").write_text(t, encoding="utf-8")
    else:
        raise AssertionError(fmt)
    return [str(tmp_path / ("hf" if fmt == "hf" else "")) if fmt in ("hf", "txt") else str(next(tmp_path.iterdir()))]


def write_hf_dataset(directory, texts, n_files=2):
    """The layout of HF `datasets.save_to_disk`: Arrow *stream* files + state.json + dataset_info.json."""
    directory.mkdir()
    names = [f"data-{i:05d}-of-{n_files:05d}.arrow" for i in range(n_files)]
    per = -(-len(texts) // n_files)
    for i, name in enumerate(names):
        table = pa.table({"text": texts[i * per:(i + 1) * per], "n": list(range(len(texts[i * per:(i + 1) * per])))})
        with ipc.new_stream(str(directory / name), table.schema) as w:
            w.write_table(table, max_chunksize=5)
    (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names]}))
    (directory / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}))


FORMATS = ["jsonl", "jsonl.gz", "jsonl.zst", "parquet", "arrow", "hf"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_yields_the_same_documents(tmp_path, fmt):
    texts = [t for t in _docs() if t.strip()]
    files = expand_inputs(write_format(tmp_path, fmt, texts))
    got, skips = _read_all(files)
    assert got == texts and not skips.counts


def _records_of(files, unit_bytes=10**9, fields=("text",), fix=""):
    skips = SkipLog.empty()
    got = [r for u in plan_units(files, unit_bytes) for r in readers.read_records(u, skips, fields, fix=fix)]
    return got, skips


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_yields_the_same_records(tmp_path, fmt):
    """The record way of reading, from the same reader module: each document's record, in file order,
    once at any unit size; a table gives the asked-for columns, JSONL the whole object; the fields
    --input-kind auto reads are the first record's keys or the columns, the same for every unit."""
    texts = [t for t in _docs() if t.strip()]
    files = expand_inputs(write_format(tmp_path, fmt, texts))
    for unit_bytes in (10**9, 97):
        got, skips = _records_of(files, unit_bytes)
        assert [r["text"] for _, r in got] == texts and not skips.counts
    assert set(got[0][1]) == ({"text", "id"} if fmt.startswith("jsonl") else {"text"})
    assert got[0][0] == (f"{files[0]}:1" if fmt.startswith("jsonl") else f"{files[0]} row 0")
    names = [readers.field_names(u) for u in plan_units(files, 97)]
    assert names[0] == {"jsonl": {"text", "id"}, "parquet": {"text", "id"}, "arrow": {"text"}, "hf": {"text", "n"}}[
        fmt.split(".")[0]]
    assert all(n == names[0] for n in names) and (len(names) > 1 or fmt != "jsonl")  # a later byte range too


def test_records_errors_and_skips(tmp_path):
    """A text file holds no records (FileError, no fields); a table without the first field names the
    fix; JSONL lines and array elements that are no object are counted, as the text way counts them."""
    (tmp_path / "a.txt").write_text("just text", encoding="utf-8")
    with pytest.raises(FileError, match="a txt input holds text, not records; use --input-kind text"):
        _records_of([str(tmp_path / "a.txt")])
    assert readers.field_names(plan_units([str(tmp_path / "a.txt")], 10**9)[0]) == set()
    pq.write_table(pa.table({"prompt": ["p"]}), tmp_path / "b.parquet")
    with pytest.raises(FileError, match=r"no column 'messages' \(columns: prompt; choose it with --x\)"):
        _records_of([str(tmp_path / "b.parquet")], fields=("messages",), fix="choose it with --x")
    (tmp_path / "c.jsonl").write_bytes(b'{"a": 1}\n[1]\n{"a": \n\n"s"\n{"b": 2}\n')
    got, skips = _records_of([str(tmp_path / "c.jsonl")])
    assert got == [(f"{tmp_path / 'c.jsonl'}:1", {"a": 1}), (f"{tmp_path / 'c.jsonl'}:6", {"b": 2})]
    assert dict(skips.counts) == {"missing_field": 2, "malformed_json": 1}
    (tmp_path / "d.json").write_text('[{"a": 1}, 2, {"b": 3}]', encoding="utf-8")
    got, skips = _records_of([str(tmp_path / "d.json")])
    assert got == [(f"{tmp_path / 'd.json'} record 0", {"a": 1}), (f"{tmp_path / 'd.json'} record 2", {"b": 3})]
    assert dict(skips.counts) == {"missing_field": 1}


def test_text_files_one_document_each(tmp_path):
    texts = [t for t in _docs() if t.strip()]
    got, _ = _read_all(expand_inputs(write_format(tmp_path, "txt", texts)))
    assert got == texts
    (tmp_path / "blank.txt").write_text(" \n")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n\nok\n")
    got, skips = _read_all([str(tmp_path / "blank.txt"), str(tmp_path / "latin1.txt")])
    assert got == [] and dict(skips.counts) == {"empty_text": 1, "invalid_utf8": 1}
    got, skips = _read_all([str(tmp_path / "latin1.txt")], text_split="blank-line")
    assert got == ["ok"] and skips.examples == [{"where": f"{tmp_path / 'latin1.txt'}:1", "reason": "invalid_utf8"}]


def _paragraph_reference(data: bytes) -> list[str]:
    """Documents = maximal runs of non-blank lines (the obvious slow way)."""
    docs, cur = [], []
    for line in data.split(b"\n"):
        if line.strip():
            cur.append(line)
        elif cur:
            docs.append(b"\n".join(cur).rstrip(b"\r").decode())
            cur = []
    if cur:
        docs.append(b"\n".join(cur).rstrip(b"\r").decode())
    return docs


def test_blank_line_split_at_every_unit_size(tmp_path):
    rng = random.Random(3)
    chunks = []
    for i in range(40):
        chunks.append("\n".join(f"p{i} line {j} " + "w" * rng.randint(0, 30) for j in range(rng.randint(1, 4))))
        chunks.append(rng.choice(["\n\n", "\n\n\n", "\n  \n", "\r\n\r\n"]))
    data = ("\n\n" + "".join(chunks)).encode()
    path = tmp_path / "p.txt"
    path.write_bytes(data)
    expected = _paragraph_reference(data)
    assert len(expected) == 40
    for unit_bytes in [1, 2, 3, 5, 17, 64, 333, 10**6]:
        got, _ = _read_all([str(path)], unit_bytes, text_split="blank-line")
        assert got == expected, unit_bytes
    with open(tmp_path / "p.txt.gz", "wb") as f:
        f.write(gzip.compress(data))
    assert _read_all([str(tmp_path / "p.txt.gz")], text_split="blank-line")[0] == expected


@pytest.mark.parametrize("unit_bytes", [1, 7, 100, 4096, 10**9])
def test_any_unit_size_reads_every_record_once(tmp_path, unit_bytes):
    path = tmp_path / "a.jsonl"
    texts = [f"doc {i} " + "x" * (i % 13) for i in range(200)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    got = []
    for unit in plan_units([str(path)], unit_bytes):
        got.extend(read_unit(unit, SkipLog.empty(), text_field="text"))
    assert got == texts


def test_lines_longer_than_a_block_and_no_final_newline(tmp_path):
    texts = ["a" * 3_000_000, "short", "b" * 1_500_000]
    path = tmp_path / "long.jsonl"
    path.write_bytes(_jsonl_bytes(texts).rstrip(b"\n"))
    for unit_bytes in (10**9, 1_000_000, 777_777):
        assert _read_all([str(path)], unit_bytes)[0] == texts
    got, skips = _read_all([str(path)], max_doc_bytes=2_000_000)
    assert got == texts[1:] and dict(skips.counts) == {"too_large": 1}
    assert skips.examples[0]["where"] == f"{path}:1: longer than --max-doc-bytes (raise the limit with --max-doc-bytes N)"


def test_bad_records_are_counted_by_reason(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'{"text": "good"}\n{"text": \n{"other": 1}\n{"text": null}\n{"text": 5}\n{"text": ""}\n'
        b'{"text": "caf\xe9"}\n[1, 2]\n\n{"text": "lone \\ud800 surrogate"}\n{"text": "pair \\ud83d\\ude00"}\n'
        b'{"text": "also good"}\n'
    )
    skips = SkipLog.empty()
    (unit,) = plan_units([str(path)], 10**6)
    assert list(read_unit(unit, skips, text_field="text")) == ["good", "pair \U0001F600", "also good"]
    assert dict(skips.counts) == {
        "malformed_json": 1, "missing_field": 2, "null_text": 1, "non_string_text": 1,
        "empty_text": 1, "invalid_utf8": 2,
    }
    assert [e["where"].split(": ")[0] for e in skips.examples] == [f"{path}:{n}" for n in (2, 3, 4, 5, 6)]
    later = plan_units([str(path)], 20)[1]  # a byte range past the start says the byte instead
    skips = SkipLog.empty()
    list(read_unit(later, skips))
    assert skips.examples == [{"where": f"{path}@byte 27", "reason": "missing_field"}]


def test_strict_raises_on_the_first_bad_record(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": null}\n')
    (unit,) = plan_units([str(path)], 10**6)
    with pytest.raises(ValueError, match=rf"{path}:2: null_text \(--strict"):
        list(read_unit(unit, SkipLog.empty(strict=True)))


def test_parquet_and_arrow_rows_nulls_and_binary(tmp_path):
    table = pa.table({"text": pa.array([b"one", None, b"", b"caf\xe9", b"two"], pa.binary())})
    pq.write_table(table, tmp_path / "b.parquet", row_group_size=2)
    units = plan_units([str(tmp_path / "b.parquet")], 10)
    assert [(u.start, u.end) for u in units] == [(0, 1), (1, 2), (2, 3)]
    got, skips = _read_all([str(tmp_path / "b.parquet")])
    assert got == ["one", "two"]
    assert dict(skips.counts) == {"null_text": 1, "empty_text": 1, "invalid_utf8": 1}
    assert [e["where"] for e in skips.examples] == [f"{tmp_path / 'b.parquet'} row {r}" for r in (1, 2, 3)]


def test_file_errors_name_the_file_and_cause(tmp_path):
    data = _jsonl_bytes(["x"] * 5000)
    cases = {
        "trunc.jsonl.gz": gzip.compress(data)[:500],
        "really_gzip.jsonl.zst": gzip.compress(data),
        "garbage.jsonl.gz": b"not gzip at all",
        "notparquet.parquet": b"PAR1 nope",
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
    pq.write_table(pa.table({"body": ["a"]}), tmp_path / "nocol.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "intcol.parquet")
    expect = {
        "trunc.jsonl.gz": "Truncated compressed stream",
        "really_gzip.jsonl.zst": "named as zstd but it is gzip data",
        "garbage.jsonl.gz": "not gzip data",
        "notparquet.parquet": "Parquet",
        "nocol.parquet": "no column 'text' (columns: body; choose one with --text-field)",
        "intcol.parquet": "column 'text' is int64, not text",
    }
    for name, message in expect.items():
        path = str(tmp_path / name)
        with pytest.raises(FileError) as info:
            _read_all([path])
        assert str(info.value).startswith(f"{path}: ") and message in str(info.value), str(info.value)
        assert "\n" not in str(info.value)
    skipped = []
    assert plan_units([str(tmp_path / "notparquet.parquet")], 10, skipped_files=skipped) == []
    assert skipped[0]["path"].endswith("notparquet.parquet")


def test_file_error_pickles_with_its_message():
    import pickle

    e = pickle.loads(pickle.dumps(FileError("a.jsonl.gz", "truncated")))
    assert str(e) == "a.jsonl.gz: truncated; --on-file-error skip would leave the file out and list it"
    assert e.cause == "truncated"


def test_formats_by_name():
    assert file_format("x/a.JSONL.zst") == ("jsonl", "zstd")
    assert file_format("a.json.gz") == ("jsonl", "gzip")
    assert file_format("b.txt") == ("txt", None)
    with pytest.raises(ValueError, match="unsupported input format: c.csv"):
        file_format("c.csv")
    with pytest.raises(ValueError, match="unsupported"):
        file_format("d.parquet.gz")


def _lines_reader():
    """A new input family, written as a reader module would be: .lines, one document per line."""
    module = types.ModuleType("lines")
    module.NAME, module.COMPRESSIBLE = "lines", True

    def plan(place, unit_bytes, *, compression, text_split):
        return whole_file(place)

    def texts(unit, place, skips, *, text_field, text_split, max_doc_bytes):
        f, _, _, _ = open_lines(unit, place)
        with f:
            for line_no, line in enumerate(f.read().split(b"\n"), 1):
                if line and (text := decode(line, where(unit, line_no, 0), skips)) is not None:
                    yield text

    module.plan, module.texts = plan, texts
    return module


def test_a_new_format_is_one_module_and_one_line_in_the_table(tmp_path, monkeypatch):
    """Registered in READERS and nowhere else, a reader is planned, read, named in the
    unsupported-format message and built end to end."""
    from conftest import TOKENIZER

    from packer.config import BuildConfig, Job
    from packer.preprocess.pipeline import build

    with pytest.raises(ValueError, match="unsupported input format"):
        file_format("a.lines")
    monkeypatch.setitem(readers.READERS, ".lines", _lines_reader())
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.lines").write_bytes(b"one\ntwo\n\xff bad\n")
    (tmp_path / "d" / "b.lines.gz").write_bytes(gzip.compress(b"three\n"))
    assert file_format("x/b.LINES.gz") == ("lines", "gzip")
    files = expand_inputs([str(tmp_path / "d")])
    assert [u.format for u in plan_units(files, 10**6)] == ["lines", "lines"]
    got, skips = _read_all(files)
    assert got == ["one", "two", "three"] and dict(skips.counts) == {"invalid_utf8": 1}
    with pytest.raises(ValueError, match=r"supported: .*\.txt, \.lines, each optionally \.gz/\.zst, \.parquet"):
        file_format("c.csv")
    manifest = build(Job(inputs=(str(tmp_path / "d"),), tokenizer=TOKENIZER, output=str(tmp_path / "out"), workers=1,
                         config=BuildConfig(context_length=64)))
    assert manifest["totals"]["docs_accepted"] == 3 and manifest["totals"]["docs_skipped"] == {"invalid_utf8": 1}


def test_every_reader_module_is_in_the_table():
    """Each module of packer/preprocess/readers/ but the shared ones is a reader in READERS, with the
    interface of common.Reader (texts and records both); and the table's suffixes name the formats the docs list."""
    import inspect
    import pkgutil

    # huge_json: the JSONL reader's in-place decoding of a huge line; columns: Arrow columns' texts (Parquet and
    # Arrow). The Parquet reader's own page reader lives inside its package, beside pyarrow's path (readers/parquet/).
    shared = {"common", "columns", "huge_json"}
    modules = {m.name for m in pkgutil.iter_modules(readers.__path__)} - shared
    parquet_modules = {m.name for m in pkgutil.iter_modules(readers.parquet.__path__)}
    assert parquet_modules == {"reader", "pages", "page_headers", "page_levels", "page_streams", "snappy_pieces"}
    assert modules == {r.__name__.rsplit(".", 1)[1] for r in readers.READERS.values()} == {
        "jsonl", "text", "parquet", "arrow"}
    for reader in set(readers.READERS.values()):
        assert isinstance(reader.NAME, str) and isinstance(reader.COMPRESSIBLE, bool)
        assert readers.reader_for(reader.NAME) is reader
        for fn, params in ((reader.plan, ["place", "unit_bytes", "compression", "text_split"]),
                           (reader.texts, ["unit", "place", "skips", "text_field", "text_split", "max_doc_bytes"]),
                           (reader.records, ["unit", "place", "skips", "fields", "max_doc_bytes", "fix"]),
                           (reader.field_names, ["unit", "place", "max_doc_bytes"])):
            assert list(inspect.signature(fn).parameters) == params, reader.NAME
    assert sorted(readers.READERS) == [".arrow", ".json", ".jsonl", ".ndjson", ".parquet", ".txt"]


def test_expand_inputs_directories_and_errors(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / ".git").mkdir()
    for name in ("d/b.jsonl", "d/a.jsonl", "d/sub/c.jsonl", "d/.hidden.jsonl", "d/.git/x.jsonl"):
        (tmp_path / name).write_text("")
    files = expand_inputs([str(tmp_path / "d")])
    assert [f.split("/d/")[1] for f in files] == ["a.jsonl", "b.jsonl", "sub/c.jsonl"]
    assert expand_inputs([str(tmp_path / "d" / "*.jsonl")]) == files[:2]
    with pytest.raises(FileNotFoundError, match="input not found"):
        expand_inputs([str(tmp_path / "missing.jsonl")])
    with pytest.raises(FileNotFoundError, match="matched no files"):
        expand_inputs([str(tmp_path / "d" / "*.parquet")])
    assert expand_inputs(list(SAMPLE_INPUTS)) == list(SAMPLE_INPUTS)


def test_symlinks_followed_and_loops_refused(tmp_path):
    """A loop is listed as the link, not walked, and planning refuses it (or skips it)."""
    (tmp_path / "d" / "real").mkdir(parents=True)
    (tmp_path / "d" / "real" / "a.jsonl").write_text("")
    os.symlink(tmp_path / "d" / "real", tmp_path / "d" / "link")
    assert [f.split("/d/")[1] for f in expand_inputs([str(tmp_path / "d")])] == ["link/a.jsonl", "real/a.jsonl"]
    os.symlink(tmp_path / "d", tmp_path / "d" / "real" / "loop")
    files = expand_inputs([str(tmp_path / "d")])
    assert [f.split("/d/")[1] for f in files] == ["link/a.jsonl", "link/loop", "real/a.jsonl", "real/loop"]
    with pytest.raises(FileError, match=rf"link/loop: symlink loop: it leads back to {tmp_path / 'd'}, a directory"):
        plan_units(files, 10**6)
    skipped = []
    assert [u.path for u in plan_units(files, 10**6, skipped_files=skipped)] == [files[0], files[2]]
    assert [s["path"] for s in skipped] == [files[1], files[3]] and "symlink loop" in skipped[0]["error"]


def test_hf_directory_contributes_only_its_data_files(tmp_path):
    write_hf_dataset(tmp_path / "ds", ["a", "b", "c"])
    files = expand_inputs([str(tmp_path)])
    assert [os.path.basename(f) for f in files] == ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]


def test_file_uris_through_pyarrow_fs(tmp_path):
    texts = [t for t in _docs(20) if t.strip()]
    (tmp_path / "d").mkdir()
    write_format(tmp_path / "d", "jsonl.gz", texts[:10])
    pq.write_table(pa.table({"text": texts[10:]}), tmp_path / "d" / "b.parquet")
    (tmp_path / "d" / ".hidden.jsonl").write_text("{}")
    uri = (tmp_path / "d").as_uri()
    files = expand_inputs([uri])
    assert files == [uri + "/a.jsonl.gz", uri + "/b.parquet"]
    assert _read_all(files)[0] == texts
    (tmp_path / "e.jsonl").write_bytes(_jsonl_bytes(texts))
    assert _read_all(expand_inputs([(tmp_path / "e.jsonl").as_uri()]), unit_bytes=100)[0] == texts


LINE_KINDS = [
    b'{"text": "plain %d"}', b'{"id": %d, "text": "with \\u00e9 and \\ud83d\\ude00", "meta": {"text": 1}}',
    b'{"text": "caf\xc3\xa9 %d"}', b'{"text": "x", "text": "dup %d"}', b'{"n": NaN, "text": "nan %d"}',
    b'{"text": "%d"} {"text": "two on a line"}', b'{"text": %d}', b'{"text": null, "n": %d}', b'{"n": %d}',
    b'{"text": ""}   ', b'[%d]', b'"%d"', b'{"text": "bad \xe9 %d"}', b'{"x": "bad \xff", "text": "t%d"}',
    b'{"text": "lone \\udc00 %d"}', b'{"text": "trailing %d",}', b'', b'   \r', b'{"text": "crlf %d"}\r',
    b'{"text": "' + b"long " * 40 + b'%d"}', b'[' * 3000 + b'%d',
    b'{"text": "   ", "n": %d}', b'{"text": " \\t\\u3000 ", "n": %d}', b'{"text": "cesu \xed\xa0\x80 %d"}',
    b'{"text": "hangul \xed\x9f\xbb %d"}',
]


def _reference_jsonl(data: bytes, max_bytes: int):
    """The obvious per-line reader: json.loads each non-blank line."""
    texts, counts = [], {}

    def skip(reason):
        counts[reason] = counts.get(reason, 0) + 1

    for line in data.split(b"\n"):
        if not line.strip():
            continue
        if len(line) > max_bytes:
            skip("too_large")
            continue
        try:
            record = json.loads(line)
        except UnicodeDecodeError:
            skip("invalid_utf8")
            continue
        except (ValueError, RecursionError):
            skip("malformed_json")
            continue
        if not isinstance(record, dict) or "text" not in record:
            skip("missing_field")
        elif record["text"] is None:
            skip("null_text")
        elif not isinstance(record["text"], str):
            skip("non_string_text")
        elif not record["text"].strip():  # empty or whitespace only, as in .txt
            skip("empty_text")
        else:
            try:
                record["text"].encode()
                texts.append(record["text"])
            except UnicodeEncodeError:
                skip("invalid_utf8")
    return texts, counts


def test_fast_and_per_line_paths_equal_a_reference_reader(tmp_path, monkeypatch):
    import packer.io.lines as line_reader
    import packer.preprocess.readers.jsonl as readers

    rng = random.Random(7)
    n_fast = 0
    real = readers._parse_block

    def counting(block, field, max_bytes):
        nonlocal n_fast
        out = real(block, field, max_bytes)
        n_fast += out is not None
        return out

    monkeypatch.setattr(readers, "_parse_block", counting)
    for trial in range(12):
        good_only = trial % 3 == 0  # whole blocks of good lines take the fast path
        kinds = LINE_KINDS[:5] if good_only else LINE_KINDS
        lines = [rng.choice(kinds).replace(b"%d", str(i).encode()) for i in range(rng.randint(1, 300))]
        data = rng.choice([b"", b"\xef\xbb\xbf"]) + b"\n".join(lines) + rng.choice([b"", b"\n"])  # BOM or not
        path = tmp_path / f"t{trial}.jsonl"
        path.write_bytes(data)
        monkeypatch.setattr(line_reader, "BLOCK_BYTES", rng.choice([64, 333, 4096, 1 << 20]))
        max_bytes = rng.choice([150, 10**9])
        expected = _reference_jsonl(data, max_bytes)
        for unit_bytes in (rng.randint(1, 200), rng.randint(200, 5000), 10**9):
            got, skips = _read_all([str(path)], unit_bytes, max_doc_bytes=max_bytes)
            assert (got, dict(skips.counts)) == expected, (trial, unit_bytes)
    assert n_fast > 10  # the fast path really ran, and agreed


def test_the_empty_text_check_reads_what_pyarrow_compute_reads():
    """jsonl._has_empty (offsets compared with numpy) against pyarrow.compute over random string
    arrays, their slices and chunked columns."""
    import pyarrow.compute as pc

    from packer.preprocess.readers import jsonl

    rng = random.Random(3)
    for trial in range(300):
        texts = [rng.choice(["", "a", "bc", "é", "def"]) if rng.random() < 0.2 else "xyz"[: rng.randint(1, 3)]
                 for _ in range(rng.randint(1, 40))]
        array = pa.array(texts, pa.string())
        start = rng.randint(0, len(texts) - 1)
        part = array.slice(start, rng.randint(1, len(texts) - start))
        column = pa.chunked_array([array, part])
        for strings in (array, part):
            assert jsonl._has_empty(strings) == (pc.min(pc.binary_length(strings)).as_py() == 0), (trial, texts)
        assert any(map(jsonl._has_empty, column.chunks)) == (pc.min(pc.binary_length(column)).as_py() == 0)


def test_a_bom_at_every_unit_size_yields_every_record_once(tmp_path):
    """A UTF-8 BOM belongs to the first line, whatever the cut: units ending inside it (1, 2, 3
    bytes) or just after it still give every record once, without the BOM."""
    texts = [f"doc {i} " + "y" * (i % 5) for i in range(30)]
    (tmp_path / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + _jsonl_bytes(texts))
    data = b"\xef\xbb\xbf" + "\n\n".join(texts).encode()
    (tmp_path / "p.txt").write_bytes(data)
    (tmp_path / "q.txt").write_bytes(b"\xef\xbb\xbf\n\n" + "\n\n".join(texts).encode())  # a blank first line
    for unit_bytes in [1, 2, 3, 4, 5, 7, 64, 10**6]:
        assert _read_all([str(tmp_path / "a.jsonl")], unit_bytes)[0] == texts, unit_bytes
        for name in ("p.txt", "q.txt"):
            assert _read_all([str(tmp_path / name)], unit_bytes, text_split="blank-line")[0] == texts, (name, unit_bytes)


def test_utf16_is_read_whole_by_the_first_unit_and_bad_code_units_are_invalid_utf8(tmp_path):
    texts = ["one", "two \u00e9", "three \U0001F642"]
    data = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts).encode("utf-16")
    (tmp_path / "a.jsonl").write_bytes(data)
    units = plan_units([str(tmp_path / "a.jsonl")], 8)
    assert len(units) > 10
    per_unit = [list(read_unit(u, SkipLog.empty())) for u in units]
    assert per_unit[0] == texts and not any(per_unit[1:])
    bad = '{"text": "fine"}\n{"text": "x'.encode("utf-16-le") + b"\x00\xd8" + '"}\n'.encode("utf-16-le") + b"!"
    (tmp_path / "b.jsonl").write_bytes(b"\xff\xfe" + bad)  # a lone surrogate, then half a code unit at the end
    got, skips = _read_all([str(tmp_path / "b.jsonl")])
    assert got == ["fine"] and dict(skips.counts) == {"invalid_utf8": 2}  # the record, and the cut-off last line
