"""The Ray executor on a local Ray instance this file starts and stops: same bytes as local,
worker deaths retried, persistent failures named, nothing left running."""

from __future__ import annotations

import json
import os
import pkgutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray")

from conftest import SAMPLE_INPUTS, TOKENIZER  # noqa: E402

from packer.cli import main  # noqa: E402
from packer.config import BuildConfig, Job  # noqa: E402
from packer.encode.tokenizer import tokenizer_info  # noqa: E402
from packer.io import failpoints  # noqa: E402
from packer.preprocess import executors  # noqa: E402
from packer.preprocess.executors import RayExecutor  # noqa: E402
from packer.preprocess.pipeline import build  # noqa: E402
from packer.preprocess.readers import Unit  # noqa: E402
from packer.preprocess.tokenize import tokenize_unit  # noqa: E402
from packer.preprocess.writer import write_shard  # noqa: E402

CONFIG = BuildConfig(context_length=1024, shard_size=200_000)  # as conftest's sample_dataset: 2 units, 4 shards
VOLATILE = ("created_unix", "build_seconds")


def _ray_descendants() -> list[str]:
    """Command lines of Ray processes below this one (GCS, raylet, workers, agents)."""
    ray_dir = os.path.dirname(ray.__file__) + os.sep
    parent, cmd = {}, {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            argv = open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace").split("\0")
        except (OSError, IndexError, ValueError):
            continue
        parent[int(p)], cmd[int(p)] = ppid, argv
    found = []
    for p in parent:
        q = p
        while q in parent and q > 1:
            q = parent[q]
            if q == os.getpid():
                # The program, not its arguments: a forkserver's arguments hold Ray's sys.path too.
                if cmd[p][0].startswith("ray::") or any(a.startswith(ray_dir) for a in cmd[p][:3]):
                    found.append(" ".join(cmd[p])[:120])
                break
    return found


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray instance with 2 CPUs, never an existing cluster; no test may hang on it."""
    stall = pytest.MonkeyPatch()
    stall.setattr(executors, "RAY_STALL_SECONDS", 300)
    if ray.is_initialized():
        pytest.skip("a Ray session is already open in this process")
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20,
             log_to_driver=False)
    assert _ray_descendants(), "ray.init started no local processes"
    yield
    stall.undo()
    ray.shutdown()
    deadline = time.time() + 10
    while _ray_descendants() and time.time() < deadline:
        time.sleep(0.2)
    assert _ray_descendants() == []  # nothing left running


def _build(out, executor: str, workers: int = 2) -> dict:
    job = Job(inputs=SAMPLE_INPUTS, tokenizer=TOKENIZER, output=str(out), config=CONFIG,
              workers=workers, executor=executor)
    return build(job)


def _files(path) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != ".packer-owned.json"}  # holds mtimes
    manifest = json.loads(files.pop("manifest.json"))
    for key in VOLATILE:
        manifest.pop(key)
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


@pytest.fixture(scope="module")
def local_files(sample_dataset):
    """The sample corpus built by the local executor (2 workers), as {file name: bytes}."""
    files = _files(sample_dataset)
    assert sum(name.startswith("shard-") and name.endswith(".arrow") for name in files) == 4  # (and their .sums)
    return files


def test_tasks_import_this_checkout_and_run_in_the_driver_directory(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ex = RayExecutor()
    try:
        assert ex.max_in_flight == 4  # 2x the session's 2 CPUs
        import packer

        # Stdlib functions, so the workers need not import this test file.
        assert ex.map(pkgutil.resolve_name, [("packer:__file__",)] * 2) == [packer.__file__] * 2
        assert ex.map(os.getcwd, [()] * 2) == [str(tmp_path)] * 2
    finally:
        ex.close()
    one = RayExecutor(n_workers=1)  # one task in flight at a time: still every result, in order
    seen = []
    assert one.map(pow, [(2, k) for k in range(5)], on_done=seen.append) == [1, 2, 4, 8, 16]
    assert one.max_in_flight == 1 and seen == [1, 2, 4, 8, 16]
    one.close()
    assert ray.is_initialized()  # a session the executor did not start is left open


def test_ray_build_is_byte_identical_to_local(ray_session, tmp_path, local_files):
    """Through the CLI, as a user runs it: `packer build ... --executor ray`."""
    result = CliRunner().invoke(main, [
        "build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "ray"),
        "--context-length", "1024", "--shard-size", "200000", "--executor", "ray",
    ])
    assert result.exit_code == 0, result.output
    assert "3,894 accepted of 3,894 read" in result.output
    assert _files(tmp_path / "ray") == local_files


def test_ray_build_into_s3_is_byte_identical_to_local(ray_session, s3_uri, local_files):
    """Tasks resolve the URI themselves, write in place (no rename) and gather by ranged reads."""
    from packer.io import fs

    uri = s3_uri("ray")
    with pytest.warns(UserWarning, match="without locks"):
        _build(uri, "ray")
    assert _files(fs.location(uri)) == local_files  # no _work, no lock, no temporary file left


def test_killed_workers_are_retried_and_output_is_identical(ray_session, tmp_path, local_files, monkeypatch):
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv(failpoints.ENV, f"once={markers},unit:1=exit,shard:2=exit")
    _build(tmp_path / "ray", "ray")
    # Each target's first attempt created its marker and died; the retry did the work.
    assert sorted(p.name for p in markers.iterdir()) == ["shard-2", "unit-1"]
    assert _files(tmp_path / "ray") == local_files


def test_a_worker_that_always_dies_fails_naming_the_shard(ray_session, monkeypatch):
    monkeypatch.setenv(failpoints.ENV, "shard:7=exit")  # dies as it starts, before reading its arguments
    ex = RayExecutor(max_retries=1)
    try:
        with pytest.raises(RuntimeError, match=r"write_shard, shard 7: the Ray task failed on all 2 attempts \(max_retries=1\)"):
            ex.map(write_shard, [(Path("plan.npz"), 7, Path("work"), Path("out"), "uint16", "arrow")])
    finally:
        ex.close()


def test_a_stage_error_keeps_its_type_and_names_the_unit(ray_session, tmp_path):
    info = tokenizer_info(TOKENIZER, CONFIG)
    units = [Unit(1, str(tmp_path / "gone.jsonl"), 0, 1000)]
    ex = RayExecutor()
    try:
        with pytest.raises(ValueError, match=r"tokenize_unit, unit 1 \(.*gone\.jsonl bytes 0-1000\): .*cannot open"):
            ex.map(tokenize_unit, [(u, info, CONFIG, tmp_path) for u in units])
    finally:
        ex.close()


def test_a_stall_fails_naming_the_pending_calls_instead_of_hanging(ray_session, monkeypatch):
    monkeypatch.setattr(executors, "RAY_STALL_SECONDS", 0.5)
    ex = RayExecutor(n_workers=1)
    try:
        with pytest.raises(TimeoutError, match=r"no Ray task finished in 0.5 s \(1 in flight: sleep, item 0\)"):
            ex.map(time.sleep, [(5,), (0,)])
    finally:
        ex.close()
