"""The Ray executor on a local Ray instance this file starts and stops: same bytes as local,
worker deaths retried, persistent failures named, nothing left running."""

from __future__ import annotations

import contextlib
import json
import os
import pkgutil
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray")

from conftest import SAMPLE_INPUTS, TOKENIZER, undated  # noqa: E402

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
    if "report.html" in files:
        files["report.html"] = undated(files["report.html"])
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


# -- two nodes on 127.0.0.1, started as docs/remote.md says (Ray >= 2.5x: token authentication) ---------------

CLUSTER_BUILD = ["--context-length", "1024", "--shard-size", "200000", "--unit-bytes", "400000"]  # 9 units, 4 shards


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes() -> dict[int, tuple[int, str]]:
    out = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            cmd = open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace").replace("\0", " ")
        except (OSError, IndexError, ValueError):
            continue
        out[int(p)] = (ppid, cmd)
    return out


def _cluster_processes(temp: str, socket_suffix: str | None = None) -> list[int]:
    """Pids of the processes `ray start` left under the session directory `temp` (GCS, raylets, agents, monitors) and
    their children (task workers, whose titles no longer name it); with socket_suffix, one raylet's ("raylet.1")."""
    procs = _processes()
    if socket_suffix is not None:
        return [p for p, (_, cmd) in procs.items() if "/raylet/raylet " in cmd + " " and temp in cmd
                and f"/sockets/{socket_suffix} " in cmd]
    roots = {p for p, (_, cmd) in procs.items() if temp in cmd}
    return sorted({p for p, (ppid, _) in procs.items() if ppid in roots} | roots)


def _ray_cli(args, env, timeout=120):
    import subprocess
    import sys

    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    return subprocess.run([ray_cli, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def two_nodes():
    """A head and a second node on 127.0.0.1, each its own `ray start` with 1 CPU, the second with its own HOME
    (another machine: no ~/.ray/auth_token of the head's), started as docs/remote.md says: the head's token made
    with `ray get-auth-token --generate`, RAY_AUTH_MODE=token everywhere, the token handed to the second node in
    RAY_AUTH_TOKEN. Stopped by pid at the end (never `ray stop`, which stops every Ray on the machine)."""
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    head_home, node_home, temp = (os.path.join(root, name) for name in ("head", "node", "t"))
    os.makedirs(node_home)
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != failpoints.ENV}
    base["RAY_USAGE_STATS_ENABLED"] = "0"
    head_env = {**base, "HOME": head_home}
    port = _free_port()
    try:
        result = _ray_cli(["get-auth-token", "--generate"], head_env)
        assert result.returncode == 0, result.stderr[-2000:]
        token = open(os.path.join(head_home, ".ray", "auth_token")).read().strip()
        common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=80000000",
                  "--disable-usage-stats", f"--dashboard-agent-listen-port={_free_port()}"]
        result = _ray_cli(["start", "--head", f"--port={port}", f"--temp-dir={temp}", "--include-dashboard=false",
                           f"--dashboard-port={_free_port()}", *common],
                          {**head_env, "RAY_AUTH_MODE": "token"})
        assert result.returncode == 0, result.stderr[-2000:]
        # What docs/remote.md said before: a second node without the head's token is refused.
        refused = _ray_cli(["start", f"--address=127.0.0.1:{port}", *common], {**base, "HOME": node_home}, timeout=60)
        assert refused.returncode != 0 and "AuthenticationError" in refused.stderr, refused.stderr[-2000:]
        result = _ray_cli(["start", f"--address=127.0.0.1:{port}", *common],
                          {**base, "HOME": node_home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
        assert result.returncode == 0, result.stderr[-2000:]
        assert len(_cluster_processes(temp, "raylet.1")) == 1  # the second node's raylet
        yield {"address": f"127.0.0.1:{port}", "temp": temp,
               "driver_env": {**head_env, "RAY_AUTH_MODE": "token"}}  # the driver on the head: its ~/.ray/auth_token
    finally:
        for _ in range(3):  # children first, then the daemons; again for any a dying parent started
            for p in reversed(_cluster_processes(temp)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.5)
        assert _cluster_processes(temp) == []
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_local_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster-local") / "out"
    result = CliRunner().invoke(main, ["build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--output", str(out),
                                       *CLUSTER_BUILD, "--workers", "2", "-q"])
    assert result.exit_code == 0, result.output
    return _files(out)


def _cluster_build(cluster, out, watch=None):
    """`packer build ... --executor ray --ray-address HEAD:PORT` in a subprocess (this process holds no Ray session),
    `watch(process)` called every 0.1 s while it runs; returns its output."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "packer", "build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER,
                                "--output", str(out), *CLUSTER_BUILD, "--executor", "ray",
                                "--ray-address", cluster["address"]],
                               env=cluster["driver_env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 400
    while process.poll() is None and time.time() < deadline:
        if watch is not None:
            watch(process)
        time.sleep(0.1)
    if process.poll() is None:
        process.kill()
    output = process.communicate()[0]
    assert process.returncode == 0, output[-3000:]
    return output


def _tasks_on(raylet: int) -> list[int]:
    """The raylet's worker processes running a packer task now (a worker's title: ray::_run_task)."""
    return [p for p, (ppid, cmd) in _processes().items() if ppid == raylet and cmd.startswith("ray::_run_task")]


@pytest.mark.slow  # two `ray start`s and a build through them: ~40-90 s on the busy 2-core box
def test_a_two_node_cluster_started_as_documented_builds_byte_identical(two_nodes, tmp_path, cluster_local_files):
    (raylet,) = _cluster_processes(two_nodes["temp"], "raylet.1")
    ran = set()
    _cluster_build(two_nodes, tmp_path / "out", watch=lambda _: ran.update(_tasks_on(raylet)))
    assert ran  # the second node ran packer tasks
    assert _files(tmp_path / "out") == cluster_local_files


@pytest.mark.slow
def test_the_second_nodes_raylet_killed_mid_build_leaves_the_output_byte_identical(two_nodes, tmp_path,
                                                                                  cluster_local_files):
    """SIGKILL to the second node's raylet while a packer task runs on it: Ray retries the lost tasks on the head."""
    (raylet,) = _cluster_processes(two_nodes["temp"], "raylet.1")
    killed = []

    def kill_on_first_task(process):
        if not killed and _tasks_on(raylet):
            os.kill(raylet, signal.SIGKILL)
            killed.append(process.poll() is None)  # the build was still running

    _cluster_build(two_nodes, tmp_path / "out", watch=kill_on_first_task)
    assert killed == [True]
    assert _files(tmp_path / "out") == cluster_local_files


def test_the_documented_cluster_commands_carry_the_token_and_parse():
    """The fast twin of the two tests above: docs/remote.md's cluster block, line by line. Every `ray start` runs with
    RAY_AUTH_MODE=token and its flags parse with the installed Ray's own `ray start` (click), the worker node's with
    the head's token, the build with RAY_AUTH_MODE=token and an explicit --ray-address (where Ray 2.60 does not
    turn token mode on by itself); the token is made first, as the fixture above makes it."""
    import re
    import shlex

    from ray.scripts.scripts import start

    text = (Path(__file__).parents[2] / "docs" / "remote.md").read_text(encoding="utf-8")
    section = text.split("## Running on a Ray cluster", 1)[1]
    block = next(b for b in re.findall(r"```bash\n(.*?)```", section, re.S) if "ray start" in b)
    lines = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]
    commands = []
    for line in lines:
        words = shlex.split(line.replace('"$TOKEN"', "TOKEN"))
        env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=.*", w))
        commands.append((env, [w for w in words if not re.fullmatch(r"[A-Z_]+=.*", w)]))
    assert commands[0] == ({}, ["ray", "get-auth-token", "--generate"])
    starts = [(env, argv) for env, argv in commands if argv[:2] == ["ray", "start"]]
    assert len(starts) == 2 and all(env.get("RAY_AUTH_MODE") == "token" for env, _ in starts)
    (head_env, head), (node_env, node) = starts
    assert "--head" in head and "RAY_AUTH_TOKEN" in node_env and "--address=HEAD_IP:6379" in node
    for argv in (head, node):
        params = start.make_context("start", argv[2:]).params  # raises on a flag this Ray does not have
        assert params["head"] == ("--head" in argv)
    (build_env, build), = [(env, argv) for env, argv in commands if argv[0] == "packer"]
    assert build_env.get("RAY_AUTH_MODE") == "token" and "--ray-address" in build and "ray" in build
