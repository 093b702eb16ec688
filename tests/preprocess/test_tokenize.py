"""Tokenize stage: batch encoding equals the tokenizer's own output, long documents in pieces give
the same tokens, unit files are identical whatever the unit size, and streamed .npy files load."""

from __future__ import annotations

import dataclasses
import gzip
import json
import random

import numpy as np
import pytest
from conftest import TOKENIZER, reference_ids, sample_texts
from tokenizers import Tokenizer

from packer.config import BuildConfig
from packer.encode import text
from packer.encode.tokenizer import resolve_tokenizer, tokenizer_info
from packer.preprocess import tokenize
from packer.preprocess.readers import plan_units
from packer.preprocess.tokenize import _NpyAppender, prefix_sums, tokenize_unit, unit_paths


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(TOKENIZER)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int64])
def test_streamed_npy_loads_plainly_and_memory_mapped(tmp_path, dtype):
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 60000, n).astype(dtype) for n in (0, 5, 1000, 1)]
    w = _NpyAppender(tmp_path / "x.npy", dtype)
    for p in parts:
        w.append(p)
    assert not (tmp_path / "x.npy").exists()
    w.commit()
    expected = np.concatenate(parts)
    for loaded in (np.load(tmp_path / "x.npy"), np.load(tmp_path / "x.npy", mmap_mode="r")):
        assert loaded.dtype == dtype and np.array_equal(loaded, expected)
    assert list(tmp_path.iterdir()) == [tmp_path / "x.npy"]


def _unit_outputs(work, units, info, config):
    counters = [tokenize_unit(u, info, config, work) for u in units]
    tokens = np.concatenate([np.load(unit_paths(work, u.index)["tokens.npy"]) for u in units])
    lengths = np.concatenate([np.load(unit_paths(work, u.index)["lengths.npy"]) for u in units])
    return tokens, lengths, counters


def test_output_identical_at_any_unit_size(tmp_path, tok):
    rng = random.Random(1)
    texts = [t[: rng.randint(1, 300)] for t in sample_texts()[:120]]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts) + "not json\n")
    config = BuildConfig()
    info = tokenizer_info(TOKENIZER, config)
    ref = reference_ids(tok, texts, None, info.eos_id)
    sizes = [61, 97, 1000, 4096, 10**9] + [rng.randint(50, 5000) for _ in range(4)]
    for unit_bytes in sizes:
        work = tmp_path / f"w{unit_bytes}"
        work.mkdir()
        units = plan_units([str(path)], unit_bytes)
        tokens, lengths, counters = _unit_outputs(work, units, info, config)
        assert tokens.tolist() == [t for r in ref for t in r], unit_bytes
        assert lengths.tolist() == [len(r) for r in ref]
        assert sum(c["docs_read"] for c in counters) == len(texts) + 1
        assert sum(c["skipped"].get("malformed_json", 0) for c in counters) == 1


def test_eos_string_and_nul_are_ordinary_text(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"text": "a <|endoftext|> b \u0000 c"}) + "\n")
    config = BuildConfig()
    info = tokenizer_info(TOKENIZER, config)
    tokens, lengths, _ = _unit_outputs(tmp_path, plan_units([str(path)], 100), info, config)
    assert lengths.tolist() == [len(tokens)] and len(tokens) > 8
    assert tokens.tolist().count(info.eos_id) == 1 and tokens[-1] == info.eos_id


def test_file_error_skip_leaves_an_empty_unit_that_says_why(tmp_path):
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(b'{"text": "x"}\n' * 10000)[:300])
    units = plan_units([str(tmp_path / "t.jsonl.gz")], 100)
    info = tokenizer_info(TOKENIZER, BuildConfig())
    with pytest.raises(ValueError, match="t.jsonl.gz: .*Truncated"):
        tokenize_unit(units[0], info, BuildConfig(), tmp_path)
    tokens, lengths, (c,) = _unit_outputs(tmp_path, units, info, BuildConfig(on_file_error="skip"))
    assert len(tokens) == len(lengths) == 0
    assert c["file_error"] == "corrupt or truncated gzip stream (Truncated compressed stream)" and c["docs_read"] == 0
    assert sorted(p.name for p in tmp_path.iterdir() if "unit" in p.name) == [
        "unit-000000.json", "unit-000000.lengths.npy", "unit-000000.tokens.npy"]


def test_a_finished_unit_of_another_span_is_refused_not_reused(tmp_path):
    """Unit files are matched by index: a unit 0 cut differently (another packer version's _work/)
    must not stand in for this unit 0, which would lose documents silently."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(f'{{"text": "doc {i}"}}\n' for i in range(50)), encoding="utf-8")
    info, work = tokenizer_info(TOKENIZER, BuildConfig()), tmp_path / "work"
    work.mkdir()
    small, whole = plan_units([str(corpus)], 100), plan_units([str(corpus)], 1 << 20)
    tokenize_unit(small[0], info, BuildConfig(), work)
    assert tokenize_unit(small[0], info, BuildConfig(), work)["end"] == small[0].end  # the same unit: reused
    with pytest.raises(ValueError, match=r"holds another unit .* pass --overwrite"):
        tokenize_unit(whole[0], info, BuildConfig(), work)


def test_interrupted_unit_leaves_no_files(tmp_path, monkeypatch):
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts()[:3000]))
    calls = []

    def stop_on_second(*args, real=text._start, **kwargs):  # the second batch's encode
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(text, "_start", stop_on_second)
    work = tmp_path / "w"
    work.mkdir()
    (unit,) = plan_units([str(path)], 10**9)
    with pytest.raises(KeyboardInterrupt):
        tokenize_unit(unit, tokenizer_info(TOKENIZER, BuildConfig()), BuildConfig(), work)
    assert len(calls) == 2 and list(work.iterdir()) == []


def test_tokenizer_by_name_from_the_local_cache_only(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "tokenizer.json").write_bytes(open(TOKENIZER, "rb").read())
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_tokenizer("org/tiny") == str(snap / "tokenizer.json")
    assert resolve_tokenizer(str(snap)) == str(snap / "tokenizer.json")
    info = tokenizer_info("org/tiny", BuildConfig())
    assert info.path == str(snap / "tokenizer.json") and info.eos_id is not None
    with pytest.raises(FileNotFoundError, match="not in the local HF cache .*give the path of a local tokenizer.json"):
        resolve_tokenizer("org/absent")


def test_config_checks_the_new_fields():
    for bad in (dict(text_split="lines"), dict(on_file_error="ignore"), dict(max_doc_bytes=0)):
        with pytest.raises(ValueError):
            dataclasses.replace(BuildConfig(), **bad)


def test_prefix_sums_in_chunks_equal_a_full_cumulative_sum(monkeypatch):
    assert prefix_sums(np.array([0, 1, 1, 0, 1], np.uint8), np.array([5, 0, 3])).tolist() == [3, 0, 2]
    monkeypatch.setattr(tokenize, "SUM_CHUNK", 7)  # points on, before and after chunk edges
    rng = np.random.default_rng(0)
    for n in (0, 1, 6, 7, 8, 14, 50, 333):
        mask = rng.integers(0, 2, n).astype(np.uint8)
        points = rng.integers(0, n + 1, rng.integers(1, 40))
        full = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
        assert prefix_sums(mask, points).tolist() == full[points].tolist(), (n, points)
        assert prefix_sums(mask, np.array([n, 0, n])).tolist() == [full[-1], 0, full[-1]]
