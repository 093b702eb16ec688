"""Builds whose output is a URI: file:// takes the local path; a filesystem that is not local
(fsspec's memory://, no rename) gives the same bytes, resumes from its markers, and reads back."""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("fsspec")

from conftest import SAMPLE_INPUTS, TOKENIZER, build_sample, undated  # noqa: E402

from packer.cli import main  # noqa: E402
from packer.config import BuildConfig, Job  # noqa: E402
from packer.io import atomic, failpoints, fs  # noqa: E402
from packer.io.lock import UnlockedOutputWarning  # noqa: E402
from packer.preprocess.pipeline import build  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.store.verify import verify_dataset  # noqa: E402

TIMESTAMPS = ("created_unix", "build_seconds")
SAMPLE = {"shard_size": 200_000}  # as conftest's sample_dataset: 2 units, 4 shards


def _files(loc) -> dict[str, bytes]:
    """Every file of a dataset directory (local or remote, not recursive); manifest without timestamps;
    not packer's record of its files (it holds their modification times)."""
    files = {p.name: p.read_bytes() for p in fs.location(loc).iterdir() if p.name != ".packer-owned.json"}
    manifest = json.loads(files.pop("manifest.json"))
    for key in TIMESTAMPS:
        manifest.pop(key)
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    if "report.html" in files:
        files["report.html"] = undated(files["report.html"])
    return files


@pytest.fixture
def memory_uri():
    """A fresh memory:// directory, deleted afterwards (the store lives as long as the process)."""
    uri = f"memory://packer-test-{uuid.uuid4().hex}/ds"
    yield uri
    root = fs.location(uri).parent
    if root.exists():
        fs.rmtree(root)


@pytest.fixture(scope="module")
def local_memmap(tmp_path_factory):
    out = tmp_path_factory.mktemp("memmap") / "ds"
    build_sample(out, workers=1, format="memmap", **SAMPLE)
    return _files(out)


def _build_remote(uri, fmt: str, keep_work: bool = False) -> dict:
    job = Job(inputs=SAMPLE_INPUTS, tokenizer=TOKENIZER, output=uri, workers=1,
              config=BuildConfig(context_length=1024, format=fmt, **SAMPLE))
    with pytest.warns(UnlockedOutputWarning, match="without locks.*one build at a time"):
        return build(job, keep_work=keep_work)


def test_location_resolves_paths_and_uris(tmp_path):
    assert fs.location(str(tmp_path)) == tmp_path
    assert fs.location(f"file://{tmp_path}") == tmp_path  # a local filesystem: the fast path
    remote = fs.location("memory://bucket/ds")
    assert isinstance(remote, fs.RemotePath) and remote.path == "/bucket/ds"
    child = remote / "_work" / "units"
    assert (str(child), child.path, child.name, str(child.parent)) == (
        "memory://bucket/ds/_work/units", "/bucket/ds/_work/units", "units", "memory://bucket/ds/_work")
    # a query stays at the end when joining
    s3 = fs.RemotePath("s3://b/ds?region=eu-west-1", None, "b/ds")
    assert (str(s3 / "a.json"), (s3 / "a.json").path) == ("s3://b/ds/a.json?region=eu-west-1", "b/ds/a.json")
    assert (str((s3 / "a.json").parent), (s3 / "a.json").suffix) == ("s3://b/ds?region=eu-west-1", ".json")
    assert pickle.loads(pickle.dumps(child)) == child
    with pytest.raises(ValueError, match=r"^cannot open nosuchscheme://x: .*give a local path"):
        fs.location("nosuchscheme://x")


def test_remote_path_calls(memory_uri):
    d = fs.location(memory_uri)
    assert not d.exists()
    (d / "sub").mkdir(parents=True)
    atomic.write_json(d / "a.json", {"x": 1})
    atomic.save_npz(d / "p.npz", a=np.arange(3))
    assert [p.name for p in d.iterdir()] == ["a.json", "p.npz", "sub"]
    assert d.is_dir() and (d / "a.json").is_file() and not (d / "sub").is_file()
    assert json.loads((d / "a.json").read_text()) == {"x": 1}
    with np.load(fs.for_numpy(d / "p.npz")) as z:
        assert z["a"].tolist() == [0, 1, 2]
    assert atomic.remove_leftovers(d) == 0
    (d / "a.json").unlink()
    (d / "a.json").unlink(missing_ok=True)
    with pytest.raises(FileExistsError):
        (d / "sub").mkdir()
    fs.rmtree(d / "sub")
    assert [p.name for p in d.iterdir()] == ["p.npz"]


@pytest.fixture(params=["local", "memory"])
def place_dir(request, tmp_path, memory_uri):
    """An empty directory as a place: a local Path, or a RemotePath on memory://."""
    if request.param == "local":
        return fs.location(str(tmp_path / "p"))
    return fs.location(memory_uri)


def test_reading_places_is_the_same_on_every_filesystem(place_dir):
    """The calls readers make: size, open("rb") (seek, read), open_stream (plain, gzip, zstd)."""
    import gzip

    data = b"".join(b"line %d\n" % i for i in range(5000))
    place_dir.mkdir(parents=True, exist_ok=True)
    for name, content in (("a.txt", data), ("a.txt.gz", gzip.compress(data)), ("a.txt.zst", _zstd(data))):
        _put(place_dir / name, content)
    assert fs.size(place_dir / "a.txt") == len(data)
    with (place_dir / "a.txt").open("rb") as f:
        f.seek(7)
        assert f.read(8) == data[7:15] and f.tell() == 15
    with fs.open_stream(place_dir / "a.txt") as f:
        assert f.read() == data
    for name, codec in (("a.txt.gz", "gzip"), ("a.txt.zst", "zstd")):
        with fs.open_stream(place_dir / name, codec) as f:
            assert f.read() == data, codec
    with pytest.raises(FileNotFoundError):
        fs.size(place_dir / "missing.txt")
    if isinstance(place_dir, fs.RemotePath):
        with pytest.raises(ValueError, match="reads only"):
            (place_dir / "a.txt").open("wb")


def _put(place, content: bytes):
    """The bytes as they are: RemotePath.write_bytes would compress a name ending .gz/.zst again
    (pyarrow's open_output_stream detects compression from the name)."""
    if isinstance(place, fs.RemotePath):
        with place.fs.open_output_stream(place.path, compression=None) as f:
            f.write(content)
    else:
        place.write_bytes(content)


def _zstd(data: bytes) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as f:
        f.write(data)
    return sink.getvalue().to_pybytes()


def test_list_dir_names_kinds_and_identities(place_dir):
    place_dir.mkdir(parents=True, exist_ok=True)
    (place_dir / "sub").mkdir()
    (place_dir / "sub" / "x.jsonl").write_bytes(b"{}")
    (place_dir / "a.jsonl").write_bytes(b"{}")
    entries = sorted(fs.list_dir(place_dir))
    assert [(name, is_dir) for name, is_dir, _ in entries] == [("a.jsonl", False), ("sub", True)]
    assert entries[0][2] is None and entries[1][2] == fs.identity(place_dir / "sub") != fs.identity(place_dir)
    assert [name for name, _, _ in fs.list_dir(place_dir / "sub")] == ["x.jsonl"]


def test_a_symlinked_directory_has_its_targets_identity(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "back").symlink_to(tmp_path)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    entries = {name: (is_dir, identity) for name, is_dir, identity in fs.list_dir(fs.location(str(tmp_path / "real")))}
    assert entries == {"back": (True, fs.identity(tmp_path))}
    assert dict((n, d) for n, d, _ in fs.list_dir(tmp_path))["dangling"] is False  # a file: opening it says why


def test_file_uri_output_equals_local(tmp_path, sample_dataset):
    out = tmp_path / "ds"
    build_sample(f"file://{out}", workers=2, **SAMPLE)
    assert (out / "manifest.json").is_file()
    assert _files(out) == _files(sample_dataset)


@pytest.mark.parametrize("fmt", ["arrow", "memmap"])
def test_remote_build_is_byte_identical_to_local(memory_uri, fmt, sample_dataset, local_memmap):
    manifest = _build_remote(memory_uri, fmt)
    assert len(manifest["shards"]) == 4
    local = _files(sample_dataset) if fmt == "arrow" else local_memmap
    assert _files(memory_uri) == local  # no _work, no lock file, no temporary file left
    ds, ref = open_dataset(memory_uri), open_dataset(sample_dataset)
    assert len(ds) == len(ref) == manifest["totals"]["sequences"]
    for i in (0, 1, len(ds) // 2, len(ds) - 1):
        assert np.array_equal(ds[i][0], ref[i][0]) and np.array_equal(ds[i][1], ref[i][1])
    assert verify_dataset(memory_uri)["tokens"] == manifest["totals"]["tokens_out"]


def test_remote_build_resumes_from_its_markers(memory_uri, local_memmap, monkeypatch):
    """Killed after 2 of 4 shards, with what an in-place write cut short leaves behind: a unit
    and a shard file without their markers. The rerun redoes exactly those and matches local."""

    def killed(stage, n):
        if (stage, n) == ("write", 2):
            raise KeyboardInterrupt

    monkeypatch.setattr(failpoints, "hit", killed)
    with pytest.raises(KeyboardInterrupt):
        _build_remote(memory_uri, "memmap")
    monkeypatch.undo()
    out = fs.location(memory_uri)
    work = out / "_work"
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in (work / "shards").iterdir()) == ["shard-00000.json", "shard-00001.json"]
    (work / "units" / "unit-000001.json").unlink()  # its data files stay, now without a marker
    (work / "units" / "unit-000001.tokens.npy").write_bytes(b"\x93NUMPY cut short")
    (work / "dataset" / "shard-00002.bin").write_bytes(b"half a shard")  # written in place, never marked done
    (work / "shards" / "shard-00001.json").unlink()  # shard 1's files stay, its marker is gone
    manifest = _build_remote(memory_uri, "memmap")
    assert "already_complete" not in manifest
    assert _files(memory_uri) == local_memmap


def test_cli_build_verify_inspect_stats_on_a_uri(memory_uri):
    runner = CliRunner()
    result = runner.invoke(main, ["build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--output", memory_uri,
                                  "--context-length", "1024", "--shard-size", "200000", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert f"warning: {memory_uri} is on a filesystem without locks" in result.output  # one line, no traceback
    result = runner.invoke(main, ["verify", memory_uri])
    assert result.exit_code == 0 and result.output.startswith("ok: 740 sequences"), result.output
    result = runner.invoke(main, ["inspect", memory_uri, "--seq", "0"])
    assert result.exit_code == 0 and "──── document 0" in result.output, result.output
    assert "\ufffd" not in result.output  # decoded with the dataset's own tokenizer copy
    result = runner.invoke(main, ["inspect", memory_uri, "--json"])  # the raw manifest
    assert result.exit_code == 0 and '"context_length": 1024' in result.output
    result = runner.invoke(main, ["stats", memory_uri])
    assert result.exit_code == 0 and "packed" in result.output.lower(), result.output
    shard = fs.location(memory_uri) / "shard-00002.arrow"
    intact = shard.read_bytes()
    shard.write_bytes(intact[:-100])
    result = runner.invoke(main, ["verify", memory_uri])
    assert result.exit_code == 1 and "shard-00002.arrow: sha256 does not match" in result.output
    rebuild = ["build", SAMPLE_INPUTS[0], "--tokenizer", TOKENIZER, "--output", memory_uri, "--workers", "1"]
    result = runner.invoke(main, [*rebuild, "--overwrite"])  # a changed shard is no longer packer's: kept
    assert result.exit_code == 1 and "holds files packer did not write (shard-00002.arrow)" in result.output
    shard.write_bytes(intact)
    result = runner.invoke(main, rebuild)
    assert result.exit_code == 1 and "already holds a complete dataset built differently" in result.output
    result = runner.invoke(main, [*rebuild, "--overwrite"])
    assert result.exit_code == 0 and "shards:    1 in memory://" in result.output, result.output
    assert sorted(p.name for p in fs.location(memory_uri).iterdir()) == [
        ".packer-owned.json", "dataset_info.json", "manifest.json", "report.html", "shard-00000.arrow", "shard-00000.sums",
        "state.json", "stats.json", "tokenizer.json"]  # the old shards are gone
    assert runner.invoke(main, ["verify", memory_uri]).exit_code == 0


def test_remote_output_with_foreign_files_is_refused(memory_uri):
    (fs.location(memory_uri) / "notes.txt").write_bytes(b"mine")
    job = Job(inputs=SAMPLE_INPUTS, tokenizer=TOKENIZER, output=memory_uri, workers=1)
    with pytest.warns(UnlockedOutputWarning), pytest.raises(ValueError, match=r"holds files packer did not write \(notes.txt\)"):
        build(job)
    assert [p.name for p in fs.location(memory_uri).iterdir()] == ["notes.txt"]


def test_process_local_output_refuses_worker_processes(memory_uri):
    job = Job(inputs=SAMPLE_INPUTS, tokenizer=TOKENIZER, output=memory_uri, workers=2)
    with pytest.raises(ValueError, match="worker processes do not share; use --workers 1"):
        build(job)
    assert not Path("memory:").exists()


def test_inputs_tokenizer_and_output_all_remote(memory_uri, sample_dataset):
    """No shared mount at all: every path of the job is a URI; the shards are the local ones."""
    src = fs.location(memory_uri).parent / "src"
    for path in (*SAMPLE_INPUTS, TOKENIZER):
        (src / Path(path).name).write_bytes(Path(path).read_bytes())
    job = Job(inputs=tuple(f"{src}/{Path(p).name}" for p in SAMPLE_INPUTS), tokenizer=str(src),  # a directory
              output=memory_uri, workers=1, config=BuildConfig(context_length=1024, **SAMPLE))
    with pytest.warns(UnlockedOutputWarning):
        manifest = build(job)
    assert manifest["tokenizer"]["path"] == f"{src}/tokenizer.json"
    assert manifest["inputs"][0]["path"].startswith("memory://")
    local, remote = _files(sample_dataset), _files(memory_uri)
    assert sorted(local) == sorted(remote)
    for name in local:
        if name.startswith("shard-") or name == "tokenizer.json":
            assert remote[name] == local[name], name
    ref = json.loads(local["manifest.json"])
    got = json.loads(remote["manifest.json"])
    assert (got["shards"], got["totals"], got["tokenizer"]["sha256"]) == (ref["shards"], ref["totals"], ref["tokenizer"]["sha256"])


@pytest.mark.parametrize("given, shown", [
    ("s3://AKIAX:s3cr3t@bucket/ds?region=us-east-1", "s3://***@bucket/ds?region=us-east-1"),
    ("s3://AKIAX@bucket/ds", "s3://***@bucket/ds"),  # an access key alone is still a credential
    ("s3://bucket/ds?endpoint_override=127.0.0.1:9000&scheme=http", None),  # nothing secret
    ("abfs://acct:k3y@container/dir/f.jsonl", "abfs://***@container/dir/f.jsonl"),
    ("abfs://container@acct.dfs.core.windows.net/dir", None),  # a bare name there is the container
    ("abfss://acct.blob.core.windows.net/c/x?sv=2024-01-01&sig=aB%2Fc%3D&se=2030",
     "abfss://acct.blob.core.windows.net/c/x?sv=2024-01-01&sig=***&se=2030"),  # the SAS token's secret
    ("abfs://c@acct.dfs.core.windows.net/x?tenant_id=t&client_id=i&client_secret=s3cr3t",
     "abfs://c@acct.dfs.core.windows.net/x?tenant_id=t&client_id=i&client_secret=***"),
    ("hdfs://nn:8020/data?user=me&fs.s3a.secret.key=s3cr3t&hadoop.ssl.keystore.password=pw&replication=2",
     "hdfs://nn:8020/data?user=me&fs.s3a.secret.key=***&hadoop.ssl.keystore.password=***&replication=2"),
    ("https://host/f.jsonl?token=s3cr3t#part", "https://host/f.jsonl?token=***#part"),
    ("ftp://me:pw@host:21/dir/f.txt", "ftp://***@host:21/dir/f.txt"),
    ("gs://bucket/ds", None),
    ("memory://bucket/ds", None),
    ("file:///data/ds", None),
    ("out/ds", None),
    ("/abs/path with spaces/a@b:c.jsonl", None),  # a local path is never rewritten, even with @ and :
])
def test_redact(given, shown):
    shown = shown or given
    assert fs.redact(given) == shown
    assert fs.redact(shown) == shown  # idempotent: a redacted form is its own redaction
    assert fs.redact(Path("out/ds")) == "out/ds"


def test_redact_text_and_remote_paths_keep_credentials_only_where_they_open_things(memory_uri):
    text = "error: 's3://AK:s3cr3t@b/x?region=r' and (hdfs://nn/p?password=pw), then a/local:path"
    assert fs.redact_text(text) == "error: 's3://***@b/x?region=r' and (hdfs://nn/p?password=***), then a/local:path"
    assert fs.redact_json({"path": "s3://AK:s3cr3t@b/x", "n": [1, "abfs://h/c?sig=S"]}) == {
        "path": "s3://***@b/x", "n": [1, "abfs://h/c?sig=***"]}
    loc = fs.location(memory_uri)
    assert str(loc) == memory_uri and pickle.loads(pickle.dumps(loc)) == loc  # the real URI re-opens it
    remote = fs.RemotePath("s3://AK:s3cr3t@b/ds?region=r", None, "b/ds")
    assert str(remote / "x") == "s3://AK:s3cr3t@b/ds/x?region=r"  # what workers re-resolve
    assert repr(remote / "x") == "RemotePath('s3://***@b/ds/x?region=r')" and fs.redact(remote) == "s3://***@b/ds?region=r"


def test_remote_unit_spool_leaves_nothing_when_its_process_dies(tmp_path):
    """A unit bound for a remote location is spooled in a nameless temporary file: a worker killed
    before the upload leaves nothing in the local temp directory."""
    import os
    import subprocess
    import sys

    spool_dir = tmp_path / "tmp"
    spool_dir.mkdir()
    code = ("import os, numpy as np\nfrom packer.io import fs\nfrom packer.preprocess.tokenize import _NpyAppender\n"
            f"f = _NpyAppender(fs.location('memory://{uuid.uuid4().hex}/unit.tokens.npy'), np.uint16)\n"
            "f.append(np.arange(100000, dtype=np.uint16))\n"
            "print(len(os.listdir(os.environ['TMPDIR'])), flush=True)\n"
            "os._exit(9)  # killed before commit\n")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "TMPDIR": str(spool_dir), "PYTHONPATH": str(root)})
    assert result.returncode == 9, result.stderr
    assert result.stdout.strip() == "0"  # no name even while it was being written
    assert list(spool_dir.iterdir()) == []
