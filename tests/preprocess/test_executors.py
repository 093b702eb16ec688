"""Executors without Ray: ordered results, labelled errors, job keys, and the missing-Ray message."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from conftest import ROOT, SAMPLE_INPUTS, TOKENIZER

from packer import config
from packer.cli import main
from packer.config import BuildConfig, Job, load_job
from packer.encode.tokenizer import tokenizer_info
from packer.io import failpoints
from packer.preprocess.executors import (
    EXECUTORS,
    InlineExecutor,
    LocalExecutor,
    describe_call,
    largest_first,
    make_executor,
)
from packer.preprocess.readers import Unit
from packer.preprocess.tokenize import tokenize_unit
from packer.preprocess.writer import write_shard


def slow_square(x: int, delay_s: float) -> int:
    time.sleep(delay_s)
    return x * x


def test_describe_call_names_the_unit_or_shard():
    unit = Unit(3, "a.jsonl", 0, 65536)
    assert describe_call(tokenize_unit, (unit, None, None, "w"), 3) == (
        "tokenize_unit, unit 3 (a.jsonl bytes 0-65536)"
    )
    assert describe_call(write_shard, ("plan.npz", 2, "w", "o", "uint16"), 2) == "write_shard, shard 2"
    assert describe_call(slow_square, (1, 0.0), 5) == "slow_square, item 5"
    assert describe_call(slow_square, (1, 2, 3), 6) == "slow_square, item 6"  # arguments do not bind


@pytest.mark.parametrize("executor", [InlineExecutor, lambda: LocalExecutor(2)], ids=["inline", "local"])
def test_results_in_item_order_and_on_done_once_each(executor):
    ex = executor()
    try:
        # The first item is the slowest, so the pool finishes it last; results keep item order.
        items = [(x, 0.3 if x == 0 else 0.0) for x in range(6)]
        seen = []
        assert ex.map(slow_square, items, on_done=seen.append) == [x * x for x in range(6)]
        assert sorted(seen) == [x * x for x in range(6)]
    finally:
        ex.close()


def note_start(directory: str, x: int) -> int:
    with open(os.path.join(directory, "started"), "a") as f:
        f.write(f"{x}\n")
    return x * 10


def test_largest_first_orders_by_size_ties_in_item_order():
    assert largest_first(5, [1, 5, 3, 5, -1]) == [1, 3, 2, 0, 4]
    assert largest_first(3) == [0, 1, 2]


def test_a_pool_starts_the_largest_calls_first_and_keeps_item_order(tmp_path):
    ex = LocalExecutor(1)  # one worker: calls run in the order they were started
    try:
        got = ex.map(note_start, [(str(tmp_path), i) for i in range(5)], sizes=[1, 5, 3, 5, -1])
    finally:
        ex.close()
    assert got == [0, 10, 20, 30, 40]
    assert (tmp_path / "started").read_text().split() == ["1", "3", "2", "0", "4"]


class _Sizes(InlineExecutor):
    """Runs nothing: keeps the sizes the stage asks a pool to order its calls by."""

    def map(self, fn, items, on_done=None, sizes=None):
        self.sizes = sizes
        return [{} for _ in items]


def test_the_tokenize_stage_starts_big_units_first_and_finished_ones_count_nothing(tmp_path):
    from packer.preprocess import pipeline, readers
    from packer.preprocess.tokenize import unit_paths

    units = readers.plan_units(list(SAMPLE_INPUTS), 1 << 11)
    assert len(units) >= 3 and len({u.size for u in units}) > 1
    unit_paths(tmp_path, units[0].index)["json"].write_text("{}")  # an earlier run finished it
    ex = _Sizes()
    try:
        pipeline._tokenize_stage(units, None, BuildConfig(), tmp_path, ex, progress="off")
    finally:
        ex.close()
    assert ex.sizes == [0, *(u.size for u in units[1:])]


def test_local_worker_error_keeps_its_type_and_names_the_unit(tmp_path):
    info = tokenizer_info(TOKENIZER, BuildConfig())
    units = [Unit(0, SAMPLE_INPUTS[0], 0, 1000), Unit(1, str(tmp_path / "gone.jsonl"), 0, 1000)]
    ex = LocalExecutor(2)
    try:
        # readers.FileError needs two arguments; the label keeps its nearest built-in type.
        with pytest.raises(ValueError, match=r"tokenize_unit, unit 1 \(.*gone\.jsonl bytes 0-1000\): .*cannot open"):
            ex.map(tokenize_unit, [(u, info, BuildConfig(), tmp_path) for u in units])
    finally:
        ex.close()


def test_make_executor_from_workers_or_job(tmp_path):
    for made in (1, Job(inputs=("a.jsonl",), tokenizer="t.json", output=str(tmp_path), workers=1)):
        ex = make_executor(made)
        assert isinstance(ex, InlineExecutor)
        ex.close()  # puts RAYON_NUM_THREADS / TOKENIZERS_PARALLELISM back: a leaked "true" hangs forked DataLoader workers
    ex = make_executor(Job(inputs=("a.jsonl",), tokenizer="t.json", output=str(tmp_path), workers=2))
    try:
        assert isinstance(ex, LocalExecutor)
    finally:
        ex.close()


def test_the_executor_table_is_the_one_config_checks_names_against(monkeypatch, tmp_path):
    """config.choices("executor") (what a Job, the CLI and TOML files accept) are the table's keys, and
    make_executor builds what the table's entry builds: a new executor is one line here."""
    assert tuple(EXECUTORS) == config.choices("executor")
    built = []
    monkeypatch.setitem(EXECUTORS, "local", lambda job: built.append(job) or InlineExecutor())
    job = Job(inputs=("a.jsonl",), tokenizer="t.json", output=str(tmp_path), workers=3)
    ex = make_executor(job)
    assert isinstance(ex, InlineExecutor) and built == [job]
    ex.close()


def test_a_new_executor_is_one_line_in_the_table(monkeypatch, tmp_path):
    """Registered in EXECUTORS and nowhere else, an executor is a Job choice and runs a build: the same
    shards as the local executor's; an unknown name is refused with the table's names."""
    from conftest import sample_heads

    from packer.preprocess.pipeline import build

    with pytest.raises(ValueError, match="executor must be one of local, ray; got 'in-order'"):
        Job(inputs=("a",), tokenizer="t", output="o", executor="in-order")
    ran = []
    monkeypatch.setitem(EXECUTORS, "in-order", lambda job: ran.append(job.executor) or InlineExecutor())
    (tmp_path / "in").mkdir()
    inputs = tuple(sample_heads(tmp_path / "in", 30_000))
    manifests = [build(Job(inputs=inputs, tokenizer=TOKENIZER, output=str(tmp_path / name), executor=name, workers=1,
                           config=BuildConfig(context_length=256, shard_size=10_000)))
                 for name in ("in-order", "local")]
    assert ran == ["in-order"] and len(manifests[0]["shards"]) > 1
    assert manifests[0]["shards"] == manifests[1]["shards"]


def test_job_checks_executor_keys():
    with pytest.raises(ValueError, match="executor must be one of local, ray; got 'spark'"):
        Job(inputs=("a",), tokenizer="t", output="o", executor="spark")
    with pytest.raises(ValueError, match="ray_address 'ray://h:10001' is set but the executor is 'local'"):
        Job(inputs=("a",), tokenizer="t", output="o", ray_address="ray://h:10001")


def test_pipeline_ray_toml_loads():
    job = load_job(ROOT / "pipelines" / "ray.toml")
    assert job.executor == "ray" and job.ray_address is None
    assert job.config == BuildConfig(context_length=2048)


def test_run_overrides_keep_the_pipeline_executor(monkeypatch):
    jobs = []

    def fake_build(job, **_):
        jobs.append(job)
        totals = {"docs_skipped": {}, "docs_accepted": 0, "docs_read": 0, "tokens_out": 0, "sequences": 0, "fill_rate": 1.0}
        return {"totals": totals, "config": {"context_length": 2048}, "shards": []}

    monkeypatch.setattr("packer.preprocess.pipeline.build", fake_build)
    toml = str(ROOT / "pipelines" / "ray.toml")
    assert CliRunner().invoke(main, ["run", toml, "--workers", "3"]).exit_code == 0
    assert CliRunner().invoke(main, ["run", toml, "--executor", "local"]).exit_code == 0
    assert CliRunner().invoke(main, ["run", toml, "--ray-address", "auto"]).exit_code == 0
    assert [(j.executor, j.workers, j.ray_address) for j in jobs] == [
        ("ray", 3, None), ("local", 0, None), ("ray", 0, "auto")
    ]


def test_failpoints_parse_and_fire_once(monkeypatch, tmp_path):
    """Inert without the variable; a set point raises ENOSPC, once per marker directory with once=DIR."""
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints.hit("write", 1)
    assert failpoints.environment() == {}
    monkeypatch.setenv(failpoints.ENV, f"once={tmp_path},write:1=enospc,unit:3=exit")
    failpoints.hit("write", 2)  # another point: nothing
    with pytest.raises(OSError) as e:
        failpoints.hit("write", 1)
    assert e.value.errno == errno.ENOSPC and "failpoint write:1" in str(e.value)
    failpoints.hit("write", 1)  # fired once already
    assert [p.name for p in tmp_path.iterdir()] == ["write-1"]
    assert failpoints.environment() == {failpoints.ENV: f"once={tmp_path},write:1=enospc,unit:3=exit"}
    monkeypatch.setenv(failpoints.ENV, "write:1=explode")
    with pytest.raises(ValueError, match="ACTION one of kill, term, int, exit, enospc"):
        failpoints.hit("write", 1)


def test_ray_executor_without_ray_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    result = CliRunner().invoke(
        main,
        ["build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"), "--executor", "ray"],
    )
    assert result.exit_code == 1, result.output
    assert 'pip install "packer[ray]"' in result.output and "Traceback" not in result.output


def test_local_pool_runs_from_a_script_piped_to_python(tmp_path):
    """`python - < build.py` has __main__.__file__ '<stdin>', which forkserver workers cannot re-run."""
    script = (f"from packer.config import Job\nfrom packer.preprocess.pipeline import build\n"
              f"build(Job(inputs=({SAMPLE_INPUTS[0]!r},), tokenizer={TOKENIZER!r}, output={str(tmp_path / 'ds')!r}, "
              f"workers=2))\nprint('built')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, cwd=tmp_path,
                            env=env, timeout=180)
    assert result.returncode == 0 and "built" in result.stdout, result.stderr[-2000:]
    assert (tmp_path / "ds" / "manifest.json").is_file()


def test_a_script_without_a_main_guard_builds_once_and_workers_do_not_run_it(tmp_path):
    """Workers never import the parent's main script (executors._main_hidden): a script with no
    `if __name__ == "__main__":` guard builds once (before, the forkserver ran it again and the build
    failed: a process started while the server was bootstrapping), and no worker has run it (the
    `packer` command's workers imported packer.cli that way)."""
    (tmp_path / "probe_mod.py").write_text("import sys\n\ndef has_main(_):\n    return hasattr(sys.modules['__main__'], 'BUILD_SCRIPT')\n")
    script = tmp_path / "build.py"
    script.write_text(
        "BUILD_SCRIPT = True\nfrom packer.config import Job\nfrom packer.preprocess.executors import LocalExecutor\n"
        "from packer.preprocess.pipeline import build\nimport probe_mod\n"
        f"build(Job(inputs={tuple(SAMPLE_INPUTS)!r}, tokenizer={TOKENIZER!r}, output={str(tmp_path / 'ds')!r}, "
        "workers=2))\nprint('built')\n"
        "ex = LocalExecutor(2)\nprint('workers ran the script:', any(ex.map(probe_mod.has_main, [(0,), (1,)])))\n"
        "ex.close()\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                            timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n").count("built") == 1
    assert "workers ran the script: False" in result.stdout
    assert (tmp_path / "ds" / "manifest.json").is_file()


def _process_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read().split("State:")[1].split()[0]
    except FileNotFoundError:
        return "gone"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_busy_worker_ends_when_its_driver_is_killed(tmp_path):
    """A SIGKILLed driver (OOM killer, preemption) must not leave a worker running its task on."""
    driver = tmp_path / "driver.py"
    driver.write_text("import time\nfrom packer.preprocess.executors import LocalExecutor\n"
                      "if __name__ == '__main__':\n"
                      "    ex = LocalExecutor(1)\n"
                      "    future = ex._pool.submit(time.sleep, 60)\n"
                      "    time.sleep(1)\n"
                      "    print(*ex._pool._processes, flush=True)\n"
                      "    future.result()\n")
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    workers = [int(pid) for pid in proc.stdout.readline().split()]
    try:
        assert workers and all(_process_state(pid) in "RS" for pid in workers)  # busy, sleeping in its task
        proc.kill()
        proc.wait()
        deadline = time.time() + 10
        while time.time() < deadline and any(_process_state(pid) not in ("Z", "gone") for pid in workers):
            time.sleep(0.1)
        assert all(_process_state(pid) in ("Z", "gone") for pid in workers)
    finally:
        for pid in workers:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def _threads_env(_):
    return os.environ.get("RAYON_NUM_THREADS"), os.environ.get("TOKENIZERS_PARALLELISM")


def test_tokenizer_threads_policy(monkeypatch):
    """cores // workers threads a worker (at least one); a RAYON_NUM_THREADS the user set caps it."""
    from packer.preprocess.executors import tokenizer_threads, usable_cores

    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    cores = usable_cores()
    assert 1 <= cores <= (os.cpu_count() or 1)
    assert tokenizer_threads(1) == cores and tokenizer_threads(cores) == 1 and tokenizer_threads(4 * cores) == 1
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    assert tokenizer_threads(1) == min(3, cores) and tokenizer_threads(64) == 1  # never above cores // workers
    assert Job(inputs=("a",), tokenizer="t", output="o").n_workers == max(1, cores // 2)


def test_workers_are_given_their_threads(monkeypatch):
    from packer.preprocess.executors import usable_cores

    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    ex = LocalExecutor(2)
    try:
        got = ex.map(_threads_env, [(i,) for i in range(2)])
    finally:
        ex.close()
    threads = max(1, usable_cores() // 2)
    assert got == [(str(threads), "true" if threads > 1 else "false")] * 2


def test_inline_sets_the_threads_and_puts_them_back(monkeypatch):
    from packer.preprocess.executors import usable_cores

    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    ex = InlineExecutor()
    assert ex.map(_threads_env, [(0,)]) == [(str(usable_cores()), "true" if usable_cores() > 1 else "false")]
    ex.close()
    assert os.environ.get("RAYON_NUM_THREADS") is None


def _pid_and_threads(_):
    return os.getpid(), os.environ.get("RAYON_NUM_THREADS")


def _fails(_):
    raise ValueError("no such column")


def test_a_pool_runs_a_single_call_here_and_starts_no_process(monkeypatch):
    """One call (a tiny build's one unit, one shard): run in this process on one worker's threads,
    labelled as a pool's call; two calls start the pool, whose workers are other processes."""
    from packer.preprocess.executors import usable_cores

    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    ex = LocalExecutor(2)
    try:
        done = []
        assert ex.map(_pid_and_threads, [(0,)], on_done=done.append) == [(os.getpid(), str(usable_cores()))] == done
        assert ex.map(_pid_and_threads, []) == []
        assert not ex._pool._processes  # nothing started
        assert os.environ.get("RAYON_NUM_THREADS") is None  # put back
        with pytest.raises(ValueError, match="^_fails, item 0: no such column$"):
            ex.map(_fails, [(0,)])
        pids = {pid for pid, _ in ex.map(_pid_and_threads, [(0,), (1,), (2,)])}
        assert os.getpid() not in pids and ex._pool._processes
    finally:
        ex.close()
