"""The mixture report: shares, repetition and epochs of a blend, against hand computations."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_INPUTS, TOKENIZER

from packer.cli import main
from packer.stats.mixture import mixture, parse_mix, parse_weights

WEB = {"name": "web", "sequences": 1000, "tokens": 2_000_000}
CODE = {"name": "code", "sequences": 100, "tokens": 150_000}


def test_by_sequences_against_the_worked_example():
    m = mixture([WEB, CODE], {"web": 7, "code": 3}, budget_tokens=10_000_000)  # any scale: 7:3 is 0.7/0.3
    web, code = m["sources"]
    assert (web["weight"], code["weight"]) == pytest.approx((0.7, 0.3))
    assert m["num_samples"] == 1100
    assert (web["drawn"], code["drawn"]) == pytest.approx((770, 330))
    assert (web["repetition"], code["repetition"]) == pytest.approx((0.77, 3.3))
    assert web["token_share"] == pytest.approx(1400 / 1850) and code["token_share"] == pytest.approx(450 / 1850)
    assert m["budget_samples"] == pytest.approx(10_000_000 / 1850)
    assert web["epochs"] == pytest.approx(0.7 * 10_000_000 / 1850 / 1000)
    assert code["epochs"] == pytest.approx(0.3 * 10_000_000 / 1850 / 100)
    assert web["budget_tokens"] + code["budget_tokens"] == pytest.approx(10_000_000)


def test_by_tokens_the_weights_are_the_token_shares():
    m = mixture([WEB, CODE], {"web": 0.5, "code": 0.5}, mix_by="tokens", num_samples=7000, budget_tokens=3_500_000)
    web, code = m["sources"]
    assert (web["token_share"], code["token_share"]) == pytest.approx((0.5, 0.5))
    # equal tokens from rows of 2000 and 1500 tokens: sequences in the ratio 1/2000 : 1/1500 = 3 : 4
    assert (web["sequence_share"], code["sequence_share"]) == pytest.approx((3 / 7, 4 / 7))
    assert (web["drawn"], code["drawn"]) == pytest.approx((3000, 4000))
    assert (web["repetition"], code["repetition"]) == pytest.approx((3.0, 40.0))
    assert web["budget_tokens"] == pytest.approx(1_750_000)
    assert web["epochs"] == pytest.approx(1_750_000 / 2_000_000) and code["epochs"] == pytest.approx(1_750_000 / 150_000)


def test_a_zero_or_missing_weight_leaves_a_source_out():
    for weights in ({"web": 1, "code": 0}, {"web": 1}):
        m = mixture([WEB, CODE], weights, budget_tokens=4000)
        assert m["sources"][1]["token_share"] == 0 and m["sources"][1]["epochs"] == 0
        assert m["sources"][0]["epochs"] == pytest.approx(2 / 1000)


def test_shares_are_whole_counts_of_the_period_as_the_loader_blends():
    """An epoch of 7 sequences at 1:1 is 4 + 3 (largest remainder, the tie to the first source), not 3.5 + 3.5."""
    a, b = {"name": "a", "sequences": 3, "tokens": 30}, {"name": "b", "sequences": 4, "tokens": 80}
    m = mixture([a, b], {"a": 1, "b": 1})
    assert m["num_samples"] == 7
    assert [s["drawn"] for s in m["sources"]] == pytest.approx([4, 3])
    assert [s["sequence_share"] for s in m["sources"]] == pytest.approx([4 / 7, 3 / 7])
    assert m["sources"][0]["token_share"] == pytest.approx(4 * 10 / (4 * 10 + 3 * 20))
    assert [s["repetition"] for s in m["sources"]] == pytest.approx([4 / 3, 3 / 4])


@pytest.mark.parametrize("weights, kwargs, message", [
    ({"web": 1, "code": 1, "books": 1}, {}, "books"), ({"web": -1, "code": 1}, {}, ">= 0"),
    ({"web": 0, "code": 0}, {}, "not all 0"), ({"web": 1, "code": 1e-4}, {"num_samples": 1000}, "never be read"),
])
def test_bad_weights_are_refused(weights, kwargs, message):
    with pytest.raises(ValueError, match=message):
        mixture([WEB, CODE], weights, **kwargs)


def test_parsing_weights_and_mixes():
    assert parse_weights("web=0.7, code=0.3") == {"web": 0.7, "code": 0.3}
    assert parse_mix(["web=s3://b/web?region=x:0.7", "code=out/code:1", "books=s3://b/books"]) == (
        {"web": "s3://b/web?region=x", "code": "out/code", "books": "s3://b/books"}, {"web": 0.7, "code": 1.0})
    for bad in ("web", "web=x", "=1"):
        with pytest.raises(ValueError, match="NAME=WEIGHT"):
            parse_weights(bad)
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_mix(["web"])


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    from packer.config import BuildConfig, Job, Source
    from packer.preprocess.pipeline import build

    d = tmp_path_factory.mktemp("mix")
    for name, path, n in (("prose", SAMPLE_INPUTS[0], 1000), ("code", SAMPLE_INPUTS[1], 15)):
        with open(path, encoding="utf-8") as f:
            (d / f"{name}.jsonl").write_text("".join(f.readlines()[:n]), encoding="utf-8")
    sources = tuple(Source(name=name, inputs=(str(d / f"{name}.jsonl"),)) for name in ("prose", "code"))
    build(Job(inputs=(), sources=sources, tokenizer=TOKENIZER, output=str(d / "ds"), workers=1,
              config=BuildConfig(context_length=512)))
    return d / "ds"


def _stored_sizes(path) -> dict:
    """Rows and tokens of each source, counted from the stored rows (not from the manifest)."""
    from packer.store.dataset import open_dataset

    ds = open_dataset(path)
    rows = np.arange(len(ds))
    tokens, _ = ds.views(rows)
    first = [int(s[0]) for s in ds.source_views(rows)]
    names = [s["name"] for s in ds.manifest["sources"]]
    return {name: (first.count(i), sum(len(t) for t, f in zip(tokens, first) if f == i)) for i, name in enumerate(names)}


def test_packer_stats_weights_on_a_built_dataset(two_sources, tmp_path):
    sizes = _stored_sizes(two_sources)
    (n_p, t_p), (n_c, t_c) = sizes["prose"], sizes["code"]
    assert n_p > 0 and n_c > 0
    result = CliRunner().invoke(main, ["stats", str(two_sources), "--weights", "prose=0.7,code=0.3",
                                       "--budget-tokens", "5000000", "--json", str(tmp_path / "m.json"),
                                       "--html", str(tmp_path / "m.html")])
    assert result.exit_code == 0, result.output
    m = json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))
    prose, code = m["sources"]
    S = n_p + n_c
    a_p = math.floor(0.7 * S + 0.5)  # whole sequences of the epoch: 0.7 S rounded, a tie to the first source
    a_c = S - a_p
    per_sample = (a_p * t_p / n_p + a_c * t_c / n_c) / S
    assert (prose["sequences"], prose["tokens"], code["sequences"], code["tokens"]) == (n_p, t_p, n_c, t_c)
    assert (prose["drawn"], code["drawn"]) == pytest.approx((a_p, a_c))
    assert prose["repetition"] == pytest.approx(a_p / n_p) and code["repetition"] == pytest.approx(a_c / n_c)
    assert code["token_share"] == pytest.approx(a_c / S * t_c / n_c / per_sample)
    assert code["epochs"] == pytest.approx(a_c / S * 5_000_000 / per_sample / n_c)
    assert "prose" in result.output and "repetition" in result.output and "epochs" in result.output
    assert "packer mixture" in (tmp_path / "m.html").read_text(encoding="utf-8")


def test_packer_stats_mix_of_several_datasets(sample_dataset, tmp_path):
    from packer.store.manifest import read_manifest

    totals = read_manifest(sample_dataset)["totals"]
    result = CliRunner().invoke(main, ["stats", "--mix", f"a={sample_dataset}:1", "--mix", f"b={sample_dataset}:3",
                                       "--mix-by", "tokens", "--json", str(tmp_path / "m.json")])
    assert result.exit_code == 0, result.output
    a, b = json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))["sources"]
    n = totals["sequences"]
    assert a["sequences"] == b["sequences"] == n and a["tokens"] == totals["tokens_out"]
    # the same rows on both sides: token shares are sequence shares, 1:3 of an epoch of 2n, whole sequences
    drawn_a = math.floor(0.25 * 2 * n + 0.5)
    assert (a["token_share"], b["token_share"]) == pytest.approx((drawn_a / (2 * n), 1 - drawn_a / (2 * n)))
    assert b["repetition"] == pytest.approx((2 * n - drawn_a) / n)  # about 1.5: 3/4 of two datasets' rows from one


def test_a_dataset_with_named_sources_brings_them_to_a_mix(sample_dataset, two_sources, tmp_path):
    """As PackedDataset({"all": A, "x": B}, weights=...): B's named sources are sources of the blend,
    weighted by their names; every source is drawn within one sequence of its share of the epoch."""
    from packer.store.manifest import read_manifest

    result = CliRunner().invoke(main, ["stats", "--mix", f"all={sample_dataset}:2", "--mix", f"x={two_sources}",
                                       "--weights", "prose=1,code=1", "--json", str(tmp_path / "m.json")])
    assert result.exit_code == 0, result.output
    m = json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in m["sources"]] == ["all", "prose", "code"]
    rows = read_manifest(sample_dataset)["totals"]["sequences"] + read_manifest(two_sources)["totals"]["sequences"]
    assert m["num_samples"] == rows == sum(s["sequences"] for s in m["sources"])
    assert sum(s["drawn"] for s in m["sources"]) == pytest.approx(rows)
    for s, share in zip(m["sources"], (0.5, 0.25, 0.25)):
        assert abs(s["drawn"] - share * rows) < 1 and s["drawn"] == pytest.approx(round(s["drawn"]))
    twice = CliRunner().invoke(main, ["stats", "--mix", f"a={two_sources}", "--mix", f"b={two_sources}"])
    assert twice.exit_code == 1 and "more than one dataset" in twice.output


def test_weights_on_a_dataset_without_sources_say_what_to_do(sample_dataset):
    result = CliRunner().invoke(main, ["stats", str(sample_dataset), "--weights", "a=1"])
    assert result.exit_code == 1 and "--source NAME=PATH" in result.output
