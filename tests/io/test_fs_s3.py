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
from conftest import SAMPLE_INPUTS, TOKENIZER, build_sample, undated
from pyarrow.fs import S3FileSystem

from packer.io import failpoints, fs
from packer.store.dataset import open_dataset
from packer.store.verify import verify_dataset

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_ARGS = ["--context-length", "1024", "--shard-size", "200000"]  # as conftest's sample_dataset


def _files(loc) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in fs.location(loc).iterdir() if p.name != ".packer-owned.json"}
    manifest = json.loads(files.pop("manifest.json"))
    for key in ("created_unix", "build_seconds"):
        manifest.pop(key)
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    if "report.html" in files:
        files["report.html"] = undated(files["report.html"])
    return files


def _cli_build(uri, kill_at=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(failpoints.ENV, None)
    if kill_at:
        env[failpoints.ENV] = f"{kill_at}=kill"
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
    assert killed.returncode == 1 and "write_shard: a worker process died" in killed.stdout, killed.stdout
    out = fs.location(uri)
    staged = out / "_work" / "dataset"  # the new dataset's files, until it is complete
    assert (staged / "shard-00002.arrow").is_file() and not (out / "manifest.json").exists()
    assert not (out / "_work" / "shards" / "shard-00002.json").exists()
    (staged / "shard-00002.arrow").write_bytes(b"cut short")  # as a partial in-place write would leave it
    resumed = _cli_build(uri)
    assert resumed.returncode == 0, resumed.stdout
    assert "already complete" not in resumed.stdout and "warning: s3://***@packer-test/killed?" in resumed.stdout
    assert "testing:testing" not in killed.stdout + resumed.stdout  # the URI's credentials: never printed
    assert _files(uri) == _files(sample_dataset)


KEY_ID, SECRET = "AKIAPACKERREDACT7", "pAcKeRsEcReT0fThIsTeSt"  # moto takes any credentials


def _with_credentials(uri: str, key_id: str = KEY_ID, secret: str = SECRET) -> str:
    return uri.replace("testing:testing@", f"{key_id}:{secret}@")


def _upload_sample(base: str) -> tuple[list[str], str]:
    """The sample inputs and tokenizer under `base` (a URI): (input URIs, tokenizer URI)."""
    src = fs.location(base)
    for path in (*SAMPLE_INPUTS, TOKENIZER):
        fs.upload(path, src / Path(path).name)
    return [str(src / Path(p).name) for p in SAMPLE_INPUTS], str(src / "tokenizer.json")


def _all_files(loc) -> dict[str, bytes]:
    """Every file under a remote directory, recursively: {relative path: bytes}."""
    from pyarrow.fs import FileSelector, FileType

    loc = fs.location(loc)
    infos = loc.fs.get_file_info(FileSelector(loc.path, recursive=True))
    return {i.path[len(loc.path) + 1:]: loc.fs.open_input_stream(i.path).read() for i in infos if i.type == FileType.File}


def _cli(*args, kill_at=None) -> subprocess.CompletedProcess:
    """`packer ARGS` with stdout and stderr apart; its process group is ended afterwards (a
    killed worker's pool would otherwise hold the pipes open)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(failpoints.ENV, None)
    if kill_at:
        env[failpoints.ENV] = f"{kill_at}=kill"
    cmd = [sys.executable, "-m", "packer", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _leaks(*texts, secrets=(KEY_ID, SECRET)) -> list[str]:
    return [s for s in secrets for t in texts if s in (t if isinstance(t, str) else t.decode("latin-1"))]


def test_credentials_in_uris_are_never_written_or_printed(s3_uri, tmp_path):
    """Inputs, tokenizer and output all on S3 with an access key and secret in each URI: the build
    (packer run, so report.html too, --keep-work, so _work/ too) writes and prints neither."""
    inputs, tokenizer = _upload_sample(_with_credentials(s3_uri("creds/src")))
    output = _with_credentials(s3_uri("creds/ds"))
    pipeline = tmp_path / "job.toml"
    pipeline.write_text(f"inputs = {json.dumps(inputs)}\ntokenizer = {json.dumps(tokenizer)}\n"
                        f"output = {json.dumps(output)}\nworkers = 2\n\n[config]\ncontext_length = 1024\nshard_size = 200000\n")
    run = _cli("run", str(pipeline), "--keep-work")
    assert run.returncode == 0, run.stderr
    assert not _leaks(run.stdout, run.stderr), run.stdout + run.stderr
    assert "report:    s3://***@packer-test/creds/ds/report.html?" in run.stdout  # printed, redacted
    files = _all_files(output)
    assert {"manifest.json", "stats.json", "report.html", "_work/fingerprint.json", "_work/units/unit-000000.json",
            "_work/shards/shard-00000.json"} <= set(files)  # every kind of file a build writes was searched
    assert {name: _leaks(data) for name, data in files.items() if _leaks(data)} == {}
    manifest = json.loads(files["manifest.json"])
    query = output.split("?", 1)[1]
    assert manifest["inputs"][0]["path"] == f"s3://***@packer-test/creds/src/prose.jsonl?{query}"
    assert manifest["tokenizer"]["path"] == f"s3://***@packer-test/creds/src/tokenizer.json?{query}"
    assert KEY_ID in output and verify_dataset(output)["sequences"] == 740  # the credentials did open it
    for command in (["verify", output], ["inspect", output], ["stats", output]):
        shown = _cli(*command)
        assert shown.returncode == 0 and not _leaks(shown.stdout, shown.stderr), (command, shown.stdout, shown.stderr)


def test_resume_accepts_new_credentials_and_refuses_other_inputs(s3_uri):
    """The fingerprint holds the inputs redacted: the same data under a rotated key resumes the
    unfinished build; other inputs are refused, and the refusal names no credential."""
    inputs, tokenizer = _upload_sample(_with_credentials(s3_uri("rotate/src")))
    rotated = [_with_credentials(i, "AKIAROTATED", "r0tAtEdSeCrEt") for i in inputs]
    output = _with_credentials(s3_uri("rotate/ds"))
    args = ["--tokenizer", tokenizer, "--output", output, *SAMPLE_ARGS, "--workers", "2"]
    killed = _cli("build", *inputs, *args, kill_at="write-shard:2")  # a worker dies mid-build
    assert killed.returncode == 1 and not (fs.location(output) / "manifest.json").exists(), killed.stderr
    secrets = (KEY_ID, SECRET, "AKIAROTATED", "r0tAtEdSeCrEt")
    assert not _leaks(killed.stdout, killed.stderr, secrets=secrets), killed.stderr
    other = _cli("build", rotated[0], *args)
    assert other.returncode == 1 and "belongs to an unfinished build with other settings or inputs" in other.stderr
    assert "s3://***@packer-test/rotate/src/" in other.stderr and not _leaks(other.stdout, other.stderr, secrets=secrets)
    resumed = _cli("build", *rotated, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "already complete" not in resumed.stdout and not _leaks(resumed.stdout, resumed.stderr, secrets=secrets)
    assert _files(output)["manifest.json"] and verify_dataset(output)["sequences"] == 740
    again = _cli("build", *[_with_credentials(i, "AKIATHIRD", "tHiRdSeCrEt") for i in inputs], *args)
    assert again.returncode == 0 and "dataset already complete" in again.stdout  # a complete one: same answer


def test_errors_under_credentialed_uris_name_no_credentials(s3_uri, tmp_path):
    inputs, tokenizer = _upload_sample(_with_credentials(s3_uri("errors/src")))
    output = _with_credentials(s3_uri("errors/ds"))
    missing = _with_credentials(s3_uri("errors/src/nothing-here.jsonl"))
    for args, message in [
        ([missing, "--tokenizer", tokenizer], "input not found: s3://***@packer-test/errors/src/nothing-here.jsonl?"),
        ([*inputs, "--tokenizer", missing.replace(".jsonl", ".json")], "tokenizer not found: s3://***@packer-test/"),
    ]:
        failed = _cli("build", *args, "--output", output, "--workers", "1")
        assert failed.returncode == 1 and message in failed.stderr, failed.stderr
        assert not _leaks(failed.stdout, failed.stderr), failed.stderr
    (tmp_path / "bad.jsonl").write_text('{"text": "one"}\n{"text": \n', encoding="utf-8")  # a malformed record
    bad = str(fs.location(_with_credentials(s3_uri("errors/bad"))) / "bad.jsonl")
    fs.upload(tmp_path / "bad.jsonl", fs.location(bad))
    strict = _cli("build", bad, "--tokenizer", tokenizer, "--output", output, "--workers", "1", "--strict")
    assert strict.returncode == 1 and "malformed_json" in strict.stderr and "s3://***@packer-test/errors/bad" in strict.stderr
    assert not _leaks(strict.stdout, strict.stderr), strict.stderr
