"""Padding statistics: every figure against hand-computed small cases, the raw-corpus and the
built-dataset forms against each other, the JSON schema, and the `packer stats` command."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_INPUTS, TOKENIZER, schema_errors

from packer.binpack import pack
from packer.cli import main
from packer.config import BuildConfig
from packer.preprocess.corpus import corpus_lengths
from packer.stats import figures as st


def _roundtrip(figures):
    return json.loads(json.dumps(figures))


class _Rows:
    """A stand-in dataset reader: rows given by their offsets, no shard files (so no doc_ids)."""

    def __init__(self, offsets, context_length):
        self._offsets = [np.asarray(o, dtype=np.int32) for o in offsets]
        self.manifest = {"config": {"context_length": context_length, "algorithm": "ffd"}, "shards": []}

    def __len__(self):
        return len(self._offsets)

    def __getitem__(self, i):
        o = self._offsets[i]
        return np.zeros(int(o[-1]), np.uint16), o


# ---- hand cases: documents [3, 10, 5], context 8 (the module docstring's example) ----

def test_strategies_hand_case():
    f = st.corpus_stats([3, 10, 5], 8, batch_size=2)
    s = f["strategies"]
    # rows: [3] [8 2] [5]; 18 tokens
    assert s["pad_to_context"] == {"sequences": 4, "compute_slots": 32, "tokens_kept": 18,
                                   "padding_share": 14 / 32, "tokens_lost": 0, "tokens_lost_share": 0.0}
    # sorted rows [2 3 | 5 8] -> 2*3 + 2*8
    assert s["pad_sorted_batches"]["compute_slots"] == 22
    assert s["pad_sorted_batches"]["padding_share"] == pytest.approx(4 / 22)
    assert s["truncate"] == {"sequences": 3, "compute_slots": 24, "tokens_kept": 16,
                             "padding_share": pytest.approx(8 / 24), "tokens_lost": 2, "tokens_lost_share": 2 / 18}
    for name in ("pack_ffd", "pack_bfd"):  # [8] [5 3] [2]
        assert s[name]["sequences"] == 3 and s[name]["compute_slots"] == 24
        assert s[name]["padding_share"] == 6 / 24 and s[name]["fill_rate"] == 18 / 24
        assert s[name]["lower_bound"] == 3 and s[name]["bins_over_lower_bound"] == 0
    assert f["attention"] == {"dense_causal": 96.0, "block_causal": 51.0, "saving_share": 45 / 96}


def test_sorted_batches_with_a_remainder_batch():
    s = st.corpus_stats([3, 10, 5], 8, batch_size=3)["strategies"]
    assert s["pad_sorted_batches"]["compute_slots"] == 3 * 5 + 1 * 8  # [2 3 5] [8]


def test_random_batches_hand_cases():
    lengths = [1, 1, 1, 4]
    s = st.corpus_stats(lengths, 8, batch_size=2)["strategies"]
    assert s["pad_random_batches"]["compute_slots"] == pytest.approx(2 * 4 + 2 * 1)  # the 4 sits with a 1, always
    s1 = st.corpus_stats(lengths, 8, batch_size=1)["strategies"]
    assert s1["pad_random_batches"]["compute_slots"] == pytest.approx(7)  # no padding with batches of one
    s9 = st.corpus_stats(lengths, 8, batch_size=9)["strategies"]
    assert s9["pad_random_batches"]["compute_slots"] == pytest.approx(4 * 4)  # one batch, padded to 4
    # rows [3] [8 2] [5] in pairs: E[longest of 2] = (3+5+8+5+8+8)/6 = 37/6, two batches of two
    s2 = st.corpus_stats([3, 10, 5], 8, batch_size=2)["strategies"]
    assert s2["pad_random_batches"]["compute_slots"] == pytest.approx(4 * 37 / 6)


def test_random_batches_equal_the_mean_over_every_deal():
    rng = np.random.default_rng(3)
    short_last = 0
    for _ in range(6):
        lengths = rng.integers(1, 17, size=int(rng.integers(2, 5)))  # at most 8 rows of L = 8
        B = int(rng.integers(2, 5))
        rows = st.split_documents(lengths, 8)[2].tolist()
        deals = list(itertools.permutations(rows))
        mean = sum(sum(len(p[i : i + B]) * max(p[i : i + B]) for i in range(0, len(p), B)) for p in deals) / len(deals)
        got = st.corpus_stats(lengths, 8, batch_size=B)["strategies"]["pad_random_batches"]["compute_slots"]
        assert got == pytest.approx(mean, rel=1e-9)
        short_last += len(rows) % B != 0
    assert short_last  # a short last batch was exercised


def test_row_histogram_and_sorted_batches_equal_slow_versions():
    rng = np.random.default_rng(11)
    for _ in range(20):
        lengths = rng.integers(1, 60, size=int(rng.integers(1, 40)))
        L, B = int(rng.integers(1, 20)), int(rng.integers(1, 6))
        rows = st.split_documents(lengths, L)[2]
        counts = st.row_histogram(np.sort(lengths), L)
        assert counts.tolist() == np.bincount(rows, minlength=L + 1).tolist()
        s = sorted(rows.tolist())
        slow = sum(len(s[i : i + B]) * max(s[i : i + B]) for i in range(0, len(s), B))
        assert st.sorted_batch_slots(counts, B) == slow


def test_lengths_hand_case():
    f = st.corpus_stats([20, 1, 3, 2, 10], 8)["lengths"]
    assert f["documents"] == 5 and f["tokens"] == 36
    assert f["percentiles"] == {"p50": 3.0, "p90": 16.0, "p99": 19.6, "max": 20, "mean": 7.2}
    assert f["long_documents_share"] == 2 / 5 and f["long_tokens_share"] == 30 / 36
    edges, counts = f["histogram"]["edges"], f["histogram"]["counts"]
    assert edges[0] == 1 and edges[-1] == 21 and len(counts) == len(edges) - 1
    slow = [sum(a <= x < b for x in [20, 1, 3, 2, 10]) for a, b in zip(edges[:-1], edges[1:])]
    assert counts == slow and sum(counts) == 5


def test_percentiles_equal_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 1000):
        x = rng.integers(1, 10_000, size=n)
        got = st.percentiles(x, (0, 25, 50, 90, 99, 100))
        want = np.percentile(x, [0, 25, 50, 90, 99, 100])
        assert [got[k] for k in ("p0", "p25", "p50", "p90", "p99", "p100")] == pytest.approx(want.tolist())
        assert got["max"] == x.max() and got["mean"] == pytest.approx(x.mean())


def test_pack_composition_hand_case():
    f = st.corpus_stats([3, 10, 5], 8, seed=0)
    pk = f["packing"]
    # packing order: [8 (piece of the 10)] [5 3] [2 (piece of the 10)]
    assert pk["sequences"] == 3 and pk["tokens"] == 18 and pk["fill_rate"] == 0.75 and pk["lower_bound"] == 3
    assert pk["docs_per_sequence"] == {"p50": 1.0, "p90": 1.8, "p99": 1.98, "max": 2, "mean": 4 / 3}
    assert pk["single_split_piece_share"] == 2 / 3
    assert pk["fill_rate_percentiles"]["max"] == 1.0 and pk["fill_rate_percentiles"]["mean"] == 0.75
    assert sum(pk["fill_histogram"]["counts"]) == 3 and pk["fill_histogram"]["counts"][-1] == 2
    t = pk["trend_packing_order"]
    assert t["fill_by_group"] == [1.0, 1.0, 0.25] and t["docs_by_group"] == [1.0, 2.0, 1.0]
    assert t["fill_correlation"] == pytest.approx(-math.sqrt(3) / 2) and t["docs_correlation"] == pytest.approx(0.0)
    out = pk["trend_output_order"]  # a shuffle of the same sequences
    assert sorted(out["fill_by_group"]) == [0.25, 1.0, 1.0] and sorted(out["docs_by_group"]) == [1.0, 1.0, 2.0]
    assert pk["trend_noise_level"] == 2 / math.sqrt(3)


def test_constant_fill_has_no_correlation():
    pk = st.corpus_stats([4, 4, 4, 4], 4)["packing"]
    assert pk["trend_output_order"]["fill_correlation"] is None and pk["fill_rate"] == 1.0
    assert pk["single_split_piece_share"] == 0.0  # a document exactly L long is not split


def test_shuffle_removes_the_trend_packing_order_has():
    lengths = np.random.default_rng(1).lognormal(4.5, 1.2, size=3000).astype(np.int64) + 1
    beyond = 0
    for seed in range(8):
        pk = st.corpus_stats(lengths, 1024, seed=seed, algorithms=("ffd",))["packing"]
        noise = pk["trend_noise_level"]
        assert pk["sequences"] > 200 and pk["trend_packing_order"]["docs_correlation"] > 3 * noise
        beyond += abs(pk["trend_output_order"]["docs_correlation"]) > noise
    assert beyond <= 2  # |r| < 2/sqrt(n) holds for ~95% of shuffles


def test_pack_counts_equal_binpack():
    rng = np.random.default_rng(7)
    for _ in range(5):
        lengths = rng.integers(1, 300, size=200)
        s = st.corpus_stats(lengths, 128)["strategies"]
        pieces = st.split_documents(lengths, 128)[2]
        for a in ("ffd", "bfd"):
            assert s[f"pack_{a}"]["sequences"] == int(pack(pieces, 128, a).max()) + 1


def test_dataset_without_doc_ids_counts_segments():
    f = st.dataset_stats(_Rows([[0, 8], [0, 5, 8], [0, 2]], 8))
    assert f["source"]["documents_from"] == "segments" and f["lengths"]["documents"] == 4
    pk = f["packing"]
    assert pk["source"] == "dataset" and pk["sequences"] == 3 and pk["fill_rate"] == 18 / 24
    assert pk["trend_output_order"]["fill_by_group"] == [1.0, 1.0, 0.25]  # stored order, as is
    assert pk["trend_packing_order"] is None
    assert pk["single_split_piece_share"] == 1 / 3  # only the full-context segment alone
    assert f["attention"]["block_causal"] == 51.0
    assert schema_errors(_roundtrip(f)) == []


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="no documents"):
        st.corpus_stats([], 8)
    with pytest.raises(ValueError, match=">= 1"):
        st.corpus_stats([3, 0], 8)
    with pytest.raises(ValueError, match="integer"):
        st.corpus_stats([1.5], 8)


# ---- schema ----

def test_figures_match_the_schema_and_the_checker_can_fail():
    f = _roundtrip(st.corpus_stats([3, 10, 5, 700, 1], 64, sample={"documents": 5, "of_documents": 9, "seed": 1}))
    assert schema_errors(f) == []
    assert schema_errors(_roundtrip(st.corpus_stats([3, 10], 8, algorithms=()))) == []
    bad = json.loads(json.dumps(f))
    del bad["lengths"]["tokens"]
    bad["strategies"]["truncate"]["padding_share"] = 1.5
    bad["packing"]["sequences"] = "3"
    bad["extra"] = 1
    errors = schema_errors(bad)
    assert len(errors) == 4, errors
    assert any("'tokens' is a required property" in e for e in errors)
    assert any("1.5 is greater than the maximum of 1" in e for e in errors)


# ---- real corpus: tokenized now, and built ----

@pytest.fixture(scope="module")
def sample_lengths():
    lengths, sampled = corpus_lengths(SAMPLE_INPUTS, TOKENIZER, BuildConfig())
    assert sampled is None
    return lengths


def test_corpus_lengths_count_what_build_counts(sample_dataset, sample_lengths):
    from packer.store.dataset import open_dataset

    totals = open_dataset(sample_dataset).manifest["totals"]
    lengths = sample_lengths
    assert len(lengths) == totals["docs_accepted"] and lengths.sum() == totals["tokens_in"]
    part, info = corpus_lengths(SAMPLE_INPUTS, TOKENIZER, BuildConfig(), sample=300, seed=4)
    no_eos, _ = corpus_lengths(SAMPLE_INPUTS, TOKENIZER, BuildConfig(eos=False), sample=300, seed=4)
    assert np.array_equal(no_eos, part - 1)  # the same documents, one end-of-text token fewer
    with_bos, _ = corpus_lengths(SAMPLE_INPUTS, TOKENIZER, BuildConfig(bos=True, bos_token="<|endoftext|>"),
                                 sample=300, seed=4)
    assert np.array_equal(with_bos, part + 1)
    assert info == {"documents": 300, "of_documents": len(lengths), "seed": 4}
    assert not Counter(part.tolist()) - Counter(lengths.tolist())  # a sub-multiset
    again, _ = corpus_lengths(SAMPLE_INPUTS, TOKENIZER, BuildConfig(), sample=300, seed=4)
    other, _ = corpus_lengths(SAMPLE_INPUTS, TOKENIZER, BuildConfig(), sample=300, seed=5)
    assert np.array_equal(part, again) and not np.array_equal(part, other)
    everything, info = corpus_lengths(SAMPLE_INPUTS, TOKENIZER, BuildConfig(), sample=len(lengths), seed=4)
    assert np.array_equal(everything, lengths) and info is None  # a sample of all is all, in input order


def test_corpus_sample_is_uniform_and_in_input_order(tmp_path):
    """Every document is picked with probability sample / n, across units; picks keep input order."""
    from packer.preprocess.corpus import _sample_texts
    from packer.preprocess.readers import plan_units

    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(10)))
    units = plan_units([str(path)], 40)
    assert len(units) > 3
    counts = Counter()
    for seed in range(1000):
        picked, n_docs = _sample_texts(units, BuildConfig(), 3, seed)
        assert n_docs == 10 and len(picked) == 3
        assert picked == sorted(picked, key=lambda t: int(t.split()[1]))
        counts.update(picked)
    assert len(counts) == 10 and all(abs(n - 300) < 75 for n in counts.values()), counts  # 300 +- 5 sigma


def _assert_close(a, b, where):
    """Equal within float tolerance, through nested dicts and lists (pytest.approx takes no nesting)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{where}[{i}]")
    else:
        assert a == pytest.approx(b), where


def test_dataset_figures_equal_the_raw_corpus_figures(sample_dataset, sample_lengths):
    from packer.store.dataset import open_dataset

    ds = open_dataset(sample_dataset)
    built = st.dataset_stats(ds, batch_size=4)
    raw = st.corpus_stats(sample_lengths, 1024, batch_size=4, seed=0)
    assert built["source"]["documents_from"] == "doc_ids" and len(ds.manifest["shards"]) > 1
    assert built["lengths"] == raw["lengths"] and "pack_bfd" not in built["strategies"]  # a dataset's own packing only
    assert built["strategies"] == {k: v for k, v in raw["strategies"].items() if k != "pack_bfd"}
    for key in ("sequences", "tokens", "fill_rate", "lower_bound", "docs_per_sequence",
                "single_split_piece_share", "fill_histogram", "trend_output_order"):
        _assert_close(built["packing"][key], raw["packing"][key], key)
    assert built["attention"] == pytest.approx(raw["attention"])
    assert schema_errors(_roundtrip(built)) == [] and schema_errors(_roundtrip(raw)) == []


def test_stats_command_both_forms(sample_dataset, tmp_path):
    runner = CliRunner()
    out = runner.invoke(main, ["stats", str(sample_dataset), "--json", str(tmp_path / "d.json")])
    assert out.exit_code == 0, out.output
    assert "pack, first-fit decreasing" in out.output and "dataset:" in out.output
    assert schema_errors(json.loads((tmp_path / "d.json").read_text())) == []
    raw = runner.invoke(main, ["stats", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--context-length", "1024",
                               "--sample", "500", "--json", str(tmp_path / "c.json")])
    assert raw.exit_code == 0, raw.output
    assert "seeded sample of 500 of 3,894 documents" in raw.output
    figures = json.loads((tmp_path / "c.json").read_text())
    assert figures["source"]["sample"]["documents"] == 500 and figures["lengths"]["documents"] == 500


def test_stats_command_errors(sample_dataset):
    runner = CliRunner()
    missing = runner.invoke(main, ["stats", *SAMPLE_INPUTS])
    assert missing.exit_code == 1 and "--tokenizer PATH and --context-length N" in missing.output
    mixed = runner.invoke(main, ["stats", str(sample_dataset), "--context-length", "8"])
    assert mixed.exit_code == 1 and "built dataset" in mixed.output


def test_build_writes_the_same_figures_as_stats_of_the_dataset(sample_dataset):
    from packer.store.dataset import open_dataset

    written = json.loads((sample_dataset / "stats.json").read_text(encoding="utf-8"))
    assert schema_errors(written) == []
    measured = st.dataset_stats(open_dataset(sample_dataset))
    assert set(written["strategies"]) == set(STRATEGIES_WITHOUT_BFD)  # the build packs once, with its algorithm
    for key in ("lengths", "packing", "attention"):
        assert written[key] == _roundtrip(measured[key]), key
    for key in STRATEGIES_WITHOUT_BFD:
        assert written["strategies"][key] == _roundtrip(measured["strategies"][key]), key


STRATEGIES_WITHOUT_BFD = tuple(s for s in st.STRATEGIES if s != "pack_bfd")
