"""Parquet and Arrow text columns as the world ships them: every Arrow text layout (dictionary,
large, view, binary; a dictionary per chunk) reads and builds exactly as a plain string column,
with the same skips; a file of many row groups is a few units, read in file order with its rows
numbered across the file, the unit layout never changes the bytes of a build, and a build
stopped between units resumes to them."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from conftest import TOKENIZER, sample_texts

from packer.config import BuildConfig, Job
from packer.io import failpoints
from packer.preprocess.pipeline import build
from packer.preprocess.readers import FileError, SkipLog, plan_units, read_unit
from packer.preprocess.readers.columns import column_texts
from packer.preprocess.readers.parquet.reader import group_runs

ROOT = Path(__file__).resolve().parents[2]

MAX_DOC_BYTES = 300
BIG = "x " * 200  # 400 bytes: too_large under MAX_DOC_BYTES


def _values():
    """Real texts with every skip among them, repeats included (what a dictionary compresses)."""
    texts = [t[:120] for t in sample_texts()[:12] if t.strip()]
    return texts[:4] + [None, "", BIG] + texts[4:] + texts[:3] + [None, "café ünïcode 日本語"] + texts[:2]


def _plain_skips(values):
    """The skips a plain string column of `values` gives (the reference)."""
    return {"null_text": sum(v is None for v in values), "empty_text": sum(v == "" for v in values), "too_large": 1}


def _where(examples) -> list[str]:
    """The place of each skip example ('a.parquet row 6'), without any hint after it."""
    return [e["where"].split(": ", 1)[0] for e in examples]


def _encoded(values):
    return [None if v is None else v.encode("utf-8") for v in values]


# name -> (values -> Arrow array or chunked array of that layout)
LAYOUTS = {
    "string": lambda v: pa.array(v, pa.string()),
    "large_string": lambda v: pa.array(v, pa.large_string()),
    "string_view": lambda v: pa.array(v, pa.string_view()),
    "binary": lambda v: pa.array(_encoded(v), pa.binary()),
    "large_binary": lambda v: pa.array(_encoded(v), pa.large_binary()),
    "binary_view": lambda v: pa.array(_encoded(v), pa.binary_view()),
    "dictionary": lambda v: pa.array(v).dictionary_encode(),
    "dictionary_int8": lambda v: pa.array(v).dictionary_encode().cast(pa.dictionary(pa.int8(), pa.string())),
    "dictionary_large_string": lambda v: pa.array(v, pa.large_string()).dictionary_encode(),
    "dictionary_binary": lambda v: pa.array(_encoded(v), pa.binary()).dictionary_encode(),
    # a dictionary of its own in each chunk: one per row group in Parquet, a replacement per batch in an IPC stream
    "chunked_dictionary": lambda v: pa.chunked_array([pa.array(v[i:i + 5]).dictionary_encode() for i in range(0, len(v), 5)]),
}


def _write(path: Path, container: str, column):
    table = pa.table({"id": range(len(column)), "text": column})
    if container == "parquet":
        pq.write_table(table, path, row_group_size=5)
    elif container == "arrow-file":  # one dictionary for the whole file (the IPC file format allows no replacement)
        table = table.unify_dictionaries()
        with ipc.new_file(str(path), table.schema) as w:
            w.write_table(table, max_chunksize=4)
    else:
        with ipc.new_stream(str(path), table.schema) as w:
            w.write_table(table, max_chunksize=5)
    return str(path)


CONTAINERS = {"parquet": "a.parquet", "arrow-file": "a.arrow", "arrow-stream": "a.arrow"}


def _read(path, unit_bytes=64 << 20):
    skips = SkipLog.empty()
    texts = [t for u in plan_units([path], unit_bytes) for t in read_unit(u, skips, max_doc_bytes=MAX_DOC_BYTES)]
    return texts, skips


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_text_layout_reads_as_a_plain_string_column(tmp_path, layout, container):
    values = _values()
    path = _write(tmp_path / CONTAINERS[container], container, LAYOUTS[layout](values))
    texts, skips = _read(path)
    assert texts == [v for v in values if v and len(v.encode()) <= MAX_DOC_BYTES]
    assert dict(skips.counts) == _plain_skips(values)
    bad_rows = [i for i, v in enumerate(values) if not v or v == BIG]
    assert _where(skips.examples) == [f"{path} row {r}" for r in bad_rows][:5]


@pytest.mark.parametrize("layout", ["binary", "large_binary", "binary_view", "dictionary_binary"])
def test_invalid_utf8_in_binary_layouts_is_skipped_with_its_row(tmp_path, layout):
    values = _encoded(["ok one", None, "ok two"]) + [b"caf\xe9", b"", "ok three".encode()]
    column = LAYOUTS[layout]([None] * len(values)).type  # the layout's type, filled with raw bytes below
    array = pa.array(values, column.value_type if pa.types.is_dictionary(column) else column)
    if pa.types.is_dictionary(column):
        array = array.dictionary_encode()
    path = _write(tmp_path / "a.parquet", "parquet", array)
    texts, skips = _read(path)
    assert texts == ["ok one", "ok two", "ok three"]
    assert dict(skips.counts) == {"null_text": 1, "invalid_utf8": 1, "empty_text": 1}
    assert _where(skips.examples) == [f"{path} row {r}" for r in (1, 3, 4)]


def test_a_dictionary_with_null_values_and_null_indices():
    array = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 0, 2], pa.int8()), pa.array(["a", None, ""]))
    skips = SkipLog.empty()
    assert list(column_texts(array, 10, "f", skips, 100)) == ["a", "a"]
    assert list(zip(_where(skips.examples), (e["reason"] for e in skips.examples))) == [
        ("f row 11", "null_text"), ("f row 12", "null_text"), ("f row 14", "empty_text")]


def test_a_pandas_categorical_column_builds(tmp_path):
    pd = pytest.importorskip("pandas")
    texts = [t[:120] for t in sample_texts()[:6] if t.strip()]
    pd.DataFrame({"text": pd.Categorical(texts * 3)}).to_parquet(tmp_path / "cat.parquet")
    assert pa.types.is_dictionary(pq.read_schema(tmp_path / "cat.parquet").field("text").type)
    assert _read(str(tmp_path / "cat.parquet"))[0] == texts * 3


def test_non_text_columns_are_refused_naming_the_type(tmp_path):
    cases = {"ints.parquet": (pa.array([1, 2]), "int64"),  # (Parquet reads a dictionary of ints back as ints)
             "dict_ints.arrow": (pa.array([1, 2, 1]).dictionary_encode(), "dictionary<values=int64, indices=int32, ordered=0>")}
    for name, (column, kind) in cases.items():
        path = _write(tmp_path / name, "parquet" if name.endswith(".parquet") else "arrow-stream", column)
        with pytest.raises(FileError, match=rf"column 'text' is {kind}, not text \(string or binary, plain, large"):
            _read(path)


def _build(inputs, out: Path, **config) -> dict:
    job = Job(inputs=inputs, tokenizer=TOKENIZER, output=str(out), workers=1,
              config=BuildConfig(**{"context_length": 256, "max_doc_bytes": MAX_DOC_BYTES, **config}))
    return build(job)


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}


@pytest.mark.parametrize("container", CONTAINERS)
def test_every_text_layout_builds_the_bytes_of_a_plain_string_column(tmp_path, container):
    values = _values() * 3
    reference = _build([_write(tmp_path / CONTAINERS[container], container, pa.array(values))], tmp_path / "ref")
    assert reference["totals"]["docs_skipped"] == {k: 3 * n for k, n in _plain_skips(_values()).items()}
    for layout, make in LAYOUTS.items():
        d = tmp_path / layout
        d.mkdir()
        manifest = _build([_write(d / CONTAINERS[container], container, make(values))], d / "out")
        assert _shards(d / "out") == _shards(tmp_path / "ref"), layout
        for key in ("docs_read", "docs_accepted", "docs_skipped", "tokens_in", "sequences"):
            assert manifest["totals"][key] == reference["totals"][key], (layout, key)


def test_group_runs_by_hand():
    assert group_runs([3, 3, 5, 1], 6) == [(0, 2, 6), (2, 4, 6)]
    assert group_runs([], 6) == [(0, 0, 0)]  # a file without row groups: one empty unit
    assert group_runs([10], 6) == [(0, 1, 10)]  # bigger than a unit: a unit of its own
    assert group_runs([7, 1, 1, 9, 0], 6) == [(0, 1, 7), (1, 3, 2), (3, 4, 9), (4, 5, 0)]
    assert group_runs([1] * 5, 1) == [(i, i + 1, 1) for i in range(5)]


def test_group_runs_cover_in_order_and_are_greedy():
    rng = random.Random(0)
    n_split = 0
    for _ in range(300):
        sizes = [rng.choice([0, 1, 5, 50, 300]) for _ in range(rng.randint(0, 40))]
        unit_bytes = rng.choice([1, 10, 100, 1000])
        runs = group_runs(sizes, unit_bytes)
        assert [r[0] for r in runs] == [0] + [r[1] for r in runs[:-1]] and runs[-1][1] == len(sizes)
        for start, end, total in runs:
            assert total == sum(sizes[start:end])
            assert end - start == 1 or total <= unit_bytes or not sizes  # only a lone group passes the size
        for (_, end, total), _next in zip(runs, runs[1:]):
            assert total + sizes[end] > unit_bytes  # the next group would not have fitted
        n_split += len(runs) > 1 and len(runs) < len(sizes)
    assert n_split > 50  # runs of several groups, several runs a file: both exercised


def _many_groups(path: Path, n_rows=3000, group_rows=2):
    """n_rows texts in row groups of group_rows, a null every 700 rows (to see the row numbers)."""
    values = [None if i % 700 == 699 else f"row {i} of many" for i in range(n_rows)]
    pq.write_table(pa.table({"text": values}), path, row_group_size=group_rows)
    return values


def test_many_row_groups_are_few_units_read_in_file_order(tmp_path):
    path = tmp_path / "many.parquet"
    values = _many_groups(path)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1500
    meta = pq.ParquetFile(path).metadata
    total = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    for unit_bytes, n_units in ((64 << 20, [1]), (total // 15, range(15, 18)), (1, [1500])):
        units = plan_units([str(path)], unit_bytes)
        assert len(units) in n_units, (unit_bytes, len(units))
        assert [(u.index, u.start) for u in units] == [(i, units[i - 1].end if i else 0) for i in range(len(units))]
        assert units[-1].end == 1500 and sum(u.size for u in units) == total
        assert all(u.size <= unit_bytes for u in units) or unit_bytes == 1
        texts, skips = _read(str(path), unit_bytes)
        assert texts == [v for v in values if v is not None]
        assert _where(skips.examples) == [f"{path} row {r}" for r in (699, 1399, 2099, 2799)]


def test_the_unit_layout_does_not_change_the_bytes_of_a_build(tmp_path):
    path = tmp_path / "many.parquet"
    _many_groups(path, n_rows=2000, group_rows=10)
    others = tmp_path / "b.parquet"
    pq.write_table(pa.table({"text": [t[:200] for t in sample_texts()[:50] if t.strip()]}), others, row_group_size=7)
    inputs = [str(path), str(others)]
    one = _build(inputs, tmp_path / "one-unit-per-group", unit_bytes=1)  # the layout before: a unit per row group
    few = _build(inputs, tmp_path / "few-units")
    assert (len(plan_units(inputs, 1)), len(plan_units(inputs, BuildConfig().unit_bytes))) == (208, 2)
    assert _shards(tmp_path / "one-unit-per-group") == _shards(tmp_path / "few-units")
    assert json.dumps(one["totals"]) == json.dumps(few["totals"])
    assert one["totals"]["docs_skipped"] == {"null_text": 2}


def test_skip_examples_are_the_first_five_of_each_unit(tmp_path):
    """The one thing a unit layout changes: a unit keeps its first 5 skip examples (the manifest the
    first 20 of all units), so a file with bad rows in more than 5 row groups lists fewer examples
    as one unit than as a unit per row group; the counts are the same."""
    path = tmp_path / "nulls.parquet"
    _many_groups(path, n_rows=7000, group_rows=700)  # a null at the end of each of the 10 row groups
    one = _build([str(path)], tmp_path / "one-unit-per-group", unit_bytes=1)
    few = _build([str(path)], tmp_path / "few-units")
    rows = [int(w.rsplit(" ", 1)[1]) for w in _where(one["totals"]["skip_examples"])]
    assert rows == [700 * g + 699 for g in range(10)]
    assert few["totals"]["skip_examples"] == one["totals"]["skip_examples"][:5]
    assert few["totals"]["docs_skipped"] == one["totals"]["docs_skipped"] == {"null_text": 10}
    assert _shards(tmp_path / "one-unit-per-group") == _shards(tmp_path / "few-units")


def test_a_build_stopped_between_row_group_units_resumes_to_the_same_bytes(tmp_path):
    path = tmp_path / "many.parquet"
    _many_groups(path, n_rows=2000, group_rows=10)
    unit_bytes = pq.ParquetFile(path).metadata.row_group(0).total_byte_size * 40  # about 5 units of ~40 row groups
    assert 4 <= len(plan_units([str(path)], unit_bytes)) <= 7
    out = tmp_path / "out"
    job = tmp_path / "job.toml"
    job.write_text(f'inputs = ["{path}"]\ntokenizer = "{TOKENIZER}"\noutput = "{out}"\nworkers = 1\n'
                   f"[config]\ncontext_length = 256\nmax_doc_bytes = {MAX_DOC_BYTES}\nunit_bytes = {unit_bytes}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "packer", "run", str(job)]
    stopped = subprocess.run(cmd, env={**env, failpoints.ENV: "unit:3=exit"}, capture_output=True, text=True)
    assert stopped.returncode != 0 and not (out / "manifest.json").exists()
    assert sorted(p.name for p in (out / "_work" / "units").glob("*.json")) == [f"unit-{i:06d}.json" for i in range(3)]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    _build([str(path)], tmp_path / "whole", unit_bytes=unit_bytes)
    assert _shards(out) == _shards(tmp_path / "whole")


def test_blank_text_in_a_column_is_empty_text_as_in_every_reader(tmp_path):
    """Whitespace-only values (string and binary columns) are skipped as empty_text, like JSONL and .txt."""
    from packer.preprocess.readers import SkipLog
    from packer.preprocess.readers.columns import column_texts

    for column in (pa.chunked_array([["a", "  ", "\u3000\n", "b"]]).chunks[0], pa.array([b"a", b" \t", b"b", b""])):
        skips = SkipLog.empty()
        assert list(column_texts(column, 0, "f.parquet", skips, 100)) == ["a", "b"]
        assert skips.counts["empty_text"] == 2
