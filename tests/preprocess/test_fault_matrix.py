"""The fault-injection matrix (issue 17), a slow suite: `python -m pytest -m slow tests/preprocess/test_fault_matrix.py`.

Every failpoint of every stage (publishing and removing _work/ included) (packer/io/failpoints.py) x SIGKILL / SIGTERM / SIGINT, for arrow and
memmap, local with 1 and 2 workers and Ray with 2; and ENOSPC at every local file write of a build
(`file:N`, N = 0, 1, ... until a build writes no N-th file). Each case is a real `packer build`
process that fails, then the same command again, which must give the bytes of an uninterrupted
build (or, where Ray retries a task whose worker died, the first run finishes with those bytes), with:
  * the failed run: no manifest (but for a full disk at the record's last save, after publishing); one `Error:`/`stopped` line and no traceback (SIGKILL prints
    nothing); no temporary file and no 0-byte lock left after SIGTERM, SIGINT or ENOSPC;
  * no file outside the output touched (the inputs, the tokenizer, a neighbour file: same bytes).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import tempfile
from pathlib import Path

import pytest
from conftest import TOKENIZER, run_packer, sample_heads, undated

pytestmark = pytest.mark.slow

TIMESTAMPS = ("created_unix", "build_seconds")
DRIVER_POINTS = ("tokenize:1", "plan:0", "write:2", "finalize:0")
WORKER_POINTS = ("unit:1", "shard:2", "write-shard:2")
# publishing (moving the new dataset in) and deleting _work/ after it: the dataset may already be
# complete when the run dies, and the same command must finish the job (issue 28)
PUBLISH_POINTS = ("publish:0", "publish:2", "remove-work:0", "remove-work:2", "remove-work:-1")
SIGNALS = ("kill", "term", "int")
RUNS = (("local", 1), ("local", 2), ("ray", 2))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """About 60 kB of each sample file: two units, several shards."""
    return sample_heads(tmp_path_factory.mktemp("inputs"), 60_000)


def _run(inputs, out: Path, fmt: str, executor: str, workers: int, fail: str | None = None):
    """(exit code, output, whether the failpoint fired) of one `packer build` process."""
    once = tempfile.mkdtemp(prefix="packer-once-")  # each point fires once (its marker file): retried Ray tasks go on
    code, output = run_packer(["build", *inputs, "--tokenizer", TOKENIZER, "--output", str(out), "--context-length",
                               "256", "--shard-size", "6000", "--workers", str(workers), "--format", fmt,
                               "--executor", executor, "--unit-bytes", "40000"],
                              failpoints=f"once={once},{fail}" if fail else None, timeout=300)
    return code, output, bool(os.listdir(once))


def _snapshot(out: Path) -> dict:
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    for key in TIMESTAMPS:
        manifest.pop(key)
    files["manifest.json"] = json.dumps(manifest, indent=2).encode()
    if "report.html" in files:
        files["report.html"] = undated(files["report.html"])
    record = json.loads(files.pop(".packer-owned.json"))  # packer's record of its files: without mtimes,
    for name, entry in record["files"].items():          # nor the manifest's sha256 (its timestamps change it)
        entry.pop("mtime_ns")
        if name in ("manifest.json", "report.html"):  # their timestamps / the page's date change them
            del entry["sha256"], entry["bytes"]
    files[".packer-owned.json"] = json.dumps(record, indent=2).encode()
    return files


def _outside(inputs, tmp_path) -> dict:
    neighbour = tmp_path / "neighbour.txt"
    if not neighbour.exists():
        neighbour.write_text("a user's file beside the output\n")
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in [*inputs, TOKENIZER, str(neighbour)]}


_REFERENCES: dict = {}


def _reference(inputs, fmt, tmp_path_factory) -> dict:
    if fmt not in _REFERENCES:
        out = tmp_path_factory.mktemp("reference") / fmt
        code, log, _ = _run(inputs, out, fmt, "local", 1)
        assert code == 0, log
        _REFERENCES[fmt] = _snapshot(out)
        assert sum(name.startswith("shard-") for name in _REFERENCES[fmt]) >= 4
    return _REFERENCES[fmt]


def _fail_then_resume(inputs, tmp_path, tmp_path_factory, fmt, executor, workers, fail) -> str:
    reference = _reference(inputs, fmt, tmp_path_factory)
    before = _outside(inputs, tmp_path)
    out = tmp_path / "ds"
    code, log, fired = _run(inputs, out, fmt, executor, workers, fail)
    if not fired:  # the point was never reached (e.g. file:N past the build's last write)
        assert code == 0, log
        return "not reached"
    if code == 0:  # a Ray task whose worker was killed is retried: the build went on by itself
        _check_identical(out, reference)
        assert _outside(inputs, tmp_path) == before
        return "recovered"
    if not fail.startswith(("file:", "remove-work:")):  # (a full disk at the record's last save, after publishing, leaves
        assert not (out / "manifest.json").exists(), log  # the dataset complete: the rerun finishes the record)
    assert "Traceback" not in log, log
    if code != -signal.SIGKILL:  # the driver saw it: one line, nothing half-written left
        assert code in (1, 130, 143), (code, log)
        assert [line for line in log.strip().splitlines() if line.startswith(("Error:", "stopped"))], log
        leftovers = [str(p) for p in out.rglob("*") if ".tmp" in p.name]
        assert not leftovers, leftovers
        lock = out / ".packer.lock"
        assert not (lock.exists() and lock.stat().st_size == 0)
    code, log, _ = _run(inputs, out, fmt, executor, workers)
    assert code == 0, log
    _check_identical(out, reference)
    assert _outside(inputs, tmp_path) == before
    return "resumed"


def _check_identical(out: Path, reference: dict):
    snap = _snapshot(out)
    assert sorted(snap) == sorted(reference)  # no _work, no lock, no temporary file left
    for name, data in reference.items():
        assert snap[name] == data, name


CASES = [(fmt, executor, workers, f"{point}={action}") for fmt in ("arrow", "memmap") for executor, workers in RUNS
         for point in DRIVER_POINTS + WORKER_POINTS for action in SIGNALS]


@pytest.mark.parametrize("fmt, executor, workers, fail", CASES)
def test_a_signal_at_any_point_resumes_to_identical_bytes(inputs, tmp_path, tmp_path_factory, fmt, executor, workers,
                                                          fail):
    if executor == "ray":
        pytest.importorskip("ray")
    outcome = _fail_then_resume(inputs, tmp_path, tmp_path_factory, fmt, executor, workers, fail)
    # A worker killed under Ray is retried by Ray (executors.RAY_MAX_RETRIES): the same run finishes.
    retried = executor == "ray" and fail.split("=")[0] in WORKER_POINTS  # (SIGINT ends a Ray worker too)
    assert outcome == "resumed" or (retried and outcome == "recovered"), outcome


@pytest.mark.parametrize("fmt, fail", [(fmt, f"{point}={action}") for fmt in ("arrow", "memmap")
                                       for point in PUBLISH_POINTS for action in SIGNALS])
def test_a_signal_while_publishing_or_removing_work_resumes_to_identical_bytes(inputs, tmp_path, tmp_path_factory,
                                                                               fmt, fail):
    assert _fail_then_resume(inputs, tmp_path, tmp_path_factory, fmt, "local", 1, fail) == "resumed"


@pytest.mark.parametrize("fmt", ["arrow", "memmap"])
def test_a_full_disk_at_every_write_resumes_to_identical_bytes(inputs, tmp_path_factory, fmt):
    """ENOSPC at the N-th file write of the build process (one worker: every write is the driver's),
    for every N until the build writes no N-th file."""
    n = 0
    while True:
        tmp_path = tmp_path_factory.mktemp(f"enospc-{fmt}-{n}")
        if _fail_then_resume(inputs, tmp_path, tmp_path_factory, fmt, "local", 1, f"file:{n}=enospc") == "not reached":
            break
        n += 1
    assert n >= 20  # units, plan, shards, stats, manifest...: every one of them was hit
