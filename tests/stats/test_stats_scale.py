"""Finalize's stats from bounded summaries (packer/stats/streamed.py) against the same figures from whole
arrays (packer/stats/figures.py): integers and order statistics exactly, means and correlations within 1e-12."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import SAMPLE_INPUTS, TOKENIZER

from packer.config import BuildConfig, Job, Source
from packer.preprocess.pipeline import build
from packer.stats import figures, streamed
from packer.stats.streamed import Histogram, SequenceSums
from packer.store.dataset import open_dataset

# Floats that come from sums (numpy's pairwise float sums against exact integer ones); every other float is exact.
FROM_SUMS = ("mean", "fill_by_group", "fill_correlation", "docs_correlation")


def _differences(a, b, path="$", from_sums=False) -> list[str]:
    """Where a and b differ: type, keys, lengths, integers, or floats (exactly, or beyond 1e-12 relative
    under a key of FROM_SUMS)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{path}.{k}", from_sums or k in FROM_SUMS)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]", from_sums)]
    if type(a) is not type(b):
        return [f"{path}: {a!r} ({type(a).__name__}) != {b!r} ({type(b).__name__})"]
    if isinstance(a, float) and from_sums:
        return [] if math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _json(x):
    return json.loads(json.dumps(x))


def _web_lengths(n: int, seed: int) -> np.ndarray:
    """Web-like lengths: lognormal, median ~400, some over a context of 4096, a few very long."""
    rng = np.random.default_rng(seed)
    x = np.maximum(rng.lognormal(6.0, 1.0, n), 1).astype(np.int64)
    x[rng.integers(n, size=max(n // 10_000, 1))] = rng.integers(10**5, 10**7, size=max(n // 10_000, 1))
    return x


def test_histogram_of_parts_is_the_unique_counts_of_all():
    rng = np.random.default_rng(0)
    for dense in (True, False):
        parts = [rng.integers(1, 50 if dense else 10**9, size=rng.integers(0, 3000)) for _ in range(12)]
        everything = np.concatenate(parts)
        values, counts = np.unique(everything, return_counts=True)
        h = streamed.length_histogram(parts)
        np.testing.assert_array_equal(h.values, values)
        np.testing.assert_array_equal(h.counts, counts)
        assert (h.n, h.total) == (len(everything), int(everything.sum()))
    hand = Histogram.of([3, 10, 5]).merged(Histogram.of([5, 3]))
    assert (hand.values.tolist(), hand.counts.tolist()) == ([3, 5, 10], [2, 2, 1])
    assert streamed.length_histogram([]).n == 0


def test_histogram_percentiles_equal_the_sorted_arrays():
    rng = np.random.default_rng(1)
    qs = (0, 1, 25, 50, 90, 99, 100)
    for trial in range(300):
        x = rng.integers(1, rng.choice([2, 10, 1000, 10**6]), size=rng.integers(1, 500))
        if trial % 3 == 0:  # floats too: fill rates t / L
            x = x / 1000
        values, counts = np.unique(x, return_counts=True)
        expected = figures.percentiles(x, qs)
        got = streamed.histogram_percentiles(values, counts, expected["mean"], qs)
        assert got == expected and type(got["max"]) is type(expected["max"])
    # zero counts (a bincount's empty values) are skipped, not read as values
    assert streamed.histogram_percentiles(np.arange(5), np.array([0, 2, 0, 1, 0]), 0.0, (100,))["max"] == 3


def test_length_figures_and_strategies_from_the_histogram_are_exact():
    for seed, L in [(0, 8), (1, 64), (2, 4096)]:
        x = _web_lengths(20_000, seed) % (20 * L) + 1
        s, h = np.sort(x), Histogram.of(x)
        assert streamed.histogram_length_figures(h, L) == figures.length_figures(s, L)
        np.testing.assert_array_equal(streamed.histogram_rows(h, L), figures.row_histogram(s, L))
        for batch in (1, 3, 8):
            assert streamed.histogram_strategies(h, L, batch) == figures.padding_strategies(s, L, batch, {})


def _buckets(n: int, rng) -> list[int]:
    cuts = np.sort(rng.integers(0, n + 1, size=rng.integers(0, 8)))
    return np.diff(np.concatenate([[0], cuts, [n]])).tolist()


def _sums(tokens, docs, split, L, rng) -> SequenceSums:
    sums = SequenceSums(len(tokens), L)
    a = 0
    for m in _buckets(len(tokens), rng):
        sums.add(tokens[a : a + m].astype(np.int32), docs[a : a + m].astype(np.int32), split[a : a + m].astype(np.int32))
        a += m
    return sums


def test_sequence_sums_of_two_buckets_by_hand():
    sums = SequenceSums(3, 8)
    sums.add(np.array([8, 5], np.int32), np.array([1, 2], np.int32), np.array([1, 0], np.int32))
    sums.add(np.array([7], np.int32), np.array([3], np.int32), np.array([0], np.int32))
    assert sums.token_counts.tolist() == [0, 0, 0, 0, 0, 1, 0, 1, 1] and sums.doc_counts.tolist() == [0, 1, 1, 1]
    assert (sums.pos_tokens, sums.pos_docs, sums.single_split) == (19, 8, 1)
    trend = sums.composition()["trend_output_order"]
    assert trend["fill_by_group"] == [1.0, 0.625, 0.875] and trend["docs_by_group"] == [1.0, 2.0, 3.0]
    assert trend["docs_correlation"] == pytest.approx(1.0)
    assert trend["fill_correlation"] == pytest.approx(-1 / math.sqrt(2 * 14 / 3))  # covariance -1, variances 2 and 14/3


def test_sequence_sums_give_the_composition_of_the_arrays():
    rng = np.random.default_rng(2)
    exercised = 0
    for trial in range(60):
        L = int(rng.choice([8, 100, 4096]))
        n = int(rng.choice([0, 1, 2, 11, 1000, 50_000]))
        tokens = np.minimum(L - rng.integers(0, L // 4 + 1, size=n) + np.arange(n) // max(n // 3, 1), L)
        if trial % 7 == 0:
            tokens = np.full(n, L)  # constant fill: no correlation
        docs = rng.integers(1, 30, size=n)
        split = (rng.random(n) < 0.1).astype(np.int64)
        docs[split == 1] = rng.integers(1, 3, size=int(split.sum()))
        expected = figures.composition(docs, tokens, (docs == 1) & (split == 1), L)
        got = _sums(tokens, docs, split, L, rng).composition()
        assert _differences(_json(got), _json(expected)) == []
        exercised += expected["trend_output_order"]["fill_correlation"] is not None and expected["single_split_piece_share"] > 0
    assert exercised > 20


@dataclass
class _Plan:
    """What finalize_stats reads of a packer.preprocess.plan_groups.PlanIndex, over arrays."""

    parts: list
    n_tokens: int
    piece_sq_sum: int

    @property
    def n_sequences(self):
        return sum(len(p["seq_tokens"]) for p in self.parts)

    def bucket_stats(self, plan_dir):
        return iter(self.parts)

    def sequence_stats(self, plan_dir):
        keys = ("seq_tokens", "seq_docs", "seq_split", "seq_sq")
        return {k: np.concatenate([p[k] for p in self.parts]).astype(np.int64) for k in keys}


def _plan_of(lengths, L, rng) -> _Plan:
    """Sequences of a greedy next-fit over the pieces of `lengths` (any packing will do here), cut into buckets."""
    from packer.binpack import split_documents

    piece_doc, _, piece_len = split_documents(lengths, L)
    fill = np.cumsum(piece_len)
    seq = (fill - 1) // L  # piece -> sequence under a crude cut (pieces straddling a cut go to the later one)
    n = int(seq[-1]) + 1
    tokens = np.bincount(seq, weights=piece_len, minlength=n).astype(np.int64)
    tokens = np.minimum(tokens, L)  # close enough for a fake plan: finalize reads only the summaries
    docs = np.bincount(seq, minlength=n)
    split = np.bincount(seq, weights=lengths[piece_doc] > L, minlength=n).astype(np.int64)
    sq = np.bincount(seq, weights=piece_len.astype(np.float64) ** 2, minlength=n).astype(np.int64)
    perm = rng.permutation(n)
    tokens, docs, split, sq = tokens[perm], docs[perm], split[perm], sq[perm]
    parts, a = [], 0
    for m in _buckets(n, rng):
        parts.append({"seq_tokens": tokens[a : a + m].astype(np.int32), "seq_docs": docs[a : a + m].astype(np.int32),
                      "seq_split": split[a : a + m].astype(np.int32), "seq_sq": sq[a : a + m]})
        a += m
    return _Plan(parts, int(tokens.sum()), int((piece_len.astype(np.int64) ** 2).sum()))


def test_finalize_stats_streamed_equals_arrays_on_a_million_documents(monkeypatch):
    """Both of finalize's paths on 1M web-like documents in 37 units, the streamed one forced by a lowered
    threshold: integers and order statistics equal, means and correlations within 1e-12 relative."""
    rng = np.random.default_rng(3)
    L = 4096
    units = [_web_lengths(int(m), u) for u, m in enumerate(rng.multinomial(1_000_000, np.ones(37) / 37))]
    plan = _plan_of(np.concatenate(units), L, rng)
    assert len(plan.parts) > 1 and plan.n_sequences > 100_000

    def run():
        return streamed.finalize_stats(lambda: iter(units), plan, None, L, algorithm="ffd", seed=0,
                                       n_documents=1_000_000, inputs=["a.jsonl"])

    arrays = run()
    monkeypatch.setattr(streamed, "STREAM_ABOVE", 10**5)
    summaries = run()
    assert _differences(_json(summaries), _json(arrays)) == []
    assert summaries["packing"]["trend_output_order"]["fill_correlation"] is not None
    assert summaries["lengths"]["long_documents_share"] > 0
    assert summaries["step_balance"] == arrays["step_balance"] and len(arrays["step_balance"]["cases"]) == 4


@pytest.mark.parametrize("long_docs", ["split", "drop"])
def test_a_build_above_the_threshold_writes_the_same_stats_and_manifest(tmp_path, monkeypatch, long_docs):
    """A whole build (named sources, 3 groups) with the streamed path forced: its stats.json matches the
    arrays' (floats from sums within 1e-12), its manifest (per-source documents included) is the same."""
    sources = (Source(name="prose", inputs=(SAMPLE_INPUTS[0],)), Source(name="code", inputs=(SAMPLE_INPUTS[1],)))

    def run(out):
        config = BuildConfig(context_length=256, shard_size=20_000, pack_group=300, long_docs=long_docs)
        return build(Job(inputs=(), sources=sources, tokenizer=TOKENIZER, output=str(out), workers=1, config=config))

    arrays = run(tmp_path / "arrays")
    monkeypatch.setattr(streamed, "STREAM_ABOVE", 0)
    summaries = run(tmp_path / "summaries")
    drop = ("created_unix", "build_seconds", "tokenizer")
    assert {k: v for k, v in summaries.items() if k not in drop} == {k: v for k, v in arrays.items() if k not in drop}
    a, s = (json.loads((tmp_path / d / "stats.json").read_text()) for d in ("arrays", "summaries"))
    assert _differences(s, a) == []
    assert s["packing"]["sequences"] > 10 and len(s["sources"]) == 2
    dropped = sum(x["docs_accepted"] - x["documents"] for x in summaries["sources"])
    assert (dropped > 0) == (long_docs == "drop")
    ds = open_dataset(tmp_path / "summaries")  # each source's documents: the distinct documents its segments hold
    seg_source = np.concatenate(ds.source_views(np.arange(len(ds))))
    stored = [len(np.unique(ds.doc_ids()[seg_source == i])) for i in range(2)]
    assert [x["documents"] for x in summaries["sources"]] == stored
