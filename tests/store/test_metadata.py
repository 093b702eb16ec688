"""Typed metadata (issue 28): a manifest.json or stats.json of wrong types, non-finite or absurd
values, or deep nesting is one `Error:` line from every command, never a traceback, and never `ok`."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.store.manifest import read_manifest

COMMANDS = ("verify", "inspect", "stats")


def _set(section, key, value):
    return lambda m: m[section].__setitem__(key, value)


MANIFEST_EDITS = {
    "context_length null": _set("config", "context_length", None),
    "context_length a list": _set("config", "context_length", [1024]),
    "context_length a string": _set("config", "context_length", "1024"),
    "context_length Infinity": lambda m: json.dumps(m).replace('"context_length": 1024', '"context_length": Infinity'),
    "token_dtype garbage": _set("config", "token_dtype", "garbage"),
    "token_dtype 7": _set("config", "token_dtype", 7),
    "a count a string": lambda m: m["shards"][0].__setitem__("sequences", "3"),
    "a negative count": lambda m: m["totals"].__setitem__("tokens_out", -5),
    "vocab_size 2^70": _set("tokenizer", "vocab_size", 2**70),
    "vocab_size beyond uint16": _set("tokenizer", "vocab_size", 2**20),
    "eos_id -1": _set("config", "eos_id", -1),
    "pad_id 10^9": _set("config", "pad_id", 10**9),
    "eos_id the vocabulary size": lambda m: m["config"].__setitem__("eos_id", m["tokenizer"]["vocab_size"]),
    "fill_rate NaN": lambda m: json.dumps(m).replace('"fill_rate": ', '"fill_rate": NaN, "x": '),
    "100,000-deep": lambda m: json.dumps({**m, "deep": "@"}).replace('"@"', "[" * 100_000 + "]" * 100_000),
}


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def _copy(sample_dataset, tmp_path, name, edit):
    d = tmp_path / "ds"
    shutil.copytree(sample_dataset, d)
    value = json.loads((d / name).read_text())
    edited = edit(value)
    (d / name).write_text(edited if isinstance(edited, str) else json.dumps(value))
    return d


def _one_error_line(result):
    lines = result.output.strip().splitlines()
    assert result.exit_code != 0 and result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.mark.parametrize("case", MANIFEST_EDITS)
def test_bad_manifest_is_one_error_line_from_every_command(sample_dataset, tmp_path, runner, case):
    d = _copy(sample_dataset, tmp_path, "manifest.json", MANIFEST_EDITS[case])
    for command in COMMANDS:
        line = _one_error_line(runner.invoke(main, [command, str(d)]))
        assert "manifest.json" in line and "rebuild" in line, line
    with pytest.raises(ValueError, match="manifest.json"):
        read_manifest(d)


STATS_EDITS = {
    "100,000-deep": lambda s: "[" * 100_000 + "]" * 100_000,
    "a count a string": lambda s: s["lengths"].__setitem__("documents", "7"),
    "Infinity": lambda s: json.dumps(s).replace('"context_length": 1024', '"context_length": Infinity'),
}


@pytest.mark.parametrize("case", STATS_EDITS)
def test_bad_stats_json_is_one_error_line_from_verify(sample_dataset, tmp_path, runner, case):
    d = _copy(sample_dataset, tmp_path, "stats.json", STATS_EDITS[case])
    line = _one_error_line(runner.invoke(main, ["verify", str(d)]))
    assert "stats.json" in line, line


def test_an_untouched_dataset_still_reads(sample_dataset, runner):
    assert runner.invoke(main, ["verify", str(sample_dataset)]).output.startswith("ok:")


def test_deeply_nested_pipeline_file_is_one_error_line(tmp_path, runner):
    path = tmp_path / "deep.toml"
    path.write_text('tokenizer = "t"\noutput = "o"\ninputs = ' + "[" * 100_000 + "]" * 100_000 + "\n")
    line = _one_error_line(runner.invoke(main, ["run", str(path)]))
    assert "deep.toml" in line and "nested" in line, line
