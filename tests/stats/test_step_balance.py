"""`packer stats DIR` and its report show the step balance of the dataset's own rows: each step's slowest rank
against its mean, rows dealt in a seeded shuffle or by cost."""

from __future__ import annotations

import numpy as np
from conftest import schema_errors

from packer.balance import Balance, CostModel
from packer.binpack import pack, split_documents
from packer.stats import report
from packer.stats.figures import dataset_stats
from packer.stats.step_balance import step_balance
from packer.store.dataset import open_dataset


def _busy_by_loop(costs, ranks: int) -> float:
    """Busy fraction of one row a rank a step, by a plain loop: sum of step means / sum of step maxima."""
    mean = slowest = 0.0
    for s in range(len(costs) // ranks):
        step = list(costs[s * ranks:(s + 1) * ranks])
        mean, slowest = mean + sum(step) / ranks, slowest + max(step)
    return mean / slowest


def test_a_datasets_stats_have_the_table_and_the_report_shows_it(sample_dataset, tmp_path):
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
    del f["step_balance"]  # a build's own stats (from its plan) have no table: the page is as it was
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


def _step_balance_errors(value) -> list[str]:
    """What in `value` breaks the step_balance part of packer/stats/stats_schema.json."""
    import jsonschema

    from packer.stats.figures import SCHEMA

    validator = jsonschema.Draft202012Validator({"$defs": SCHEMA["$defs"], **SCHEMA["properties"]["step_balance"]})
    return [e.message for e in validator.iter_errors(value)]
