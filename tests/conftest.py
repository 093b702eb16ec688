"""Shared fixtures: the bundled sample corpus, its tokenizer, and one built dataset per session."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"
SAMPLE_INPUTS = (str(SAMPLE / "prose.jsonl"), str(SAMPLE / "code.jsonl"))
TOKENIZER = str(SAMPLE / "tokenizer.json")


@pytest.fixture(autouse=True, scope="session")
def _rule_verdicts_of_this_run(tmp_path_factory):
    """The engine rule's verdicts (packer/encode/engines/rule_verdicts.py) go to this run's own directory,
    not the user's cache: each run checks (S) afresh, and builds in subprocesses inherit it."""
    import os

    before = os.environ.get("PACKER_RULE_CACHE")
    os.environ["PACKER_RULE_CACHE"] = str(tmp_path_factory.mktemp("rule-verdicts"))
    yield
    if before is None:
        del os.environ["PACKER_RULE_CACHE"]
    else:
        os.environ["PACKER_RULE_CACHE"] = before


def undated(page: bytes, engine: bool = False) -> bytes:
    """A report.html without its header's build date (the one line two runs of a build differ in), and
    with engine=True without the encode engine's line (builds with two engines differ there too)."""
    page = re.sub(rb"<dt>built</dt><dd>[^<]*</dd>", b"", page)
    return re.sub(rb"<dt>encode engine</dt><dd>[^<]*</dd>", b"", page) if engine else page


def schema_errors(value) -> list[str]:
    """What in `value` breaks packer/stats/stats_schema.json, one line per problem (jsonschema)."""
    import jsonschema

    from packer.stats.figures import SCHEMA

    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [f"{'.'.join(map(str, e.absolute_path)) or '$'}: {e.message}" for e in validator.iter_errors(value)]


def sample_texts() -> list[str]:
    """Every document of the sample corpus, in build order."""
    texts = []
    for path in SAMPLE_INPUTS:
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f)
    return texts


def build_sample(output, *, workers=1, **config):
    from packer.config import BuildConfig, Job
    from packer.preprocess.pipeline import build

    job = Job(inputs=SAMPLE_INPUTS, tokenizer=TOKENIZER, output=str(output), workers=workers,
              config=BuildConfig(**{"context_length": 1024, **config}))
    return build(job, keep_work=False)


def sample_heads(d: Path, max_bytes: int) -> list[str]:
    """The first lines of each sample input, just over `max_bytes` of them (long code documents
    included), written into d: small inputs that still make several units and shards."""
    paths = []
    for src in SAMPLE_INPUTS:
        kept, size = [], 0
        for line in Path(src).read_text(encoding="utf-8").splitlines(keepends=True):
            if size > max_bytes:
                break
            kept.append(line)
            size += len(line)
        (d / Path(src).name).write_text("".join(kept), encoding="utf-8")
        paths.append(str(d / Path(src).name))
    return paths


def run_packer(args, *, failpoints: str | None = None, timeout: float = 120) -> tuple[int, str]:
    """`python -m packer ARGS` as a process in its own group, with PACKER_FAILPOINTS = `failpoints`
    (a point may SIGKILL it); (exit code, output). The group is killed once it ends, as a batch
    scheduler ending the job would (workers end with their driver anyway), so nothing outlives a test."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    from packer.io import failpoints as points

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(points.ENV, None)
    if failpoints:
        env[points.ENV] = failpoints
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "packer", *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.seek(0)
        return code, log.read()


def build_stream_sample(path, fmt: str):
    """The sample corpus at context 1024 in shards of 200k tokens, Arrow record batches of 20 rows
    (several blocks a shard for the streaming tests in either format)."""
    from packer.store import rows as rows_module

    saved = rows_module.ROWS_PER_BATCH
    rows_module.ROWS_PER_BATCH = 20 if fmt == "arrow" else saved
    try:
        build_sample(path, shard_size=200_000, format=fmt)
    finally:
        rows_module.ROWS_PER_BATCH = saved


@pytest.fixture(scope="session")
def sample_dataset(tmp_path_factory):
    """The sample corpus built once, context 1024, small shards so there are several."""
    out = tmp_path_factory.mktemp("sample") / "ds"
    build_sample(out, workers=2, shard_size=200_000)
    return out


@pytest.fixture(scope="session")
def s3_uri():
    """uri(name) -> an s3:// URI on a local moto S3 server (skipped without moto[server]). The
    credentials travel in the URI, so worker processes started earlier, or by Ray, have them."""
    server_module = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="packer-test")
    # allow_delayed_open: objects under pyarrow's part size go up in one PutObject (moto does not
    # accept pyarrow's CompleteMultipartUpload response handling); every test file is that small.
    query = f"endpoint_override={host}:{port}&scheme=http&region=us-east-1&allow_delayed_open=true"
    yield lambda name: f"s3://testing:testing@packer-test/{name}?{query}"
    server.stop()


@pytest.fixture
def one_torch_thread():
    """Tiny tensors: one thread is ~30x faster than two on a busy 2-core machine. (torch imported
    here, not at the top: tests/test_no_torch.py runs without it.)"""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def reference_ids(tok, texts, bos=None, eos=None):
    out = []
    for e in tok.encode_batch(texts, add_special_tokens=False):
        out.append(([bos] if bos is not None else []) + e.ids + ([eos] if eos is not None else []))
    return out


def attest(d: Path):
    """Make the checksums files and the manifest attest every shard file as it is now (as a writer that
    wrote wrong rows, checksums and all, would): only the row checks behind the checksums can refuse it."""
    import numpy as np

    from packer.store import checksums, formats
    from packer.store.manifest import sha256_file

    manifest = json.loads((d / "manifest.json").read_text())
    for entry in manifest["shards"]:
        files, (sums_name, sums_sha) = formats.data_files(manifest["config"]["format"], entry)
        sums = checksums.read_sums(d / sums_name, sums_sha, len(files))
        fresh = []
        for (name, _), old in zip(files, sums.files):
            data, cuts = (d / name).read_bytes(), old.cuts.tolist()
            digests = [checksums.digest(data[a:b]) for a, b in zip(cuts, cuts[1:])]
            fresh.append(checksums.FileSums(old.first, old.cuts, np.array(digests, np.uint64)))
        (d / sums_name).write_bytes(b"".join(checksums.sums_bytes(sums.rows, fresh)))
        for key in [k for k in entry if k == "file" or k.endswith("_file")]:
            entry[key[: -len("file")] + "sha256"] = sha256_file(d / entry[key])
    (d / "manifest.json").write_text(json.dumps(manifest))
