"""Builds into S3 (conftest's local moto server, pyarrow's real S3 client): worker processes
write in place with no rename, a SIGKILLed build resumes from its markers, the bytes equal local."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pyarrow.fs import S3FileSystem

from conftest import SAMPLE_INPUTS, TOKENIZER, build_sample
from packer import fs
from packer.shards import open_dataset
from packer.verify import verify_dataset

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_ARGS = ["--context-length", "1024", "--shard-size", "200000"]  # as conftest's sample_dataset


def _files(loc) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in fs.location(loc).iterdir()}
    manifest = json.loads(files.pop("manifest.json"))
    for key in ("created_unix", "build_seconds"):
        manifest.pop(key)
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


def _cli_build(uri, kill_at=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PACKER_TEST_KILL_AT", None)
    if kill_at:
        env["PACKER_TEST_KILL_AT"] = kill_at
    cmd = [sys.executable, "-m", "packer", "build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--output", uri,
           *SAMPLE_ARGS, "--workers", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        try:  # a killed driver leaves its pool workers waiting: end them
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def test_s3_build_with_worker_processes_equals_local(s3_uri, sample_dataset):
    uri = s3_uri("two-workers")
    with pytest.warns(UserWarning, match="without locks"):
        build_sample(uri, workers=2, shard_size=200_000)
    assert isinstance(fs.location(uri).fs, S3FileSystem)
    assert _files(uri) == _files(sample_dataset)  # _work deleted, no lock, no temporary file
    ds, ref = open_dataset(uri), open_dataset(sample_dataset)
    assert len(ds) == len(ref) and all((ds[i][0] == ref[i][0]).all() for i in range(0, len(ds), 37))
    assert verify_dataset(uri)["sequences"] == len(ref)


def test_s3_build_killed_after_a_shard_upload_resumes_to_identical_bytes(s3_uri, sample_dataset):
    """The worker writing shard 2 is SIGKILLed after its file is uploaded under the final name,
    before its marker; the file is then cut short. The rerun must not trust a file without its
    marker, and must end identical."""
    uri = s3_uri("killed")
    killed = _cli_build(uri, kill_at="write-shard:2")
    assert killed.returncode == 1 and "BrokenProcessPool: write_shard" in killed.stdout, killed.stdout
    out = fs.location(uri)
    assert (out / "shard-00002.arrow").is_file() and not (out / "manifest.json").exists()
    assert not (out / "_work" / "shards" / "shard-00002.json").exists()
    (out / "shard-00002.arrow").write_bytes(b"cut short")  # as a partial in-place write would leave it
    resumed = _cli_build(uri)
    assert resumed.returncode == 0, resumed.stdout
    assert "already complete" not in resumed.stdout and "warning: s3://***@packer-test/killed?" in resumed.stdout
    assert "testing:testing" not in killed.stdout + resumed.stdout  # the URI's credentials: never printed
    assert _files(uri) == _files(sample_dataset)
