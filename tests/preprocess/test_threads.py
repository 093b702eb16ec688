"""The cores rule (packer/encode/engines/threads.py): workers x each worker's engine threads never exceed the usable cores.

Checked three ways: the arithmetic over many core and worker counts, the cgroup quota read from
files laid out as the kernel does, and the OS threads each engine really starts in a build's
workers, counted in /proc/self/task of processes that see 1 or 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

from packer.encode.engines import threads

TOKENIZER = str(ROOT / "sample_data" / "tokenizer.json")


@pytest.mark.parametrize("user", [None, 1, 2, 3, 8])
def test_workers_times_threads_never_exceed_the_cores(monkeypatch, user):
    if user is None:
        monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("RAYON_NUM_THREADS", str(user))
    seen = set()
    for cores in range(1, 17):
        monkeypatch.setattr(threads, "usable_cores", lambda cores=cores: cores)
        for workers in range(1, 2 * cores + 3):
            n = threads.threads_per_worker(workers)
            assert n >= 1
            assert workers * n <= max(cores, workers)  # above the cores only where the workers alone are
            if user is not None:
                assert n <= user
            else:  # and no core left idle that one more thread a worker would fill
                assert workers * (n + 1) > cores
            seen.add((workers < cores, n > 1))
    assert (False, False) in seen and (True, False) in seen  # one thread a worker: workers at or above the cores, or capped
    assert ((True, True) in seen) == (user != 1)  # several threads a worker where the cap allows


def _cgroup(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_cgroup_quota_lowers_the_cores(tmp_path):
    v2 = ["0::/box/job"]
    root = _cgroup(tmp_path / "a", {"box/job/cpu.max": "max 100000\n", "box/cpu.max": "150000 100000\n"})
    assert threads.quota_cores(v2, root) == 2  # the parent's 1.5 CPUs, rounded up; the group itself: no limit
    root = _cgroup(tmp_path / "b", {"box/job/cpu.max": "50000 100000\n", "box/cpu.max": "800000 100000\n"})
    assert threads.quota_cores(v2, root) == 1
    assert threads.quota_cores(v2, _cgroup(tmp_path / "c", {"cpu.max": "max 100000\n"})) is None
    assert threads.quota_cores(v2, tmp_path / "none") is None
    v1 = ["4:memory:/x", "2:cpu,cpuacct:/docker/abc", "0::/"]
    root = _cgroup(tmp_path / "d", {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
                                    "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert threads.quota_cores(v1, root) == 3
    root = _cgroup(tmp_path / "e", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert threads.quota_cores(["1:cpu:/"], root) is None


def test_usable_cores_take_the_lower_of_affinity_and_quota(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    monkeypatch.setattr(threads, "cgroup_quota_cores", lambda: 2)
    assert threads.usable_cores() == 2
    monkeypatch.setattr(threads, "cgroup_quota_cores", lambda: None)
    assert threads.usable_cores() == 6


# A driver that sees `cores` cores (its affinity patched before packer is imported), runs `workers`
# workers as a build does (packer.preprocess.executors), and has each load the sample tokenizer's
# engine, encode 64 texts through the text path and report the OS threads it started meanwhile
# (and those loading the engine started: the probe's tokenizers encode).
DRIVER = textwrap.dedent("""
    import json, os, sys
    cores, workers, engine = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    os.sched_getaffinity = lambda pid: set(range(cores))
    sys.path.insert(0, sys.argv[4])
    from engine_threads_probe import count
    from packer.encode.engines import threads
    from packer.preprocess.executors import make_executor
    threads.cgroup_quota_cores = lambda: None  # the cores are the affinity's alone, whatever quota CI runs under
    ex = make_executor(workers)
    try:
        print(json.dumps(ex.map(count, [(engine, workers)] * workers)))
    finally:
        ex.close()
""")

PROBE = textwrap.dedent("""
    import os
    import numpy as np

    def count(engine, workers):
        import glob, time
        from packer.encode.engines.threads import engine_threads
        from packer.encode.text import encode_parts
        from packer.encode.tokenizer import load_encoder

        before = set(os.listdir("/proc/self/task"))
        encoder = load_encoder(%r, engine)  # the probe: tokenizers encodes too (its Rayon pool, then idle)
        loaded = set(os.listdir("/proc/self/task"))
        texts = ["a few words, and a few more: %%d" %% i * 50 for i in range(64)]
        for _ in encode_parts(encoder, texts, dtype=np.uint32):
            pass
        started = set(os.listdir("/proc/self/task")) - loaded
        # each call waits for the other workers' calls, so a pool cannot hand two calls to one process
        here = os.path.dirname(os.path.abspath(__file__))
        open(os.path.join(here, "pid-%%d" %% os.getpid()), "w").close()
        deadline = time.monotonic() + 60
        while len(glob.glob(os.path.join(here, "pid-*"))) < workers and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"started": len(started), "by_load": len(loaded - before), "setting": engine_threads(),
                "pid": os.getpid()}
""") % TOKENIZER


def _run(tmp_path, cores: int, workers: int, engine: str, env: dict) -> list[dict]:
    (tmp_path / "engine_threads_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")} | env
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(cores), str(workers), engine, str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)")
@pytest.mark.parametrize("engine", ["tiktoken", "hf"])
@pytest.mark.parametrize("user", [None, "4"])  # a RAYON_NUM_THREADS the user set is a cap, not a raise
def test_a_two_core_build_with_two_workers_starts_one_engine_thread_each(tmp_path, engine, user):
    """2 cores, 2 workers: not 2 x 2 busy threads. tiktoken encodes on the worker's own thread (no
    pool); hf's one thread runs encode_batch_fast with Rayon off (TOKENIZERS_PARALLELISM=false)."""
    found = _run(tmp_path, 2, 2, engine, {"RAYON_NUM_THREADS": user} if user else {})
    assert len({f["pid"] for f in found}) == 2
    assert sum(f["setting"] for f in found) <= 2
    assert all(f["by_load"] == 0 for f in found), found  # no Rayon pool for the probe either
    assert [f["started"] for f in found] == ([0, 0] if engine == "tiktoken" else [1, 1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)")
def test_one_core_one_worker_starts_no_tiktoken_pool(tmp_path):
    """One usable core (the affinity a taskset gives), one worker: tiktoken encodes inline (before the
    rule it took os.cpu_count() threads where no RAYON_NUM_THREADS was set); 2 cores: a pool of 2."""
    one = _run(tmp_path, 1, 1, "tiktoken", {})[0]
    assert one["setting"] == 1 and one["by_load"] + one["started"] == 0
    two = _run(tmp_path, 2, 1, "tiktoken", {})[0]  # tiktoken's pool of 2 (made by the probe), and the
    assert two["setting"] == 2 and 2 <= two["by_load"] + two["started"] <= 4  # probe's Rayon pool of 2, then idle


def test_a_process_no_executor_configured_uses_its_cores(monkeypatch):
    """`packer stats`, a notebook: no RAYON_NUM_THREADS; tiktoken takes the usable cores, not os.cpu_count()."""
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 1)
    assert threads.engine_threads() == 1
    monkeypatch.setenv("RAYON_NUM_THREADS", "16")
    assert threads.engine_threads() == 1
    monkeypatch.setattr(threads, "usable_cores", lambda: 32)
    assert threads.engine_threads() == 16
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    assert threads.engine_threads() == 1
