"""Huge documents: a text over HUGE_TEXT_BYTES travels as its UTF-8 bytes (Utf8Text), is encoded a
window at a time and streamed to the unit file, and gives exactly the tokens of encoding it whole;
a real build of one 20 MB line or record grows RSS by at most about its size (plus a fixed allowance)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import TOKENIZER, sample_texts
from tokenizers import Tokenizer

from packer.config import BuildConfig
from packer.encode import records
from packer.encode.text import _pieces, _utf8_pieces, encode_parts, encode_texts
from packer.encode.tokenizer import tokenizer_info
from packer.io import lines
from packer.io.lines import line_blocks
from packer.io.utf8 import Utf8Text, valid_utf8
from packer.preprocess.readers import SkipLog, huge_json, jsonl, plan_units, read_unit
from packer.preprocess.readers import text as text_reader
from packer.preprocess.tokenize import tokenize_unit, unit_paths

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(TOKENIZER)


@pytest.fixture
def small_huge(monkeypatch):
    """Make 'huge' 4 KB (and reads 4 KB, so that such a line comes as a block of its own), so the
    huge-document path runs on texts the tokenizer encodes in a blink."""
    for module in (jsonl, text_reader):
        monkeypatch.setattr(module, "HUGE_TEXT_BYTES", 4096)
    monkeypatch.setattr(lines, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(huge_json, "LONG_STRING_BYTES", 1024)
    monkeypatch.setattr(huge_json, "WINDOW_BYTES", 1000)
    return 4096


def _long_text(seed: int, n_docs: int = 60) -> str:
    rng = random.Random(seed)
    texts = sample_texts()
    k = rng.randrange(len(texts) - n_docs)
    glue = rng.choice([" ", "\n", " \u00e9 ", " \U0001F600 ", "\u3000"])  # astral, CJK space, Latin-1
    return glue.join(texts[k:k + n_docs]) + ' "quoted" \\ back\tslash \u2028 end'


def test_utf8_pieces_equal_the_str_pieces():
    rng = random.Random(0)
    cases = 0
    for seed in range(40):
        t = _long_text(seed, rng.randrange(1, 400))
        if seed % 5 == 0:
            t = t.replace(" ", "\U0001F600")  # no cut point: cut where it stands
        for piece_chars in (7, 300, 4000, 70_000) if len(t) < 20_000 else (4000, 70_000):
            assert list(_utf8_pieces(Utf8Text(t.encode()), piece_chars)) == list(_pieces(t, piece_chars))
            cases += len(t) > piece_chars + 65536  # a window narrower than the text
    assert cases > 5
    assert len(Utf8Text("caf\u00e9 \U0001F600".encode())) == 6 and str(Utf8Text(b"ab")) == "ab"


def test_encode_parts_stream_a_long_document_and_concatenate_to_the_whole(tok):
    texts = ["a b", _long_text(1), "c", _long_text(2)]
    for bos, eos in ((None, 0), (1, 0), (None, None)):
        parts = list(encode_parts(tok, texts, dtype=np.uint32, eos_id=eos, bos_id=bos, piece_chars=2000))
        assert sum(not len(n) for _, n in parts) > 10  # pieces came alone, without a length
        ids = np.concatenate([i for i, _ in parts])
        ref = [([bos] if bos is not None else []) + e.ids + ([eos] if eos is not None else [])
               for e in tok.encode_batch(texts, add_special_tokens=False)]
        assert ids.tolist() == [t for r in ref for t in r]
        assert np.concatenate([n for _, n in parts]).tolist() == [len(r) for r in ref]
        as_bytes = [Utf8Text(t.encode()) if len(t) > 2000 else t for t in texts]
        flat, lengths = encode_texts(tok, as_bytes, dtype=np.uint32, eos_id=eos, bos_id=bos, piece_chars=2000)
        assert flat.tolist() == ids.tolist() and lengths.tolist() == [len(r) for r in ref]


def _unit_tokens(path, tmp_path, **config):
    config = BuildConfig(**config)
    info = tokenizer_info(TOKENIZER, config)
    (unit,) = plan_units([str(path)], 1 << 30)
    work = tmp_path / "w"
    work.mkdir(exist_ok=True)
    counters = tokenize_unit(unit, info, config, work)
    return np.load(unit_paths(work, 0)["tokens.npy"]).tolist(), np.load(unit_paths(work, 0)["lengths.npy"]), counters


def test_a_huge_jsonl_line_gives_the_tokens_of_its_text(tmp_path, tok, small_huge):
    texts = ["before", _long_text(3), "x", _long_text(4), "after"]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}, ensure_ascii=i % 2 == 0) + "\n" for i, t in enumerate(texts)))
    kinds = [type(t).__name__ for u in plan_units([str(path)], 1 << 30) for t in read_unit(u, SkipLog.empty())]
    assert kinds == ["str", "Utf8Text", "str", "Utf8Text", "str"]
    ids, lengths, counters = _unit_tokens(path, tmp_path)
    eos = tokenizer_info(TOKENIZER, BuildConfig()).eos_id
    ref = [e.ids + [eos] for e in tok.encode_batch(texts, add_special_tokens=False)]
    assert ids == [t for r in ref for t in r] and lengths.tolist() == [len(r) for r in ref]
    assert counters["docs_accepted"] == 5 and counters["skipped"] == {}


def test_a_huge_text_file_gives_the_tokens_of_its_text(tmp_path, tok, small_huge):
    t = _long_text(5)
    path = tmp_path / "a.txt"
    path.write_text(t, encoding="utf-8")
    ids, _, _ = _unit_tokens(path, tmp_path)
    eos = tokenizer_info(TOKENIZER, BuildConfig()).eos_id
    assert ids == tok.encode(t, add_special_tokens=False).ids + [eos]


def _unit_files(path, tmp_path, name, **config) -> tuple[dict, dict]:
    config = BuildConfig(**config)
    info = tokenizer_info(TOKENIZER, config)
    (unit,) = plan_units([str(path)], 1 << 30)
    work = tmp_path / name
    work.mkdir()
    counters = tokenize_unit(unit, info, config, work)
    files = {p.name.split(".", 1)[1]: p.read_bytes() for p in sorted(work.glob("unit-*")) if not p.name.endswith(".json")}
    return files, {k: counters[k] for k in ("docs_accepted", "skipped", "skip_examples", "tokens", "trained_tokens")}


@pytest.mark.parametrize("config", [dict(), dict(long_prompts="drop", context_length=300), dict(eos=False)],
                         ids=["split", "drop", "no-eos"])
def test_huge_prompts_and_completions_stream_to_the_same_unit_files(tmp_path, monkeypatch, small_huge, config):
    """Records with long prompts and completions (Utf8Text from huge_json, encoded a piece at a time)
    give the bytes the old path gives (whole strs, one batch), skips and their order included."""
    rng = random.Random(7)
    rows = []
    for i in range(40):
        long, short = _long_text(i, rng.randrange(2, 30)), rng.choice(["Q: ", "", " ", "2+2=", "\u00e9"])
        rows.append(rng.choice([
            {"prompt": short, "completion": long}, {"prompt": long, "completion": short or "x"},
            {"prompt": long, "completion": _long_text(i + 100, 5)}, {"prompt": short, "completion": "done"},
            {"prompt": long, "completion": "   \u3000 " * 900}, {"prompt": 5, "completion": long},
            {"completion": long}, {"prompt": short, "completion": long, "extra": [1, {"a": long[:50]}]},
        ]))
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 3 == 0) + "\n" for i, r in enumerate(rows)), encoding="utf-8")
    monkeypatch.setattr(records, "PIECE_CHARS", 3000)  # long from 3000 characters, encoded in pieces of 3000
    kinds = [type(r.get("completion")).__name__ for _, r in jsonl.records(plan_units([str(path)], 1 << 30)[0], path,
                                                                       SkipLog.empty(), fields=(), max_doc_bytes=1 << 30, fix="")]
    assert kinds.count("Utf8Text") > 10
    new = _unit_files(path, tmp_path, "new", input_kind="prompt-completion", **config)
    monkeypatch.setattr(huge_json, "huge_record", lambda *a, **k: None)  # the old path: strs
    monkeypatch.setattr(records, "PIECE_CHARS", 1 << 40)  # and every example in its batch
    old = _unit_files(path, tmp_path, "old", input_kind="prompt-completion", **config)
    assert new == old
    assert new[1]["docs_accepted"] >= 10 and len(new[1]["skipped"]) >= 2
    if config.get("long_prompts") == "drop":
        assert new[1]["skipped"]["prompt_too_long"] > 3


@pytest.mark.parametrize("config", [dict(), dict(long_prompts="drop", context_length=300)], ids=["split", "drop"])
def test_huge_chat_messages_stream_to_the_same_unit_files(tmp_path, monkeypatch, small_huge, config):
    """Chats whose message contents are long (Utf8Text from huge_json, nested in the messages; encoded a
    piece at a time by packer/encode/chat_long.py) give the bytes the old path gives (whole strs, one batch)."""
    from packer.encode import chat_long

    rng = random.Random(9)
    rows = []
    for i in range(30):
        long, short = _long_text(i, rng.randrange(2, 30)), rng.choice(["Q: ", "hi", "2+2=", "\u00e9"])
        rows.append({"messages": rng.choice([
            [{"role": "user", "content": short}, {"role": "assistant", "content": long}],
            [{"role": "user", "content": long}, {"role": "assistant", "content": short}],
            [{"role": "system", "content": short}, {"role": "user", "content": long},
             {"role": "assistant", "content": _long_text(i + 50, 4)}, {"role": "user", "content": "more"},
             {"role": "assistant", "content": long}],
            [{"role": "user", "content": long}],
            [{"role": "user", "content": short}, {"role": "assistant", "content": "<|im_end|>" + long}],
        ])})
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 3 == 0) + "\n" for i, r in enumerate(rows)), encoding="utf-8")
    monkeypatch.setattr(chat_long, "PIECE_CHARS", 3000)
    read = [r for _, r in jsonl.records(plan_units([str(path)], 1 << 30)[0], path, SkipLog.empty(), fields=(),
                                        max_doc_bytes=1 << 30, fix="")]
    assert sum(isinstance(m["content"], Utf8Text) for r in read for m in r["messages"]) > 10
    new = _unit_files(path, tmp_path, "new", input_kind="chat", **config)
    monkeypatch.setattr(huge_json, "huge_record", lambda *a, **k: None)  # the old path: strs
    monkeypatch.setattr(chat_long, "PIECE_CHARS", 1 << 40)  # and every chat in its batch
    old = _unit_files(path, tmp_path, "old", input_kind="chat", **config)
    assert new == old  # the unit files' bytes, the counts, the first skip examples in the same order
    assert new[1]["docs_accepted"] >= 10 and len(new[1]["skipped"]) >= 1


def test_bad_huge_lines_are_skipped_as_small_ones_are(tmp_path, small_huge):
    big = "word " * 2000
    lines = [json.dumps({"text": " \u3000 " * 3000}),  # whitespace only
             json.dumps({"text": big})[:-2] + '\\ud800"}',  # an escaped lone surrogate
             json.dumps({"text": big}).replace("word", "w\xe9rd").encode("latin-1").decode("latin-1"),  # raw \xe9
             json.dumps({"other": big}), json.dumps({"text": big})[:-1], json.dumps({"text": big})]
    path = tmp_path / "a.jsonl"
    path.write_bytes("\n".join(lines).encode("latin-1") + b"\n")
    skips = SkipLog.empty()
    got = [str(t) for u in plan_units([str(path)], 1 << 30) for t in read_unit(u, skips)]
    assert got == [big]
    assert dict(skips.counts) == {"empty_text": 1, "invalid_utf8": 2, "missing_field": 1, "malformed_json": 1}
    assert not valid_utf8(b"a\xed\xa0\x80b") and valid_utf8("caf\u00e9".encode())


def test_a_long_line_comes_alone_and_is_not_kept(tmp_path):
    path = tmp_path / "a.jsonl"
    long_line = b'{"text": "' + b"y" * 3_000_000 + b'"}\n'
    path.write_bytes(b'{"text": "a"}\n' + long_line + b'{"text": "b"}\n' * 3)
    with open(path, "rb") as f:
        blocks = line_blocks(f, 0, 1 << 30)
        assert next(blocks) == (0, b'{"text": "a"}\n')
        pos, block = next(blocks)
        assert (pos, bytes(block)) == (14, long_line)
        assert sys.getrefcount(block) == 2  # this name and the call's argument: the generator kept none
        assert [bytes(b) for _, b in blocks] == [b'{"text": "b"}\n' * 3]


RSS = textwrap.dedent("""
    import sys
    from packer.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as e:
        if e.code:
            raise
    # VmHWM: this process's own peak (ru_maxrss would start at pytest's RSS, kept across fork and exec)
    print("maxrss_kb", next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")))
""")


def _peak_rss_mb(path, out, max_doc_bytes: int, extra=()) -> float:
    args = ["build", str(path), "--tokenizer", TOKENIZER, "--output", str(out), "--workers", "1",
            "--max-doc-bytes", str(max_doc_bytes), "--quiet", *extra]
    proc = subprocess.run([sys.executable, "-c", RSS, *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "maxrss_kb" in proc.stdout, proc.stdout + proc.stderr
    return int(proc.stdout.rsplit("maxrss_kb", 1)[1]) / 1024


@pytest.mark.slow
@pytest.mark.parametrize("case", ["jsonl", "records", "chat", "parquet", "parquet-plain", "arrow", "chat-arrow",
                                  "chat-parquet"])
def test_one_20_mb_document_grows_rss_by_at_most_its_size(tmp_path, case):
    """Measured 2026-12-04 (bench_huge_doc.py, --mb 200): peak/doc 1.79 (jsonl) and 1.73 (records), the
    growth over a small build about 1.0x the document at 200 MB (at 20 MB: 17 and 59 MB, the tokenizer's
    working memory weighing more); 3.63 and 7.77 before huge_json and streamed records. Parquet (Snappy,
    read by packer's page reader): 1.65 both, 5.16 and 4.16 with pyarrow's reading; chats from Parquet
    (the nested messages column read by the page reader too): 1.75, 3.87 with pyarrow's reading."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_huge_doc import write_case

    (tmp_path / "small").mkdir()
    (tmp_path / "huge").mkdir()
    small, _, extra = write_case(case, tmp_path / "small", 1000)
    huge, doc, _ = write_case(case, tmp_path / "huge", 20_000_000)
    limit = doc + (1 << 20)
    baseline = _peak_rss_mb(small, tmp_path / "o1", limit, extra)
    peak = _peak_rss_mb(huge, tmp_path / "o2", limit, extra)
    doc_mb = doc / 2**20
    assert peak - baseline < 1.5 * doc_mb + ALLOWANCE_MB, (peak, baseline, doc_mb)
    manifest = json.loads((tmp_path / "o2" / "manifest.json").read_text())
    assert manifest["totals"]["docs_accepted"] == 3


ALLOWANCE_MB = 40  # the tokenizer's working memory for one 1 MiB piece, and allocator slack


@pytest.mark.parametrize("layout", ["string", "large_string", "string_view", "binary", "dict-string", "dict-binary"])
def test_huge_column_values_read_as_the_old_path_reads_them(tmp_path, monkeypatch, layout):
    """A chunk holding a value over HUGE_TEXT_BYTES is read row by row, such a value as a Utf8Text over its
    Arrow buffer: the same texts, skips and examples as the old path (every value a Python object)."""
    import pyarrow as pa

    from packer.preprocess.readers import columns

    monkeypatch.setattr(columns, "HUGE_TEXT_BYTES", 300)
    binary = "binary" in layout
    values = [_long_text(1, 3), "short", None, "", "  \u3000 " * 300, _long_text(2, 3), " x ", _long_text(3, 3) * 90,
              _long_text(1, 3)]
    values = [v.encode() if binary and v is not None else v for v in values]
    if binary:
        values += [b"\xff" * 2000, b"caf\xe9", b"  "]
    kind = {"string": pa.string(), "large_string": pa.large_string(), "string_view": pa.string_view(),
            "binary": pa.binary(), "dict-string": pa.string(), "dict-binary": pa.binary()}[layout]
    column = pa.array(values, kind)
    if layout.startswith("dict"):
        column = column.dictionary_encode()
        assert len(column.dictionary) < len(values)

    def read():
        skips = SkipLog.empty()
        got = list(columns.column_texts(column, 10, "a.parquet", skips, max_bytes=20_000))
        return [(type(t).__name__, str(t)) for t in got], skips.counts, skips.examples

    new = read()
    monkeypatch.setattr(columns, "_longest", lambda column: 0)  # the old path
    old = read()
    assert [t for _, t in new[0]] == [t for _, t in old[0]] and new[1:] == old[1:]
    assert [k for k, _ in new[0]].count("Utf8Text") == 3 and [k for k, _ in old[0]].count("Utf8Text") == 0
    assert {"null_text", "empty_text", "too_large"} <= set(new[1]) and (not binary or new[1]["invalid_utf8"] == 2)


def test_a_huge_parquet_value_gives_the_tokens_of_its_text(tmp_path, tok, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packer.preprocess.readers import columns

    monkeypatch.setattr(columns, "HUGE_TEXT_BYTES", 4096)
    texts = ["before", _long_text(6), "after"]
    eos = tokenizer_info(TOKENIZER, BuildConfig()).eos_id
    ref = [t for e in tok.encode_batch(texts, add_special_tokens=False) for t in e.ids + [eos]]
    for dictionary in (True, False):
        path = tmp_path / f"a{dictionary}.parquet"
        pq.write_table(pa.table({"text": texts}), path, use_dictionary=dictionary)
        kinds = [type(t).__name__ for u in plan_units([str(path)], 1 << 30) for t in read_unit(u, SkipLog.empty())]
        assert kinds == ["str", "Utf8Text", "str"]
        (tmp_path / str(dictionary)).mkdir()
        ids, _, _ = _unit_tokens(path, tmp_path / str(dictionary))
        assert ids == ref


@pytest.mark.parametrize("layout", ["string", "large"])
def test_huge_nested_values_read_as_the_old_path_reads_them(monkeypatch, layout):
    """column_records of batches whose nested strings (a chat's contents) pass HUGE_TEXT_BYTES: each such
    string a Utf8Text over the Arrow buffer, the record a HugeRecord, and otherwise what to_pylist gives
    (nulls dropped as before), sliced batches and large types included."""
    import pyarrow as pa

    from packer.encode.chat_long import as_str
    from packer.io.utf8 import HugeRecord
    from packer.preprocess.readers import columns

    monkeypatch.setattr(columns, "HUGE_TEXT_BYTES", 50)
    rng = random.Random(0)

    def text():
        return "".join(rng.choice(["a", "\u00e9", " ", "\u4e2d", "x"]) for _ in range(rng.randrange(0, 80)))

    rows = [{"messages": None if i % 17 == 0 else [
        {"role": rng.choice(["user", "assistant", None]), "content": text() if i % 5 else None, "w": rng.choice([1, None])}
        for _ in range(rng.randrange(0, 4))], "prompt": text() if i % 3 else None, "n": i} for i in range(300)]
    table = pa.Table.from_pylist(rows)
    if layout == "large":
        message = pa.struct([("role", pa.large_string()), ("content", pa.large_string()), ("w", pa.int64())])
        table = table.cast(pa.schema([("messages", pa.large_list(message)), ("prompt", pa.large_string()),
                                      ("n", pa.int64())]))
    huge = 0
    for part in (table, table.slice(37, 200)):
        for batch in part.to_batches(max_chunksize=64):
            got = list(columns.column_records(batch, ("messages", "prompt", "n"), 5, "p"))
            with monkeypatch.context() as m:
                m.setattr(columns, "_longest_leaf", lambda array: 0)  # the old path: to_pylist
                want = list(columns.column_records(batch, ("messages", "prompt", "n"), 5, "p"))
            assert [(w, as_str(r)) for w, r in got] == want
            assert all(type(r) is HugeRecord for _, r in got)
            huge += sum(isinstance(m["content"], Utf8Text) for _, r in got for m in r.get("messages", []) if "content" in m)
    assert huge > 50
