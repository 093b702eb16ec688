"""packer's page reader on list columns (readers/parquet/page_levels.py) against pyarrow's path: chats
(list<struct<string, ...>>) and lists of strings, in the layouts pyarrow writes, read as the same
records, a huge value a Utf8Text in a HugeRecord; what it does not read falls back to pyarrow
before a page is read; a chat build gives the same shard bytes either way."""

from __future__ import annotations

import functools
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TOKENIZER, sample_texts

from packer.config import BuildConfig, Job
from packer.io.utf8 import HugeRecord, Utf8Text
from packer.preprocess.pipeline import build
from packer.preprocess.readers import FileError, SkipLog, columns, plan_units, read_records
from packer.preprocess.readers.parquet import page_levels, reader
from packer.preprocess.readers.parquet import pages as parquet_pages

HUGE = 2000  # HUGE_TEXT_BYTES in these tests


@pytest.fixture
def small_huge(monkeypatch):
    monkeypatch.setattr(columns, "HUGE_TEXT_BYTES", HUGE)
    monkeypatch.setattr(parquet_pages, "HUGE_TEXT_BYTES", HUGE)


@functools.cache
def _corpus() -> bytes:
    return " \u00e9\u3000\U0001F600 ".join(sample_texts()).encode()


def _text(rng: random.Random, n_bytes: int) -> str:
    """About n_bytes of sample prose (cut between characters), multi-byte characters included."""
    start = rng.randrange(len(_corpus()) - n_bytes)
    return _corpus()[start:start + n_bytes].decode("utf-8", "ignore")


def _plain(value):
    """A record as plain Python values, a Utf8Text as ("Utf8Text", its text): comparable with ==."""
    if isinstance(value, Utf8Text):
        return ("Utf8Text", str(value))
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _has_huge(value) -> bool:
    if isinstance(value, list):
        return any(map(_has_huge, value))
    if isinstance(value, dict):
        return any(map(_has_huge, value.values()))
    return isinstance(value, Utf8Text)


def _records(path, fields=("messages",)) -> list:
    return [r for u in plan_units([str(path)], 1 << 30) for r in read_records(u, SkipLog.empty(), fields)]


def _both(path, monkeypatch, fields=("messages",)):
    """(records read with packer's page reader, with pyarrow's alone, the row groups read by pages)."""
    groups, real = [], reader.huge_record_chunks
    with monkeypatch.context() as m:
        m.setattr(reader, "huge_record_chunks", lambda *a: groups.append(real(*a)) or groups[-1])
        new = _records(path, fields)
    with monkeypatch.context() as m:
        m.setattr(reader, "huge_record_chunks", lambda *a: {})
        old = _records(path, fields)
    return new, old, [i for g in groups for i in g]


def test_levels_and_records_by_hand(tmp_path, monkeypatch, small_huge):
    """page_levels' docstring example, and a huge content: its record a HugeRecord, its content a view."""
    huge = "x" * 5000
    rows = [[{"role": "user", "content": "Hi"}, None], None, [], [{"role": "system", "content": None}],
            [{"role": "assistant", "content": huge}]]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"messages": rows}), path, compression="none")
    pf = pq.ParquetFile(path)
    column = page_levels.list_column(pf.metadata, pf.schema_arrow.field("messages"))
    assert column == page_levels.ListColumn((0, 1), ("role", "content"), list_def=1, item_def=3)
    with pa.OSFile(str(path)) as f:
        chunk = parquet_pages.page_chunk(f, pf.metadata, 0, 0, huge=False)
        ((reps, defs, values),) = parquet_pages.chunk_pages(f, chunk, str(path))
    assert reps.tolist() == [0, 1, 0, 0, 0, 0] and defs.tolist() == [4, 2, 0, 1, 4, 4]
    assert [bytes(v) for v in values] == [b"user", b"system", b"assistant"]
    new, old, groups = _both(path, monkeypatch)
    assert groups == [0]
    assert [r for _, r in new[:4]] == [{"messages": [{"role": "user", "content": "Hi"}, None]}, {},
                                        {"messages": []}, {"messages": [{"role": "system"}]}]
    assert [type(r) for _, r in new] == [dict] * 4 + [HugeRecord]
    content = new[4][1]["messages"][0]["content"]
    assert isinstance(content, Utf8Text) and str(content) == huge and len(content.data.obj) > 5000  # the page's buffer
    assert [(w, _plain(r)) for w, r in new] == [(w, _plain(r)) for w, r in old]


MESSAGE_FIELDS = ("role", "content", "name")


def _schema(nullable: str, item_name: str = "element") -> pa.Schema:
    """messages: list<struct<role, content, name>> (`nullable`: which levels may be null, of list,
    element, role), tags: list<string>, source: string."""
    message = pa.struct([pa.field("role", pa.string(), "role" in nullable), ("content", pa.large_string()),
                         ("name", pa.string())])
    return pa.schema([pa.field("messages", pa.list_(pa.field(item_name, message, "element" in nullable)),
                               "list" in nullable),
                      ("tags", pa.list_(pa.string())), ("source", pa.string()), ("n", pa.int64())])


def _rows(seed: int, nullable: str, n: int = 40) -> list:
    """Chats of 0-5 messages, contents small and huge (over HUGE: about one chat in four), some null
    lists, empty lists, null messages, null roles, contents and names, where `nullable` allows."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        messages = []
        for _ in range(rng.choice([0, 1, 2, 2, 3, 5])):
            if "element" in nullable and rng.random() < 0.1:
                messages.append(None)
                continue
            size = rng.choice([0, 5, 40, 300, HUGE - 10, HUGE + 1, 6000]) if rng.random() < 0.5 else 20
            messages.append({"role": None if "role" in nullable and rng.random() < 0.1 else rng.choice(["user", "assistant"]),
                             "content": None if rng.random() < 0.1 else _text(rng, size),
                             "name": rng.choice([None, None, "tool", _text(rng, 2500)])})
        tags = rng.choice([None, [], ["a", None, _text(rng, 30)], [_text(rng, 2200)]])
        rows.append({"messages": None if "list" in nullable and i % 7 == 3 else messages, "tags": tags,
                     "source": rng.choice([None, "web", _text(rng, 3000)]), "n": i})
    return rows


LAYOUTS = [("list,element,role", "element"), ("", "element"), ("list", "item"), ("element,role", "element")]


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "gzip"])
def test_lists_read_as_pyarrow_reads_them(tmp_path, monkeypatch, small_huge, compression):
    """Dictionary or not, data pages v1 or v2, each level nullable or not, legacy "item" element
    names, small pages (several a chunk, a dictionary that falls back to PLAIN, the leaves' pages ending at different rows), row groups
    with and without a huge value: the records pyarrow's path gives, a record holding a Utf8Text a
    HugeRecord (pyarrow's marks its whole batch), a list's and a flat string column beside the chat."""
    cases = pages = uneven = 0
    fields = ("messages", "tags", "source")
    for dictionary in (True, False):
        for version in ("1.0", "2.0"):
            for nullable, item_name in LAYOUTS:
                schema = _schema(nullable, item_name)
                path = tmp_path / f"{dictionary}-{version}-{nullable}-{item_name}.parquet"
                pq.write_table(pa.Table.from_pylist(_rows(cases, nullable), schema), path, compression=compression,
                               use_dictionary=dictionary, data_page_version=version, data_page_size=800,
                               write_batch_size=3, row_group_size=10, dictionary_pagesize_limit=3000)
                new, old, groups = _both(path, monkeypatch, fields)
                assert [(w, _plain(r)) for w, r in new] == [(w, _plain(r)) for w, r in old], path.name
                assert [type(r) is HugeRecord for _, r in new] == [_has_huge(r) for _, r in new]
                assert all(type(r) is HugeRecord for _, r in old if _has_huge(r))
                assert sum(map(_has_huge, (r for _, r in new))) > 5 and len(groups) >= 2
                meta = pq.ParquetFile(path).metadata
                with pa.OSFile(str(path)) as f:  # role, content, name
                    n_pages = [len(parquet_pages.page_chunk(f, meta, groups[0], j, huge=False).pages) for j in range(3)]
                pages += sum(n_pages)
                uneven += len(set(n_pages)) > 1
                cases += 1
    assert cases == 16 and pages > 16 * 3 * 3 and uneven > 4


def test_rows_split_across_pages(tmp_path, monkeypatch, small_huge):
    """A row may begin on one page and end on the next (other writers' v1 pages; pyarrow keeps rows
    whole): every page cut into pieces of 1-3 values reads the same."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(1, "list,element,role"), _schema("list,element,role")), path)
    whole, _, groups = _both(path, monkeypatch, ("messages", "tags"))
    assert groups == [0]
    rng, real = random.Random(0), parquet_pages.chunk_pages
    split = []

    def pieces(*args):
        for reps, defs, values in real(*args):
            values, at = iter(values), 0
            while at < len(reps):
                n = rng.randint(1, 3)
                present = int(np.count_nonzero(defs[at:at + n] == args[1].max_def))
                split.append(reps[at] == 1)
                yield reps[at:at + n], defs[at:at + n], [next(values) for _ in range(present)]
                at += n

    monkeypatch.setattr(parquet_pages, "chunk_pages", pieces)
    assert [(w, _plain(r)) for w, r in _records(path, ("messages", "tags"))] == [(w, _plain(r)) for w, r in whole]
    assert sum(split) > 20


def test_levels_that_do_not_fit_raise(tmp_path, monkeypatch, small_huge):
    """Leaves whose levels disagree or whose values do not line up, or levels that do not add up to
    the row group's rows: a FileError naming the file (a corrupt file; pyarrow's path is not tried)."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"messages": [[{"role": "user", "content": "x" * 5000}], [{"role": "a", "content": "b"}]]}),
                   path)
    real = page_levels._entries
    changes = {"do not agree": lambda leaf, i, e: (e[0], 2, None) if (leaf, i) == (0, 1) else e,  # a null message
               "do not add up": lambda leaf, i, e: (1, *e[1:]) if i == 1 else e,  # one row, not two
               "different numbers": lambda leaf, i, e: None if (leaf, i) == (0, 1) else e}
    for message, change in changes.items():
        calls = []

        def entries(f, chunk, p, change=change, calls=calls):
            leaf = len(calls)
            calls.append(chunk)
            for i, e in enumerate(real(f, chunk, p)):
                if (e := change(leaf, i, e)) is not None:
                    yield e

        with monkeypatch.context() as m:
            m.setattr(page_levels, "_entries", entries)
            with pytest.raises(FileError, match=f"a.parquet.*Parquet list column.*{message}"):
                _records(path)
        assert len(calls) == 2


def _chats(seed: int) -> list:
    rng = random.Random(seed)
    rows = []
    for i in range(12):
        content = _text(rng, rng.choice([30, 300, 6000, 20_000]))
        rows.append([{"role": "system", "content": "Be brief."}, {"role": "user", "content": _text(rng, 50)},
                     {"role": "assistant", "content": content}][rng.choice([0, 1]):])
    rows[3] = None
    rows[5] = []
    return rows


def test_a_chat_build_gives_the_bytes_of_pyarrows_path(tmp_path, monkeypatch, small_huge):
    for dictionary in (True, False):
        path = tmp_path / f"in-{dictionary}" / "a.parquet"
        path.parent.mkdir()
        pq.write_table(pa.table({"messages": _chats(int(dictionary)), "id": list(range(12))}), path,
                       use_dictionary=dictionary, row_group_size=4)
        totals, groups, real = {}, [], reader.huge_record_chunks
        for name in ("pages", "pyarrow"):
            with monkeypatch.context() as m:
                m.setattr(reader, "huge_record_chunks",
                          (lambda *a: {}) if name == "pyarrow" else (lambda *a: groups.append(real(*a)) or groups[-1]))
                job = Job(inputs=(str(path),), tokenizer=TOKENIZER, output=str(tmp_path / f"{name}-{dictionary}"),
                          workers=1, config=BuildConfig(context_length=512, input_kind="chat", max_doc_bytes=1 << 20))
                totals[name] = build(job)["totals"]
        assert totals["pages"] == totals["pyarrow"] and totals["pages"]["docs_accepted"] == 10
        assert sum(len(g) for g in groups) >= 2
        shards = [{p.name: p.read_bytes() for p in sorted((tmp_path / f"{name}-{dictionary}").glob("shard-*"))}
                  for name in ("pages", "pyarrow")]
        assert shards[0] == shards[1] and shards[0]


def test_columns_packer_does_not_read_go_to_pyarrow(tmp_path, monkeypatch, small_huge):
    """A map, a struct with a non-string field, a list of lists, of binary, a struct that is no
    list, DELTA_BYTE_ARRAY contents and LZ4: each with a huge value, each left
    to pyarrow before a page of it is read."""
    big = "y" * 5000
    chat = [{"role": "user", "content": big}]
    cases = {
        "map": (pa.table({"messages": pa.array([[("content", big)]], pa.map_(pa.string(), pa.string()))}), {}),
        "int-field": (pa.table({"messages": [[{"role": "user", "content": big, "weight": 1}]]}), {}),
        "list-of-lists": (pa.table({"messages": [[[big, "a"]]]}), {}),
        "binary": (pa.table({"messages": pa.array([[big.encode()]], pa.list_(pa.binary()))}), {}),
        "struct": (pa.table({"messages": [{"role": "user", "content": big}]}), {}),
        "delta": (pa.table({"messages": [chat]}), dict(use_dictionary=False,
                                                       column_encoding={"messages.list.element.content": "DELTA_BYTE_ARRAY"})),
        "lz4": (pa.table({"messages": [chat]}), dict(compression="lz4")),
    }
    for name, (table, kw) in cases.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path, **kw)
        with monkeypatch.context() as m:
            m.setattr(page_levels, "chunk_records", lambda *a: pytest.fail(f"{name} read by pages"))
            m.setattr(parquet_pages, "chunk_pages", lambda *a: pytest.fail(f"{name} read by pages"))
            new, old, groups = _both(path, monkeypatch)
        assert groups == [] and [(w, _plain(r)) for w, r in new] == [(w, _plain(r)) for w, r in old], name
        assert _has_huge(new[0][1]) or name in ("map", "int-field", "binary"), name
