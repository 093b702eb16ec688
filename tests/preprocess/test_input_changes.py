"""An input rewritten under a build is caught: each unit records a hash of the bytes it read (while
reading them), and a build re-hashes them before it resumes and before it writes a manifest. An
edit during the build, or a same-size edit with the mtime restored between a kill and the resume,
stops the build naming the file and the unit; restoring the file resumes; --overwrite rebuilds."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import xxhash
from click.testing import CliRunner
from conftest import TOKENIZER, sample_texts

from packer.cli import main
from packer.config import BuildConfig, Job
from packer.io import failpoints
from packer.preprocess import changed, tokenize
from packer.preprocess.changed import InputChanged
from packer.preprocess.pipeline import build

ROOT = Path(__file__).resolve().parents[2]
TEXTS = sample_texts()[:400]


def _jsonl(path: Path, texts=TEXTS) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def _inputs(d: Path, fmt: str) -> Path:
    if fmt == "jsonl":
        return _jsonl(d / "a.jsonl")
    if fmt == "jsonl.gz":
        (d / "a.jsonl.gz").write_bytes(gzip.compress(_jsonl(d / "tmp.jsonl").read_bytes(), mtime=0))
        (d / "tmp.jsonl").unlink()
        return d / "a.jsonl.gz"
    table = pa.table({"text": TEXTS, "n": list(range(len(TEXTS)))})
    if fmt == "parquet":
        pq.write_table(table, d / "a.parquet", row_group_size=50)
        return d / "a.parquet"
    with ipc.new_stream(d / "a.arrow", table.schema) as w:
        w.write_table(table, max_chunksize=100)
    return d / "a.arrow"


def _job(inputs, out, **config) -> Job:
    return Job(inputs=[str(p) for p in inputs], tokenizer=TOKENIZER, output=str(out), workers=1,
               config=BuildConfig(**{"context_length": 256, "unit_bytes": 60_000, **config}))


def _units(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "_work" / "units").glob("unit-*.json"))]


def _edit_same_size(path: Path, at: int, keep_mtime: bool = True):
    """Flip the case of one ASCII letter at or after byte `at` (same size); restore the mtime."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    i = next(k for k in range(at, len(data)) if chr(data[k]).isalpha() and data[k] < 128)
    data[i] ^= 0x20
    path.write_bytes(data)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return i


def _reference_digest(path: Path, ranges) -> str:
    """The record's digest, recomputed here from the file and the ranges alone."""
    data, h = path.read_bytes(), xxhash.xxh3_128()
    for offset, length in ranges:
        h.update(data[offset:offset + length])
    return h.hexdigest()


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet", "arrow"])
def test_each_unit_records_a_hash_of_what_it_read(tmp_path, fmt):
    path = _inputs(tmp_path, fmt)
    out = tmp_path / "out"
    build(_job([path], out, unit_bytes=60_000 if fmt != "parquet" else 20_000), keep_work=True)
    units = _units(out)
    size = path.stat().st_size
    for c in units:
        record = c["input"]
        assert record["hash"] == "xxh3-128" and record["file_bytes"] == size
        assert record["digest"] == _reference_digest(path, record["ranges"])
    covered = sorted((o, o + n) for c in units for o, n in c["input"]["ranges"])
    if fmt in ("jsonl.gz", "arrow"):
        assert [c["input"]["ranges"] for c in units] == [[[0, size]]]  # the whole stored file
    elif fmt == "jsonl":
        assert len(units) > 3 and covered[0][0] == 0 and max(e for _, e in covered) == size
        for c in units:  # its lines, read from the first line start on (within 64K of its start) past its end
            o, n = c["input"]["ranges"][-1]
            assert c["start"] <= o <= c["start"] + 65536 and o + n >= min(c["end"], size)
    else:  # parquet: the units' row groups, one span each, and the footer every unit depends on
        assert len(units) > 2 and all(c["input"]["ranges"][-1][0] + c["input"]["ranges"][-1][1] == size for c in units)
        spans = sorted(tuple(c["input"]["ranges"][0]) for c in units)
        assert all(a[0] + a[1] == b[0] for a, b in zip(spans, spans[1:]))  # runs of row groups, back to back


def _edit_after_first_unit(monkeypatch, path: Path, at: int):
    """Simulate another program rewriting `path` once the build has read its first unit."""
    real = tokenize.tokenize_unit

    def tokenize_then_edit(unit, *args):
        counters = real(unit, *args)
        if unit.index == 0:
            _edit_same_size(path, at)
        return counters

    monkeypatch.setattr(tokenize, "tokenize_unit", tokenize_then_edit)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet", "arrow"])
def test_an_input_edited_during_the_build_is_refused_before_the_manifest(tmp_path, monkeypatch, fmt):
    path = _inputs(tmp_path, fmt)
    out = tmp_path / "out"
    at = 100 if fmt in ("jsonl", "jsonl.gz") else 8  # inside unit 0's bytes (jsonl) / the stored data
    if fmt == "jsonl.gz":  # any stored byte of a compressed file: recompressing keeps the size only by luck
        monkeypatch.setattr(tokenize, "tokenize_unit", _flip_byte_after(tokenize.tokenize_unit, path, 100))
    else:
        _edit_after_first_unit(monkeypatch, path, at)
    with pytest.raises(InputChanged) as e:
        build(_job([path], out))
    message = str(e.value)
    assert message.startswith(f"{path} changed after packer read it (unit 0, ")
    assert "same size" in message and "refusing to write a manifest" in message and "--overwrite" in message
    assert not (out / "manifest.json").exists() and (out / "_work" / "units" / "unit-000000.json").exists()


def _flip_byte_after(real, path: Path, at: int):
    def tokenize_then_flip(unit, *args):
        counters = real(unit, *args)
        if unit.index == 0:
            st = os.stat(path)
            data = bytearray(path.read_bytes())
            data[at] ^= 0x01
            path.write_bytes(data)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        return counters
    return tokenize_then_flip


def test_restoring_the_file_resumes_and_overwrite_rebuilds(tmp_path, monkeypatch):
    path = _inputs(tmp_path, "jsonl")
    original, st = path.read_bytes(), os.stat(path)
    out, clean = tmp_path / "out", tmp_path / "clean"
    real = tokenize.tokenize_unit

    def stop_after_two(unit, *args):  # Ctrl-C once two units are finished
        if unit.index == 2:
            raise KeyboardInterrupt
        return real(unit, *args)

    monkeypatch.setattr(tokenize, "tokenize_unit", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        build(_job([path], out))
    monkeypatch.undo()
    _edit_same_size(path, 100)
    with pytest.raises(InputChanged, match="refusing to resume over it"):
        build(_job([path], out))
    edited = path.read_bytes()
    path.write_bytes(original)  # restored as `cp -p` would: the same command resumes from the finished units
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    resumed = build(_job([path], out))
    build(_job([path], clean))
    assert _shards(out) == _shards(clean) and resumed["totals"] == json.loads((clean / "manifest.json").read_text())["totals"]
    path.write_bytes(edited)  # now the edit is what the user wants: --overwrite builds from it
    rebuilt = build(_job([path], out), overwrite=True)
    assert rebuilt["totals"]["docs_accepted"] == len(TEXTS) and _shards(out) != _shards(clean)


def test_after_an_edit_during_the_build_overwrite_rebuilds(tmp_path, monkeypatch):
    """Units read before and after the edit hold different versions: no version resumes, --overwrite does."""
    path = _inputs(tmp_path, "jsonl")
    out = tmp_path / "out"
    _edit_after_first_unit(monkeypatch, path, 100)
    with pytest.raises(InputChanged):
        build(_job([path], out))
    monkeypatch.undo()
    with pytest.raises(InputChanged):  # the same command again: still refused, nothing written
        build(_job([path], out))
    assert build(_job([path], out), overwrite=True)["totals"]["docs_accepted"] == len(TEXTS)


def _shards(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}


def test_a_same_size_edit_with_the_mtime_restored_between_a_kill_and_the_resume(tmp_path):
    path = _inputs(tmp_path, "jsonl")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "packer", "build", str(path), "--tokenizer", TOKENIZER, "--output", str(out),
           "--workers", "1", "--unit-bytes", "60000", "--context-length", "256", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), failpoints.ENV: "tokenize:2=kill"}
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9 and len(list((out / "_work" / "units").glob("unit-*.json"))) == 2
    before = os.stat(path)
    _edit_same_size(path, 70_000)  # inside unit 1, already read
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)  # the fingerprint cannot tell
    env.pop(failpoints.ENV)
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr
    (line,) = [x for x in resumed.stderr.splitlines() if x.startswith("Error")]
    # unit 0 read on past its end (1 MiB reads), so it is named first: the first unit whose bytes changed
    assert line.startswith(f"Error: {path} changed after packer read it (unit 0, bytes 0-60000: the bytes it read ")
    assert "refusing to resume over it" in line and "--overwrite" in line
    assert not (out / "manifest.json").exists()
    result = CliRunner().invoke(main, cmd[3:] + ["--overwrite"])
    assert result.exit_code == 0, result.output


def test_units_without_a_record_still_resume(tmp_path):
    """A _work/ from before the records (or a unit whose file was skipped) is not refused for lacking one."""
    path = _inputs(tmp_path, "jsonl")
    out = tmp_path / "out"
    build(_job([path], out), keep_work=True)
    for p in (out / "_work" / "units").glob("unit-*.json"):
        counters = json.loads(p.read_text())
        counters.pop("input")
        p.write_text(json.dumps(counters))
    (out / "manifest.json").unlink()
    assert build(_job([path], out))["totals"]["docs_accepted"] == len(TEXTS)


def test_records_of_the_earlier_hash_are_still_checked(tmp_path):
    """A _work/ whose units hashed with blake2b-128 (packer before 2026-12-04): a resume checks them with it."""
    path = _inputs(tmp_path, "jsonl")
    out = tmp_path / "out"
    build(_job([path], out, unit_bytes=60_000), keep_work=True)
    for p in (out / "_work" / "units").glob("unit-*.json"):
        counters = json.loads(p.read_text())
        record = counters["input"]
        data, h = path.read_bytes(), hashlib.blake2b(digest_size=16)
        for offset, length in record["ranges"]:
            h.update(data[offset:offset + length])
        record.update(hash="blake2b-128", digest=h.hexdigest())
        p.write_text(json.dumps(counters))
    (out / "manifest.json").unlink()
    resumed = build(_job([path], out, unit_bytes=60_000), keep_work=True)
    assert resumed["totals"]["docs_accepted"] == len(TEXTS)  # the file as read: resumes
    (out / "manifest.json").unlink()
    _edit_same_size(path, 70_000)
    with pytest.raises(InputChanged, match="changed after packer read it"):
        build(_job([path], out, unit_bytes=60_000))


def test_hashing_can_be_turned_off_for_the_benchmark(tmp_path, monkeypatch):
    path = _inputs(tmp_path, "jsonl")
    monkeypatch.setattr(changed, "ENABLED", False)
    build(_job([path], tmp_path / "off"), keep_work=True)
    assert all(c["input"] is None for c in _units(tmp_path / "off"))
