"""huge_json decodes a huge line's long strings in place: the object json.loads gives, or None with the line untouched.

Strings over 8 bytes count as long here and windows are 16 bytes, so every escape, multi-byte
character and backslash run meets a window's edge somewhere in these lines."""

from __future__ import annotations

import json
import random

import pytest

from packer.encode.chat_long import as_str
from packer.io import lines
from packer.io.utf8 import Utf8Text
from packer.preprocess.readers import huge_json, jsonl, plan_units, read_unit
from packer.preprocess.readers.common import SkipLog


@pytest.fixture(autouse=True)
def small_windows(monkeypatch):
    monkeypatch.setattr(huge_json, "LONG_STRING_BYTES", 8)
    monkeypatch.setattr(huge_json, "WINDOW_BYTES", 16)


PIECES = ['\\"', "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t", "\\u00e9", "\\u4E2D", "\\u0041", "\\u007f",
          "\\\\\\\\", "\\\\u00e9", "\u00e9", "\u4e2d", "\U0001F600", "\u2028", "\x7f", "a", "b c", "'", "/", " "]
BAD = ["\\x", "\\u12", "\\u12zz", "\x01", "\t", "\\", "\\U0041"]  # json refuses each inside a string
FALLBACK = ["\\ud83d\\ude00", "\\ud800", "\\uDC00 x", "\\u0000"]  # surrogates and NUL: left to the ordinary path


def _body(rng, n, pieces=PIECES) -> str:
    return "".join(rng.choice(pieces) for _ in range(n))


def _marks(value) -> list[str]:
    """Placeholders left in `value` (none may be)."""
    if isinstance(value, str):
        return [value] if value.startswith("\x00") else []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [m for v in items for m in _marks(v)]


def _check(line: bytes, keys=None):
    """huge_record against json.loads; returns whether it decoded the line."""
    buf = bytearray(line)
    got = huge_json.huge_record(buf, keys)
    if got is None:
        assert buf == line  # left as it came, for the ordinary path
        return False
    expected = json.loads(line.decode("utf-8"))
    assert set(got) == set(expected)
    for k, v in got.items():
        if keys is None or k in keys:
            assert repr(as_str(v)) == repr(expected[k]), (line, k)  # repr: NaN
            assert not _marks(v)
    return True


def test_every_escape_across_window_edges_decodes_as_json_does():
    rng = random.Random(0)
    decoded = 0
    for i in range(600):
        body = _body(rng, rng.randrange(5, 60))
        other = rng.choice(["", "ab", "\\n", "\u00e9", "\\u00e9\\\\"])  # short: parsed with the skeleton
        line = f'{{"id": {i}, "text": "{body}", "meta": {{"a": [1, 2.5, null, true, "{other}"]}}, "x": "{other}"}}'
        decoded += _check(line.encode("utf-8") + b"\n" * (i % 2))
        got = huge_json.huge_record(bytearray(line.encode("utf-8")))
        assert isinstance(got["text"], Utf8Text) and not isinstance(got["x"], Utf8Text)
    assert decoded == 600


def test_it_gives_what_json_gives_or_leaves_the_line():
    """Adversarial lines: whatever huge_record returns equals json.loads, and a line json refuses is never decoded."""
    rng = random.Random(1)
    shapes = [
        '{{"text": "{a}", "text": "{b}"}}',  # duplicate keys: the last wins
        '{{"text": "{a}", "text": null}}',
        '{{"text": null, "text": "{a}"}}',
        '{{"meta": {{"text": "{a}"}}, "text": "{b}"}}',  # a long string nested: decoded in place too
        '{{"text": ["{a}"]}}',
        '{{"messages": [{{"role": "user", "content": "{a}"}}, {{"role": "assistant", "content": "{b}"}}]}}',
        '{{"m": [[{{"x": ["{a}", 1, {{"y": "{b}"}}]}}]], "t": "{b}"}}',
        '{{"{a}": 1, "text": "{b}"}}',  # a long key
        ' {{"text": "{a}"}}', '{{"text": "{a}"}} \r', '{{"text": "{a}"}}x', '{{"text": "{a}",}}', '{{"text": "{a}"',
        '{{"text": "{a}", "n": NaN, "i": -Infinity, "big": 123456789012345678901234567890}}',
        '["{a}"]', '"{a}"', '{{"text": 5, "other": "{a}"}}', '{{"text": "{a}", "deep": [[[[[[1]]]]]]}}',
        '{{"text": "{a}" , "y" : {{"z": 1, "z": 2}} }}', '{{"text" : "{a}"}}',
    ]
    decoded = refused = 0
    for i in range(1500):
        shape = shapes[i % len(shapes)]
        pieces = PIECES + (BAD if i % 3 == 0 else []) + (FALLBACK if i % 5 == 0 else [])
        a, b = _body(rng, rng.randrange(3, 40), pieces), _body(rng, rng.randrange(3, 40), pieces)
        line = shape.format(a=a, b=b).encode("utf-8")
        try:
            json.loads(line.decode("utf-8"))
            ok = True
        except json.JSONDecodeError:
            ok = False
        got = _check(line)
        assert ok or not got, line
        decoded += got
        refused += not ok
        if ok and ("\\ud" not in a + b and "\\u0000" not in a + b):
            _check(line, keys={"text"})
    assert decoded > 300 and refused > 100


def test_what_it_leaves_to_the_ordinary_path():
    text = "x" * 20
    for line in [f'{{"text": "{text}\\ud83d\\ude00"}}', f'{{"text": "{text}\\ud800"}}', f'{{"text": "{text}\\u0000"}}',
                 f'{{"a": {{"{text}": 1}}}}', f'{{"{text}": 1}}', f'["{text}"]', f' {{"text": "{text}"}}',
                 '{"text": "short"}']:
        assert huge_json.huge_record(bytearray(line.encode())) is None, line
    assert huge_json.huge_record(f'{{"text": "{text}"}}'.encode()) is None  # bytes: not writable in place
    assert huge_json.huge_record(bytearray(b'{"text": "' + b"\xe9" * 20 + b'"}')) is None  # not UTF-8
    got = huge_json.huge_record(bytearray(f'{{"text": "{text}\\n\\u00e9"}}'.encode()))
    assert isinstance(got["text"], Utf8Text) and str(got["text"]) == text + "\n\u00e9"
    chat = f'{{"messages": [{{"role": "user", "content": "hi"}}, {{"role": "assistant", "content": "{text}\\u00e9"}}]}}'
    got = huge_json.huge_record(bytearray(chat.encode()))
    assert got["messages"][0] == {"role": "user", "content": "hi"}
    assert isinstance(got["messages"][1]["content"], Utf8Text) and str(got["messages"][1]["content"]) == text + "\u00e9"


def test_the_document_is_the_line_itself():
    line = bytearray(b'{"id": 1, "text": "' + b'ab\\"c\\u00e9 ' * 10 + b'"}\n')
    got = huge_json.huge_record(line)
    assert got["id"] == 1 and str(got["text"]) == 'ab"c\u00e9 ' * 10
    assert got["text"].data.obj is line  # a view of the line's own bytes: no copy


def test_a_huge_line_reads_as_the_ordinary_path_reads_it(tmp_path, monkeypatch):
    """Texts and records of a file of huge lines, with huge_json and without it (the ordinary path):
    the same documents and records, the same skips and examples, in the same order."""
    monkeypatch.setattr(jsonl, "HUGE_TEXT_BYTES", 64)
    monkeypatch.setattr(lines, "BLOCK_BYTES", 64)  # reads of 64 bytes: a longer line comes as a block of its own
    rng = random.Random(2)
    rows = []
    for i in range(300):
        pieces = PIECES + (BAD if i % 7 == 0 else []) + (FALLBACK if i % 11 == 0 else [])
        body = _body(rng, rng.randrange(40, 90), pieces)
        rows.append(rng.choice([
            f'{{"text": "{body}", "id": {i}}}', f'{{"id": {i}, "text": "{body}", "text": "{body[3:]}"}}',
            f'{{"other": "{body}"}}', f'{{"text": null, "pad": "{body}"}}', f'{{"text": "{" " * 70}\\u3000"}}',
            f'{{"text": {i}, "pad": "{body}"}}', f'{{"text": "{body}"', f'{{"prompt": "p", "completion": "{body}"}}',
        ]))
    path = tmp_path / "a.jsonl"
    path.write_bytes("\n".join(rows).encode("utf-8") + b"\n")
    (unit,) = plan_units([str(path)], 1 << 30)

    def read():
        skips = SkipLog.empty()
        texts = [str(t) for t in read_unit(unit, skips)]
        rskips = SkipLog.empty()
        records = [(w, as_str(r)) for w, r in jsonl.records(unit, path, rskips, fields=("prompt",), max_doc_bytes=1 << 30,
                                                          fix="")]
        return texts, skips.counts, skips.examples, records, rskips.counts

    calls = []
    real = huge_json.huge_record
    monkeypatch.setattr(huge_json, "huge_record", lambda *a, **k: calls.append(r := real(*a, **k)) or r)
    new = read()
    assert sum(r is not None for r in calls) > 100  # the new path took most lines
    monkeypatch.setattr(huge_json, "huge_record", lambda *a, **k: None)
    assert new == read()
    assert len(new[0]) > 50 and len(new[1]) >= 5 and len(new[3]) > 150
