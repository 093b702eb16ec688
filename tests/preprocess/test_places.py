"""Places are resolved once, at the edge: a build turns OUTPUT into a place once (build()), each
input once per step that opens it by name, and hands the places inward; nothing below re-resolves.

Counted, not timed: fs.location on a string (a local build: the conversion to a Path) and
fs.resolve (a URI build: pyarrow/fsspec's resolution, what costs a client and credentials), by the
place they resolve. Measured 2026-12-03 on the sample job: a memory:// OUTPUT was resolved 28 times
before (every task re-resolved its work directory), 1 time now."""

from __future__ import annotations

import collections
import os
import uuid
import warnings
from pathlib import Path

import pytest

pytest.importorskip("fsspec")

from conftest import SAMPLE_INPUTS, TOKENIZER  # noqa: E402

from packer.config import BuildConfig, Job  # noqa: E402
from packer.io import fs  # noqa: E402
from packer.preprocess.pipeline import build  # noqa: E402

# Each input is opened by name in a few separate steps (expand, plan units, read, stamp, the change
# check): a bound per input, not per unit or per task. Inputs stay names (packer/preprocess/inputs.py).
PER_INPUT = 8
PER_TOKENIZER = 4


def _counting(monkeypatch) -> collections.Counter:
    """Strings turned into places: fs.location of a non-place, fs.resolve of a URI."""
    counts: collections.Counter = collections.Counter()
    location, resolve = fs.location, fs.resolve

    def counted_location(loc):
        if not isinstance(loc, (Path, fs.RemotePath)) and not fs.is_uri(os.fspath(loc)):
            counts[os.fspath(loc)] += 1
        return location(loc)

    def counted_resolve(uri):
        counts[uri] += 1
        return resolve(uri)

    monkeypatch.setattr(fs, "location", counted_location)
    monkeypatch.setattr(fs, "resolve", counted_resolve)
    return counts


def _build(inputs, output):
    job = Job(inputs=tuple(inputs), tokenizer=TOKENIZER, output=output, workers=1,
              config=BuildConfig(context_length=1024, shard_size=200_000))  # 2 units, 4 shards
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # memory:// has no lock: its one-line warning
        return build(job)


def _by_place(counts, inputs, output) -> dict:
    grouped = collections.Counter()
    for name, n in counts.items():
        if name.startswith(str(output)):
            grouped["output"] += n
        elif name in inputs:
            grouped[name] += n
        elif name == TOKENIZER:
            grouped["tokenizer"] += n
        else:
            grouped[f"other: {name}"] += n
    return dict(grouped)


def _check(places: dict, inputs):
    assert places.pop("output") == 1  # build() resolved it; every stage, task and file below took the place
    assert places.pop("tokenizer", 0) <= PER_TOKENIZER
    for name in inputs:
        assert 1 <= places.pop(name) <= PER_INPUT, name
    assert places == {}  # nothing else was resolved


def test_a_local_build_turns_each_place_into_a_path_a_bounded_number_of_times(tmp_path, monkeypatch):
    output = str(tmp_path / "ds")
    counts = _counting(monkeypatch)
    manifest = _build(SAMPLE_INPUTS, output)
    assert len(manifest["shards"]) == 4 and manifest["totals"]["sequences"] > 4  # several units, shards, tasks
    _check(_by_place(counts, SAMPLE_INPUTS, output), SAMPLE_INPUTS)


def test_a_memory_build_resolves_each_uri_a_bounded_number_of_times(monkeypatch):
    root = f"memory://packer-places-{uuid.uuid4().hex}"
    inputs = []
    for path in SAMPLE_INPUTS:  # the inputs on the store too: each resolved by its own URI
        uri = f"{root}/in/{Path(path).name}"
        fs.location(uri).write_bytes(Path(path).read_bytes())
        inputs.append(uri)
    output = f"{root}/ds"
    try:
        counts = _counting(monkeypatch)
        manifest = _build([f"{root}/in"], output)
        assert len(manifest["shards"]) == 4
        places = _by_place(counts, inputs, output)
        assert places.pop(f"other: {root}/in") == 1  # the input directory, expanded once
        _check(places, inputs)
    finally:
        fs.rmtree(fs.location(root))
