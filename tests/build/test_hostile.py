"""Hostile input through `packer build`: bad records skipped and counted (or --strict fails),
bad files fail with one line (or --on-file-error skip), huge documents stay bounded, Ctrl-C
stops promptly leaving only complete unit files, every format round-trips to the same tokens."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_INPUTS, TOKENIZER, sample_texts
from tokenizers import Tokenizer

from packer.cli import main
from packer.store.dataset import open_dataset
from packer.store.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[2]
BAD_LINES = (
    b'{"text": "good one"}\n{"text": \n{"other": 1}\n{"text": null}\n{"text": 5}\n{"text": ""}\n'
    b'{"text": "caf\xe9"}\n{"text": "good <|endoftext|> two \\u0000"}\n'
)


def _build(tmp_path, *inputs, extra=()):
    out = Path(f"{tmp_path}_out")  # beside, not inside, an input directory
    args = ["build", *map(str, inputs), "--tokenizer", TOKENIZER, "--output", str(out), "--workers", "1",
            "--context-length", "256", *extra]
    return CliRunner().invoke(main, args), out


def _error_lines(output: str) -> list[str]:
    assert "Traceback" not in output
    return [line for line in output.splitlines() if line.startswith("Error")]


def _docs_by_id(out):
    """Each document's token ids, gathered from the shards through doc_ids and offsets."""
    ds = open_dataset(out)
    docs = {}
    for entry in ds.manifest["shards"]:
        table = ipc.open_file(pa.memory_map(str(out / entry["file"]))).read_all()
        for ids, offs, doc_ids in zip(*(table[c].to_pylist() for c in ("input_ids", "offsets", "doc_ids"))):
            for a, b, d in zip(offs[:-1], offs[1:], doc_ids):
                docs.setdefault(d, []).append(ids[a:b])
    return docs


def test_bad_records_are_skipped_counted_and_shown(tmp_path):
    (tmp_path / "bad.jsonl").write_bytes(BAD_LINES)
    result, out = _build(tmp_path, tmp_path / "bad.jsonl")
    assert result.exit_code == 0, result.output
    assert "2 accepted of 8 read (6 skipped:" in result.output
    assert f"skipped malformed_json: {tmp_path / 'bad.jsonl'}:2: Expecting value" in result.output
    totals = read_manifest(out)["totals"]
    assert totals["docs_skipped"] == {"malformed_json": 1, "missing_field": 1, "null_text": 1,
                                      "non_string_text": 1, "empty_text": 1, "invalid_utf8": 1}
    assert totals["docs_read"] == totals["docs_accepted"] + sum(totals["docs_skipped"].values())
    assert [e["where"] for e in totals["skip_examples"]][:2] == [f"{tmp_path / 'bad.jsonl'}:{n}" + s
                                                                for n, s in ((2, ": Expecting value"), (3, ""))]
    tok = Tokenizer.from_file(TOKENIZER)
    eos = tok.token_to_id("<|endoftext|>")
    docs = [pieces for (pieces,) in _docs_by_id(out).values()]
    assert all(ids[-1] == eos and eos not in ids[:-1] for ids in docs)  # the EOS string stays text
    decoded = sorted(tok.decode(ids[:-1], skip_special_tokens=False) for ids in docs)
    assert decoded == ["good <|endoftext|> two \x00", "good one"]


def test_strict_fails_on_the_first_bad_record(tmp_path):
    (tmp_path / "bad.jsonl").write_bytes(BAD_LINES)
    result, out = _build(tmp_path, tmp_path / "bad.jsonl", extra=["--strict"])
    assert result.exit_code == 1
    assert _error_lines(result.output) == [
        f"Error: {tmp_path / 'bad.jsonl'}:2: Expecting value: malformed_json (--strict stops at the first bad "
        "record; without it bad records are skipped and counted)"]
    assert not (out / "manifest.json").exists()


def _bad_files(tmp_path):
    good = b'{"text": "fine"}\n' * 3
    files = {
        "trunc.jsonl.gz": (gzip.compress(good * 2000)[:200], "Truncated compressed stream"),
        "gz.jsonl.zst": (gzip.compress(good), "named as zstd but it is gzip data (rename it)"),
        "nocol.parquet": (None, "no column 'text' (columns: body; choose one with --text-field)"),
        "broken.parquet": (b"PAR1 garbage", "Parquet magic bytes not found"),
    }
    for name, (data, _) in files.items():
        d = tmp_path / name.replace(".", "_")
        d.mkdir()
        (d / "ok.jsonl").write_bytes(good)
        if data is None:
            pq.write_table(pa.table({"body": ["x"]}), d / name)
        else:
            (d / name).write_bytes(data)
        yield d, d / name, files[name][1]
    d = tmp_path / "dangling"
    d.mkdir()
    (d / "ok.jsonl").write_bytes(good)
    os.symlink(tmp_path / "absent.jsonl", d / "gone.jsonl")
    yield d, d / "gone.jsonl", "cannot open the file"


def test_bad_files_fail_with_one_line_or_are_skipped(tmp_path):
    n = 0
    for d, bad, cause in _bad_files(tmp_path):
        result, out = _build(d, d)
        assert result.exit_code == 1, (bad, result.output)
        (line,) = _error_lines(result.output)
        assert line.startswith(f"Error: {bad}: ") and cause in line, line
        result, out = _build(d, d, extra=["--on-file-error", "skip"])
        assert result.exit_code == 0, result.output
        assert f"skipped file {bad}: " in result.output and cause in result.output
        totals = read_manifest(out)["totals"]
        assert totals["docs_accepted"] == 3 and [f["path"] for f in totals["files_skipped"]] == [str(bad)]
        n += 1
    assert n == 5


def test_huge_document_skipped_by_max_doc_bytes(tmp_path):
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"text": "before"}\n{"text": "' + b"word " * 600_000 + b'"}\n{"text": "after"}\n')
    result, out = _build(tmp_path, path, extra=["--max-doc-bytes", "1000000"])
    assert result.exit_code == 0, result.output
    assert "2 accepted of 3 read (1 skipped: {'too_large': 1})" in result.output
    assert f"skipped too_large: {path}:2" in result.output
    text = tmp_path / "huge.txt"
    text.write_bytes(b"word " * 600_000)
    result, out = _build(tmp_path, text, extra=["--max-doc-bytes", "1000000", "--overwrite"])
    assert "0 accepted of 1 read (1 skipped: {'too_large': 1})" in result.output


@pytest.mark.slow
def test_hundreds_of_megabytes_on_one_line_stay_bounded(tmp_path):
    """A 300 MB line: skipped by the default --max-doc-bytes with the reader's memory bounded."""
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"text": "before"}\n{"text": "')
        for _ in range(300):
            f.write(b"word " * 200_000)
        f.write(b'"}\n{"text": "after"}\n')
    code = ("import resource, sys; from packer.cli import main\n"
            "try: main(sys.argv[1:])\n"
            "except SystemExit: pass\n"
            "print('maxrss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    proc = subprocess.run([sys.executable, "-c", code, "build", str(path), "--tokenizer", TOKENIZER, "--output",
                           str(tmp_path / "o"), "--workers", "1"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "2 accepted of 3 read (1 skipped: {'too_large': 1})" in proc.stdout, proc.stdout + proc.stderr
    assert int(proc.stdout.split("maxrss_kb")[1]) < 600_000  # far below the 300 MB line held even once twice


def test_every_format_builds_the_same_tokens(tmp_path):
    from test_readers import write_format

    texts = [t for t in sample_texts()[:40] if t.strip()]
    tok = Tokenizer.from_file(TOKENIZER)
    eos = tok.token_to_id("<|endoftext|>")
    expected = sorted(e.ids + [eos] for e in tok.encode_batch(texts, add_special_tokens=False))
    for fmt in ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "arrow", "hf", "txt"):
        d = tmp_path / fmt.replace(".", "_")
        d.mkdir()
        inputs = write_format(d, fmt, texts)
        result, out = _build(d, *inputs, extra=["--context-length", "100000", "--shard-size", "1000000"])
        assert result.exit_code == 0, (fmt, result.output)
        docs = _docs_by_id(out)
        assert sorted(p[0] for p in docs.values()) == expected, fmt


def _unit_files_complete(units_dir: Path):
    names = {p.name for p in units_dir.iterdir()}
    assert not [n for n in names if ".tmp" in n], names
    for n in names:
        if n.endswith(".json"):
            stem = n[: -len(".json")]
            assert {f"{stem}.tokens.npy", f"{stem}.lengths.npy"} <= names
    return sum(n.endswith(".json") for n in names)


def test_ctrl_c_stops_workers_and_leaves_only_complete_units(tmp_path):
    job = tmp_path / "job.toml"
    out = tmp_path / "out"
    inputs = ", ".join(json.dumps(p) for p in SAMPLE_INPUTS)
    job.write_text(f'inputs = [{inputs}]\ntokenizer = "{TOKENIZER}"\noutput = "{out}"\nworkers = 2\n'
                   "[config]\ncontext_length = 512\nunit_bytes = 50000\n")
    # SIGINT back to its default in the child: a test run started in the background (`cmd &` in a
    # script) ignores SIGINT, and an ignored signal is inherited, so the build would never see it
    proc = subprocess.Popen([sys.executable, "-m", "packer", "run", str(job)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    units = out / "_work" / "units"
    deadline = time.time() + 120
    while time.time() < deadline and not (units.is_dir() and any(units.glob("*.json"))):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    output, _ = proc.communicate(timeout=60)  # measured 0.4 s on a busy 2-core machine (2026-11-29)
    assert proc.returncode == 130, output
    assert "interrupted" in output and "Traceback" not in output
    done = _unit_files_complete(units)
    assert 0 < done < 60  # stopped part way (3.2 MB in 50 kB units: 66 units)
    assert not (out / "manifest.json").exists()
    rerun = subprocess.run([sys.executable, "-m", "packer", "run", str(job)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert rerun.returncode == 0, rerun.stderr
    assert read_manifest(out)["totals"]["docs_accepted"] == 3894
