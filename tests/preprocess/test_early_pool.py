"""A build's pool started before the driver loads its tokenizer, each worker loading it as it starts
(packer/preprocess/pipeline.py _pool_started_early, executors.LocalExecutor warm/start)."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
from conftest import SAMPLE_INPUTS, TOKENIZER

from packer.config import BuildConfig, Job
from packer.encode.tokenizer import load_encoder, load_tokenizer, resolve_tokenizer
from packer.preprocess import pipeline
from packer.preprocess.executors import LocalExecutor
from packer.preprocess.tokenize import warm_worker


def note_pid(directory: str, tag: str):
    """A worker's warm function: leaves DIRECTORY/TAG-PID."""
    open(os.path.join(directory, f"{tag}-{os.getpid()}"), "w").close()


def fail(*_):
    raise ValueError("no such tokenizer")


def warn_and_return(value):
    import warnings

    warnings.warn(f"careful with {value}", UserWarning)
    return value


def worker_pid(delay: float) -> int:
    time.sleep(delay)
    return os.getpid()


def test_every_worker_runs_warm_once_before_its_tasks(tmp_path):
    ex = LocalExecutor(2, warm=(note_pid, (str(tmp_path), "warm")))
    ex.start()
    try:
        pids = set(ex.map(worker_pid, [(0.2,), (0.2,), (0.0,), (0.0,)]))
    finally:
        ex.close()
    warmed = {int(p.name.split("-")[1]) for p in tmp_path.iterdir()}
    assert len(list(tmp_path.iterdir())) == len(warmed) == 2  # once per worker, two workers
    assert pids <= warmed


def test_a_warm_that_fails_leaves_the_pool_working(tmp_path):
    ex = LocalExecutor(2, warm=(fail, ()))
    try:
        assert sorted(ex.map(worker_pid, [(0.0,), (0.0,), (0.0,)])) != []
    finally:
        ex.close()


def test_close_now_ends_a_pool_that_never_ran_a_task(tmp_path):
    ex = LocalExecutor(2, warm=(note_pid, (str(tmp_path), "warm")))
    ex.start()
    ex.close(now=True)
    ex.close()  # a second close does nothing
    for p in tmp_path.iterdir():  # every worker that started is gone
        with pytest.raises(ProcessLookupError):
            os.kill(int(p.name.split("-")[1]), 0)


def test_call_runs_on_a_worker_and_returns_raises_and_warns_as_if_here():
    ex = LocalExecutor(2)
    try:
        assert ex.call(os.getpid) != os.getpid()
        with pytest.raises(ValueError, match="no such tokenizer"):
            ex.call(fail)
        with pytest.warns(UserWarning, match="careful with 7"):
            assert ex.call(warn_and_return, 7) == 7
        assert ex.map(abs, [(-1,), (-2,)]) == [1, 2]  # the pool still works after a call raised
    finally:
        ex.close()


def test_call_on_a_worker_that_dies_says_so():
    from packer.preprocess.executors import WorkerDied

    ex = LocalExecutor(2)
    try:
        with pytest.raises(WorkerDied, match="_exit: a worker process died"):
            ex.call(os._exit, 3)
    finally:
        ex.close(now=True)


def test_warm_worker_loads_what_a_tokenize_task_uses():
    path = resolve_tokenizer(TOKENIZER)
    load_encoder.cache_clear()
    warm_worker(TOKENIZER, "auto")
    assert load_encoder.cache_info().currsize == 1
    before = load_encoder.cache_info().hits
    assert load_encoder(path, "tiktoken") is not None  # the task's call finds it made
    assert load_encoder.cache_info().hits == before + 1
    load_encoder.cache_clear()
    warm_worker(TOKENIZER, "hf")
    assert load_encoder.cache_info().currsize == 0 and load_tokenizer(path) is not None


def _job(tmp_path, inputs, workers=2, **kw):
    return Job(inputs=tuple(inputs), tokenizer=TOKENIZER, output=str(tmp_path / "out"), workers=workers,
               config=BuildConfig(context_length=64, **kw))


def test_a_pool_is_started_early_only_where_the_build_will_use_one(tmp_path):
    out = tmp_path / "out"
    two = _job(tmp_path, SAMPLE_INPUTS[:2])
    pool = pipeline._pool_started_early(two, list(two.inputs), out, overwrite=False)
    assert isinstance(pool, LocalExecutor)
    pool.close(now=True)
    one = _job(tmp_path, SAMPLE_INPUTS[:1])
    assert os.path.getsize(SAMPLE_INPUTS[0]) < one.config.unit_bytes
    assert pipeline._pool_started_early(one, list(one.inputs), out, overwrite=False) is None  # one unit
    small_units = dataclasses.replace(one, config=dataclasses.replace(one.config, unit_bytes=1 << 10))
    pool = pipeline._pool_started_early(small_units, list(one.inputs), out, overwrite=False)
    assert isinstance(pool, LocalExecutor)  # one file, several units
    pool.close(now=True)
    inline = _job(tmp_path, SAMPLE_INPUTS[:2], workers=1)
    assert pipeline._pool_started_early(inline, list(inline.inputs), out, overwrite=False) is None
    missing = _job(tmp_path, [str(tmp_path / "gone.jsonl")])
    assert pipeline._pool_started_early(missing, list(missing.inputs), out, overwrite=False) is None
    out.mkdir()
    (out / "manifest.json").write_text("{}")  # a complete dataset: the same command returns it
    assert pipeline._pool_started_early(two, list(two.inputs), out, overwrite=False) is None
    pool = pipeline._pool_started_early(two, list(two.inputs), out, overwrite=True)
    assert isinstance(pool, LocalExecutor)
    pool.close(now=True)


def test_builds_with_the_early_pool_equal_the_inline_build(tmp_path):
    inline = pipeline.build(_job(tmp_path / "a", SAMPLE_INPUTS, workers=1))
    pooled = pipeline.build(_job(tmp_path / "b", SAMPLE_INPUTS, workers=2))
    for name in ("shard-00000.arrow",):
        assert (tmp_path / "a" / "out" / name).read_bytes() == (tmp_path / "b" / "out" / name).read_bytes()
    assert inline["totals"] == pooled["totals"]


def test_the_driver_of_a_pooled_build_never_loads_the_tokenizer(tmp_path):
    """A worker reads the build's tokenizer_info (pipeline.build): the driver's process loads neither
    the tokenizer nor an engine, and the info's warnings still reach the driver's caller."""
    import json
    import shutil

    from packer.encode import tokenizer

    d = tmp_path / "tok"
    d.mkdir()
    shutil.copy(TOKENIZER, d / "tokenizer.json")
    (d / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<pad>"}))
    tokenizer._loaded.cache_clear()
    load_encoder.cache_clear()
    job = dataclasses.replace(_job(tmp_path, SAMPLE_INPUTS), tokenizer=str(d))
    with pytest.warns(UserWarning, match=r"names pad_token '<pad>', which .* does not have"):
        manifest = pipeline.build(job)
    assert tokenizer._loaded.cache_info().currsize == 0 and load_encoder.cache_info().currsize == 0
    with pytest.warns(UserWarning, match="names pad_token"):
        inline = pipeline.build(dataclasses.replace(job, workers=1, output=str(tmp_path / "inline")))
    assert tokenizer._loaded.cache_info().currsize == 1  # the inline build loads it here, and agrees
    assert manifest["tokenizer"] == inline["tokenizer"] and manifest["totals"] == inline["totals"]


def test_a_build_refused_after_the_pool_started_stops_cleanly(tmp_path):
    job = dataclasses.replace(_job(tmp_path, SAMPLE_INPUTS), tokenizer=str(tmp_path / "no-tokenizer.json"))
    t = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="no-tokenizer"):
        pipeline.build(job)
    assert time.perf_counter() - t < 60  # the pool ended, not waited on forever
    assert not (tmp_path / "out").exists()


ONE_CALL = """
import os, sys
from packer.preprocess.executors import LocalExecutor
ex = LocalExecutor(2)
assert ex.map(abs, [(-3,)]) == [3]
children = [c for t in os.listdir("/proc/self/task") for c in open(f"/proc/self/task/{t}/children").read().split()]
ex.close()
print(len(children))
"""


def test_a_pool_whose_maps_all_run_here_starts_no_process():
    """Not even multiprocessing's resource tracker (a ProcessPoolExecutor's queues start one): a tiny build."""
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run([sys.executable, "-c", ONE_CALL], capture_output=True, text=True, cwd=ROOT, check=True)
    assert proc.stdout.split() == ["0"], proc.stdout + proc.stderr
