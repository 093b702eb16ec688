"""Readers: unit planning at any byte size yields every record once; bad records are counted."""

from __future__ import annotations

import json

import pytest

from conftest import SAMPLE_INPUTS
from packer.readers import SkipLog, expand_inputs, plan_units, read_jsonl_unit


@pytest.mark.parametrize("unit_bytes", [1, 7, 100, 4096, 10**9])
def test_any_unit_size_reads_every_record_once(tmp_path, unit_bytes):
    path = tmp_path / "a.jsonl"
    texts = [f"doc {i} " + "x" * (i % 13) for i in range(200)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    got = []
    for unit in plan_units([str(path)], unit_bytes):
        got.extend(read_jsonl_unit(unit, "text", SkipLog.empty()))
    assert got == texts


def test_bad_records_are_counted_by_reason(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'{"text": "good"}\n{"text": \n{"other": 1}\n{"text": null}\n{"text": 5}\n{"text": ""}\n'
        b'{"text": "caf\xe9"}\n[1, 2]\n\n{"text": "also good"}\n'
    )
    skips = SkipLog.empty()
    (unit,) = plan_units([str(path)], 10**6)
    assert list(read_jsonl_unit(unit, "text", skips)) == ["good", "also good"]
    assert dict(skips.counts) == {
        "malformed_json": 1, "missing_field": 2, "null_text": 1, "non_string_text": 1,
        "empty_text": 1, "invalid_utf8": 1,
    }
    assert skips.examples[0]["where"].startswith(str(path))


def test_expand_inputs_directories_and_errors(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name in ("d/b.jsonl", "d/a.jsonl", "d/sub/c.jsonl", "d/.hidden.jsonl"):
        (tmp_path / name).write_text("")
    files = expand_inputs([str(tmp_path / "d")])
    assert [f.split("/d/")[1] for f in files] == ["a.jsonl", "b.jsonl", "sub/c.jsonl"]
    with pytest.raises(FileNotFoundError, match="input not found"):
        expand_inputs([str(tmp_path / "missing.jsonl")])
    assert expand_inputs(list(SAMPLE_INPUTS)) == list(SAMPLE_INPUTS)
