"""`packer stats DIR` and its report show the step balance of the dataset's own rows: each step's slowest rank
against its mean, rows dealt in a seeded shuffle or by cost."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_INPUTS, TOKENIZER, schema_errors

from packer.balance import Balance, CostModel
from packer.binpack import pack, split_documents
from packer.cli import main
from packer.config import BuildConfig, Job
from packer.preprocess.pipeline import build
from packer.stats import report, streamed
from packer.stats import step_balance as sb
from packer.stats.figures import dataset_stats
from packer.stats.step_balance import RowSample, sampled_rows, step_balance
from packer.store.dataset import open_dataset


def _busy_by_loop(costs, ranks: int) -> float:
    """Busy fraction of one row a rank a step, by a plain loop: sum of step means / sum of step maxima."""
    mean = slowest = 0.0
    for s in range(len(costs) // ranks):
        step = list(costs[s * ranks:(s + 1) * ranks])
        mean, slowest = mean + sum(step) / ranks, slowest + max(step)
    return mean / slowest


def test_a_datasets_stats_have_the_table_and_the_report_shows_it(sample_dataset, tmp_path, monkeypatch):
    ds = open_dataset(sample_dataset)
    f = dataset_stats(ds)
    assert not schema_errors(f)
    table = f["step_balance"]
    assert [(c["ranks"], c["rows_per_rank"]) for c in table["cases"]] == [(8, 1), (64, 1), (64, 4), (512, 1)]
    costs = []
    for i in range(len(ds)):
        docs = np.diff(ds[i][1].astype(np.int64))
        costs.append(6 * 8e9 * docs.sum() + 6 * 4096 * 32 * float((docs.astype(float) ** 2).sum()))
    shuffled = np.array(costs)[np.random.default_rng(f["seed"]).permutation(len(ds))]
    eight = table["cases"][0]
    assert eight["steps"] == len(ds) // 8
    assert abs(eight["tokens"]["busy_fraction"] - _busy_by_loop(shuffled, 8)) < 1e-12
    assert eight["balanced"]["busy_fraction"] >= eight["tokens"]["busy_fraction"]
    text = report.format_table(f)
    assert "step balance: cost 4.8e+10 a token" in text and "rows moved (steps)" in text
    page = report.html_page(f)
    assert "<h2>Step balance</h2>" in page
    calls = []  # each page deals the table's rows once
    monkeypatch.setattr(report, "step_balance_rows", lambda g: calls.append(g) or sb.step_balance_rows(g))
    assert report.format_table(f) == text and len(calls) == 1
    assert report.html_page(f) == page and len(calls) == 2
    del f["step_balance"]  # stats without the table (a plan of a packer before seq_sq): the page is as it was
    assert "Step balance" not in report.html_page(f) and "step balance" not in report.format_table(f)


def test_uneven_rows_are_balanced_and_rows_that_cannot_fill_a_step_are_left_out():
    rng = np.random.default_rng(0)
    context = 131072
    pieces = split_documents(np.maximum(1, context * np.exp(rng.normal(-4.3, 1.5, 200_000))).astype(np.int64),
                             context)[2]
    bins = pack(pieces, context)
    keep = bins < 4096
    tokens = np.bincount(bins[keep], weights=pieces[keep], minlength=4096)
    pairs = np.bincount(bins[keep], weights=pieces[keep].astype(float) ** 2, minlength=4096)
    f = step_balance(tokens, pairs, seed=3, cases=((64, 1), (8192, 1)))
    assert not _step_balance_errors(f)
    (case,) = f["cases"]  # 4096 rows fill no step of 8192 ranks
    assert case["tokens"]["busy_fraction"] < 0.7 < 0.95 < case["balanced"]["busy_fraction"]
    assert 0 < case["balanced"]["mean_moved_steps"] < 16
    costs = CostModel().costs(tokens, pairs)[np.random.default_rng(3).permutation(4096)]
    assert abs(case["tokens"]["busy_fraction"] - _busy_by_loop(costs, 64)) < 1e-12
    assert step_balance(tokens, pairs, balance=Balance(window=4))["window"] == 4


def _row_costs(ds, per_token: float, per_pair: float) -> np.ndarray:
    """Each stored row's cost by a plain loop over its documents (its offsets' steps)."""
    costs = []
    for i in range(len(ds)):
        docs = [int(b) - int(a) for a, b in zip(ds[i][1][:-1], ds[i][1][1:])]
        costs.append(per_token * sum(docs) + per_pair * sum(d * d for d in docs))
    return np.array(costs)


def _section(page: str) -> str:
    """The step-balance part of an HTML page: its heading, title line and table."""
    m = re.search(r"<h2>Step balance</h2>.*?</table>", page, re.S)
    assert m, "no step-balance table on the page"
    return m.group(0)


def test_a_builds_report_has_the_table_packer_stats_draws(sample_dataset, tmp_path):
    """report.html and stats.json of a build (from its plan at finalize) carry the same step-balance table as
    `packer stats DIR` draws from the stored rows: stats.json's equal to dataset_stats' value, the pages'
    tables and the printed table the same, the tokens-dealt busy fraction the loop's over the stored rows."""
    written = json.loads((sample_dataset / "stats.json").read_text(encoding="utf-8"))
    ds = open_dataset(sample_dataset)
    measured = json.loads(json.dumps(dataset_stats(ds)["step_balance"]))
    assert written["step_balance"] == measured and len(measured["cases"]) == 4
    assert measured["rows"] == measured["rows_in_dataset"] == len(ds)
    shuffled = _row_costs(ds, 6 * 8e9, 6 * 4096 * 32)[np.random.default_rng(written["seed"]).permutation(len(ds))]
    assert written["step_balance"]["cases"][1]["tokens"]["busy_fraction"] == pytest.approx(_busy_by_loop(shuffled, 64),
                                                                                             abs=1e-12)
    page = (sample_dataset / "report.html").read_text(encoding="utf-8")
    assert "(the default: an 8B dense model; packer stats DIR --cost or --model-* for yours)" in _section(page)
    out = CliRunner().invoke(main, ["stats", str(sample_dataset), "--html", str(tmp_path / "p.html")])
    assert out.exit_code == 0, out.output
    assert _section(page) == _section((tmp_path / "p.html").read_text(encoding="utf-8"))
    assert report.format_table(written).split("step balance:")[1] in out.output


@pytest.mark.parametrize("case", ["split", "truncate", "sampled", "streamed"])
def test_the_build_table_equals_the_stored_rows_table(tmp_path, monkeypatch, case):
    """Builds of several buckets at context 256 (long documents split into pieces, or truncated): the table
    finalize writes equals dataset_stats' of the stored rows; with SAMPLE_ROWS lowered (both sides deal the
    same seeded sample) and with finalize's streamed path forced (the sample gathered bucket by bucket)."""
    if case == "sampled":
        monkeypatch.setattr(sb, "SAMPLE_ROWS", 300)
    if case == "streamed":
        monkeypatch.setattr(sb, "SAMPLE_ROWS", 300)
        monkeypatch.setattr(streamed, "STREAM_ABOVE", 0)
    config = BuildConfig(context_length=256, shard_size=40_000, pack_group=400, seed=5,
                         long_docs="truncate" if case == "truncate" else "split")
    build(Job(inputs=SAMPLE_INPUTS, tokenizer=TOKENIZER, output=str(tmp_path / "ds"), workers=1, config=config))
    written = json.loads((tmp_path / "ds" / "stats.json").read_text(encoding="utf-8"))["step_balance"]
    ds = open_dataset(tmp_path / "ds")
    assert written == json.loads(json.dumps(dataset_stats(ds)["step_balance"]))
    assert written["rows_in_dataset"] == len(ds) and written["rows"] == min(len(ds), sb.SAMPLE_ROWS)
    assert len(ds.manifest["shards"]) > 1 and written["attention_share"] > 0
    if case in ("sampled", "streamed"):
        assert written["rows"] < written["rows_in_dataset"]
        costs = _row_costs(ds, 6 * 8e9, 6 * 4096 * 32)[sampled_rows(len(ds), 5)]
        assert written["cases"][0]["tokens"]["busy_fraction"] == pytest.approx(_busy_by_loop(costs, 8), abs=1e-12)
        assert f"a seeded sample of 300 of its {len(ds):,} rows" in sb.step_balance_title({"step_balance": written})


def test_the_cost_options_change_the_table_as_the_model_says(sample_dataset, tmp_path):
    """packer stats DIR --model-params/--model-d/--model-layers (CostModel.for_model) and --cost: the table's
    cost, attention share and tokens-dealt busy fraction are a plain loop's over the stored rows with that
    model; the two spellings of one model give one table; a heavier attention term a larger share."""
    ds = open_dataset(sample_dataset)
    seed = int(ds.manifest["config"]["seed"])
    runner = CliRunner()

    def table(*options):
        out = runner.invoke(main, ["stats", str(sample_dataset), *options, "--json", str(tmp_path / "s.json")])
        assert out.exit_code == 0, out.output
        return json.loads((tmp_path / "s.json").read_text())["step_balance"], out.output

    default, _ = table()
    small, printed = table("--model-params", "1e8", "--model-d", "8192", "--model-layers", "64")
    per_token, per_pair = 6 * 1e8, 6 * 8192 * 64
    assert small["cost"] == {"per_token": per_token, "per_pair": per_pair}
    assert "the default" not in printed and "cost 6e+08 a token + 3.15e+06 an L^2 entry" in printed
    docs = [np.diff(ds[i][1].astype(np.int64)) for i in range(len(ds))]
    tokens, pairs = sum(int(d.sum()) for d in docs), sum(int((d * d).sum()) for d in docs)
    assert small["attention_share"] == pytest.approx(per_pair * pairs / (per_token * tokens + per_pair * pairs))
    assert small["attention_share"] > 10 * default["attention_share"]
    shuffled = _row_costs(ds, per_token, per_pair)[np.random.default_rng(seed).permutation(len(ds))]
    for c in small["cases"]:
        if c["rows_per_rank"] == 1:
            assert c["tokens"]["busy_fraction"] == pytest.approx(_busy_by_loop(shuffled, c["ranks"]), abs=1e-12)
    assert small["cases"][0]["tokens"]["busy_fraction"] < default["cases"][0]["tokens"]["busy_fraction"]
    same, _ = table("--cost", f"{per_token!r},{per_pair!r}")
    assert same == small


@pytest.mark.parametrize("options, says", [
    (["--model-params", "8e9"], "go together"),
    (["--cost", "1,2,3"], "PER_TOKEN,PER_PAIR"),
    (["--cost", "1,inf"], "finite"),
    (["--cost", "-1,2"], "must be >= 0"),
    (["--cost", "1,2", "--model-params", "8e9", "--model-d", "1", "--model-layers", "1"], "give one of them"),
])
def test_bad_cost_options_are_one_line(sample_dataset, options, says):
    out = CliRunner().invoke(main, ["stats", str(sample_dataset), *options])
    assert out.exit_code != 0 and says in out.output and len(out.output.strip().splitlines()) == 1, out.output


def test_cost_options_need_a_built_dataset():
    out = CliRunner().invoke(main, ["stats", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--context-length", "64",
                                    "--sample", "20", "--cost", "1,2"])
    assert out.exit_code == 1 and "a raw corpus has none" in out.output, out.output


def test_a_sample_gathered_in_parts_is_the_whole_arrays_sample(monkeypatch):
    """RowSample fed in parts of any size (a plan's buckets, empty ones too) holds the same rows as fed at once;
    above SAMPLE_ROWS the rows are distinct, in range, seeded, and each row is drawn about equally often."""
    monkeypatch.setattr(sb, "SAMPLE_ROWS", 50)
    rng = np.random.default_rng(11)
    for trial in range(20):
        n = int(rng.integers(1, 400))
        tokens, pairs = rng.integers(1, 1000, n), rng.integers(1, 10**6, n).astype(np.float64)
        cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 6))))
        parts = RowSample(n, trial)
        for a, b in zip([0, *cuts], [*cuts, n]):
            parts.add(tokens[a:b], pairs[a:b])
        rows = sampled_rows(n, trial)
        assert len(rows) == min(n, 50) == len(set(rows.tolist())) and rows.min() >= 0 and rows.max() < n
        assert parts.tokens.tolist() == tokens[rows].tolist() and parts.pairs.tolist() == pairs[rows].tolist()
        assert (parts.total_tokens, parts.total_pairs) == (int(tokens.sum()), int(pairs.sum()))
        assert parts.figures() == step_balance(tokens, pairs, seed=trial)
    assert sampled_rows(400, 1).tolist() == sampled_rows(400, 1).tolist() != sampled_rows(400, 2).tolist()
    drawn = np.bincount(np.concatenate([sampled_rows(200, s) for s in range(2000)]), minlength=200)
    assert drawn.min() > 0.75 * 500 and drawn.max() < 1.25 * 500  # 2000 draws of 50 of 200: 500 each (sd 19)


def _step_balance_errors(value) -> list[str]:
    """What in `value` breaks the step_balance part of packer/stats/stats_schema.json."""
    import jsonschema

    from packer.stats.figures import SCHEMA

    validator = jsonschema.Draft202012Validator({"$defs": SCHEMA["$defs"], **SCHEMA["properties"]["step_balance"]})
    return [e.message for e in validator.iter_errors(value)]
