"""Crash safety: real `packer build` processes SIGKILLed at chosen points, then the same command
again, must give the bytes of an uninterrupted run; a live lock refuses, a dead one is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TOKENIZER, run_packer, sample_heads, undated

from packer.config import BuildConfig, Job
from packer.preprocess import owned
from packer.preprocess.pipeline import build

ROOT = Path(__file__).resolve().parents[2]
TIMESTAMPS = ("created_unix", "build_seconds")


@pytest.fixture(scope="module")
def small_inputs(tmp_path_factory):
    """About 100 kB of each sample file (long code documents included): two units, a dozen
    shards, quick to build."""
    return sample_heads(tmp_path_factory.mktemp("inputs"), 100_000)


def _run(inputs, out, workers, fmt="arrow", kill_at=None):
    args = ["build", *inputs, "--tokenizer", TOKENIZER, "--output", str(out), "--context-length", "256",
            "--shard-size", "8000", "--workers", str(workers), "--format", fmt]
    code, output = run_packer(args, failpoints=f"{kill_at}=kill" if kill_at else None)
    return subprocess.CompletedProcess(args, code, output)


def _snapshot(out: Path) -> dict:
    """Every file's bytes; the manifest without its timestamps, packer's record of its files
    without their modification times (and the manifest's sha256, which the timestamps change)."""
    files = {}
    for p in sorted(out.rglob("*")):
        if p.is_file():
            files[str(p.relative_to(out))] = p.read_bytes()
    manifest = json.loads(files.pop("manifest.json"))
    for key in TIMESTAMPS:
        manifest.pop(key)
    files["manifest.json"] = json.dumps(manifest, indent=2).encode()
    if "report.html" in files:
        files["report.html"] = undated(files["report.html"])
    record = json.loads(files.pop(owned.RECORD))
    for name, entry in record["files"].items():
        entry.pop("mtime_ns")
        if name in ("manifest.json", "report.html"):  # their timestamps / the page's date change them
            del entry["sha256"], entry["bytes"]
    files[owned.RECORD] = json.dumps(record, indent=2).encode()
    return files


class _References(dict):
    """Uninterrupted builds with one worker (the killed runs use two), made on first use."""

    def __init__(self, inputs, root):
        super().__init__()
        self.inputs, self.root = inputs, root

    def __missing__(self, fmt):
        out = self.root / fmt
        result = _run(self.inputs, out, workers=1, fmt=fmt)
        assert result.returncode == 0, result.stdout
        snap = self[fmt] = _snapshot(out)
        assert len([f for f in snap if f.startswith("shard-")]) >= (6 if fmt == "arrow" else 12)
        return snap


@pytest.fixture(scope="module")
def reference(small_inputs, tmp_path_factory):
    return _References(small_inputs, tmp_path_factory.mktemp("ref"))


def _kill_then_resume(small_inputs, reference, tmp_path, kill_at, workers, fmt):
    out = tmp_path / "ds"
    killed = _run(small_inputs, out, workers, fmt, kill_at=kill_at)
    # the driver dies by SIGKILL; a killed worker makes the driver fail with one line naming the task
    assert killed.returncode in (-signal.SIGKILL, 1), killed.stdout
    if killed.returncode == 1:
        assert "a worker process died" in killed.stdout and "Traceback" not in killed.stdout, killed.stdout
    assert not (out / "manifest.json").exists() and (out / "_work").is_dir()
    resumed = _run(small_inputs, out, workers, fmt)
    assert resumed.returncode == 0, resumed.stdout
    assert "already complete" not in resumed.stdout
    snap = _snapshot(out)
    assert sorted(snap) == sorted(reference[fmt])  # no _work, no lock, no temporary file left
    for name, data in reference[fmt].items():
        assert snap[name] == data, name


@pytest.mark.parametrize(
    "kill_at, workers, fmt",
    [
        ("tokenize:1", 1, "arrow"),  # driver, after the first unit (of two)
        ("write-shard:4", 2, "arrow"),  # a worker, between its temporary file and the rename
    ],
)
def test_killed_build_resumes_to_identical_bytes(small_inputs, reference, tmp_path, kill_at, workers, fmt):
    _kill_then_resume(small_inputs, reference, tmp_path, kill_at, workers, fmt)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at, workers, fmt",
    [("write:3", 2, "memmap"), ("unit:1", 2, "memmap"), ("plan:0", 2, "arrow"), ("finalize:0", 1, "memmap"),
     ("write-shard:0", 1, "memmap"), ("tokenize:1", 1, "memmap")],
)
def test_killed_build_resumes_more_points(small_inputs, reference, tmp_path, kill_at, workers, fmt):
    _kill_then_resume(small_inputs, reference, tmp_path, kill_at, workers, fmt)


def test_rerun_of_a_complete_build_does_nothing(small_inputs, tmp_path):
    out = tmp_path / "ds"
    job = Job(inputs=tuple(small_inputs), tokenizer=TOKENIZER, output=str(out), workers=1,
              config=BuildConfig(context_length=256))
    assert "already_complete" not in build(job)
    before = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    assert build(Job(**{**job.__dict__, "workers": 2}))["already_complete"]
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_live_lock_refuses_and_dead_lock_is_taken_over(small_inputs, tmp_path):
    out = tmp_path / "ds"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from packer.io import lock; import time\nwith lock.hold({str(out)!r}):\n"
         "    print('locked', flush=True); time.sleep(120)"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        job = Job(inputs=tuple(small_inputs), tokenizer=TOKENIZER, output=str(out), workers=1,
                  config=BuildConfig(context_length=256))
        with pytest.raises(ValueError, match=f"another packer process \\(pid {holder.pid} "):
            build(job)
    finally:
        holder.kill()
        holder.wait()
    assert (out / ".packer.lock").read_text().split()[0] == str(holder.pid)  # stale, left behind
    manifest = build(job)
    assert manifest["totals"]["sequences"] > 0 and not (out / ".packer.lock").exists()
