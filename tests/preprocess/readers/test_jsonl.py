"""JSONL records (packer/preprocess/readers/jsonl.py): the orjson path reads every line as the json
path reads it (the same record, or the same skip reason and message), hostile lines included; a line
holding a long integer is read by json, whose integers have no 64-bit limit."""

from __future__ import annotations

import json
import math
import random

from packer.preprocess.readers import SkipLog, read_records
from packer.preprocess.readers.common import Unit
from packer.preprocess.readers.jsonl import _orjson_reads_as_json, _parse_line

HOSTILE = [
    b'{"a": NaN}', b'{"a": -Infinity}', b'{"a": "\\ud800"}', b'{"a": "\\udc00x\\ud83d\\ude00"}', b'{"a": 1e400}',
    b'{"a": 123456789012345678901234567890}', b'{"a": -9223372036854775809}', b'{"a": 18446744073709551615}',
    b'{"a": 1, "a": 2}', b'{"a": "\xff"}', b'\xef\xbb\xbf{"a": 1}', b'{"a": "\x01"}', b'[1, 2]', b'"text"', b'3',
    b'null', b'{"a": 1} x', b'{"a": 1', b'{"a": -0.0, "b": -0}', b'{"a": 5e-324, "b": 2.2250738585072014e-308}',
    b'  {"a": 1}  \r', b'{"a": "\\u0000", "\\ud83d\\ude00": "\xf0\x9f\x98\x80"}', b"{'a': 1}", b'{"a": tru}',
    b'[' * 3000 + b']' * 3000, b'{"a":' * 1500 + b'1' + b'}' * 1500,
]


def _lines(n: int, seed: int) -> list[bytes]:
    """Random JSON objects (nested values, floats written many ways, unicode, escapes) and the hostile lines."""
    rng = random.Random(seed)

    def value(depth):
        k = rng.randrange(8 if depth < 3 else 5)
        if k == 0:
            return rng.randrange(-10**18, 10**18)
        if k == 1:
            return rng.choice([rng.random() * 10 ** rng.randrange(-300, 300), -0.0, 0.1, 1e-7, 3.0])
        if k == 2:
            return "".join(rng.choice(["a", "é", "日本", "😀", "\n", '"', "\\", "\t", "\u2028", " "])
                           for _ in range(rng.randrange(6)))
        if k == 3:
            return rng.choice([True, False, None])
        if k == 4:
            return ""
        if k == 5:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {f"k{i}": value(depth + 1) for i in range(rng.randrange(4))}

    out = [json.dumps({"messages": value(0), "x": value(0)}, ensure_ascii=rng.random() < 0.5).encode("utf-8")
           for _ in range(n)]
    floats = [f'{{"f": {rng.random() * 10 ** rng.randrange(-320, 308):.{rng.randrange(1, 25)}e}}}'.encode()
              for _ in range(n)]
    return out + floats + HOSTILE


def _same(a, b) -> bool:
    """Equal values of the same types (floats bit for bit, -0.0 apart from 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_the_orjson_path_reads_every_line_as_json_does():
    """orjson where _orjson_reads_as_json says so, else json; against json alone."""
    n_fast = 0
    for line in _lines(2000, seed=1):
        fast_skips, slow_skips = SkipLog.empty(), SkipLog.empty()
        fast = _parse_line(line, "f.jsonl:1", fast_skips, 1 << 20)
        slow = _parse_line(line, "f.jsonl:1", slow_skips, 1 << 20, fast=False)
        assert _same(fast, slow), line
        assert (fast_skips.counts, fast_skips.examples) == (slow_skips.counts, slow_skips.examples), line
        n_fast += slow is not None and _orjson_reads_as_json(line)
    assert 3000 < n_fast < 4000  # most lines are records orjson reads; the hostile ones mostly not


def test_a_long_integer_is_read_by_json(tmp_path):
    path = tmp_path / "r.jsonl"
    lines = [b'{"input_ids": [1, 123456789012345678901234567890]}', b'{"a": NaN}', b'{"a": "\\ud800"}', b'[1]']
    path.write_bytes(b"\n".join(lines) + b"\n")
    skips = SkipLog.empty()
    got = list(read_records(Unit(0, str(path), 0, path.stat().st_size, "jsonl", None), skips, ("input_ids",)))
    assert [w for w, _ in got] == [f"{path}:1", f"{path}:2", f"{path}:3"]
    assert got[0][1] == {"input_ids": [1, 123456789012345678901234567890]}
    assert type(got[0][1]["input_ids"][1]) is int and math.isnan(got[1][1]["a"]) and got[2][1] == {"a": "\ud800"}
    assert skips.counts == {"missing_field": 1}
