"""A build's stats.json from bounded summaries: lengths as an exact histogram read unit by unit, sequences as counts and integer sums bucket by bucket.

    unit lengths [3, 10, 5] | [5, 3]            ->  Histogram values [3, 5, 10], counts [2, 2, 1]
    bucket sequences, output order, L = 8:
        tokens [8, 5] docs [1, 2] | tokens [7] docs [3]
                                                ->  tokens counts over 0..8: [0 0 0 0 0 1 0 1 1]
                                                    docs counts [0, 1, 1, 1]; trend groups [0] [1] [2]
                                                    sums: tokens 20, tokens^2 138, position * tokens 0*8 + 1*5 + 2*7 = 19

Every figure that is a function of the sorted values (counts, percentiles, maxima, shares,
histograms, the padding strategies) comes out exactly as figures.py computes it from the arrays;
means, group means and correlations come from exact integer sums, so they can differ from numpy's
float sums in the last bits (within 1e-12 relative: tests/stats/test_stats_scale.py). Held at once:
the distinct lengths, L + 1 fill counts, and one chunk of lengths or one bucket's summaries.

finalize_stats takes the arrays (figures.plan_stats, the bytes builds always had) up to
STREAM_ABOVE documents and sequences, and these summaries above. The step-balance table is the same on
both paths: it deals at most step_balance.SAMPLE_ROWS sampled rows, gathered bucket by bucket here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from packer.io import fs
from packer.stats import figures
from packer.stats.figures import FILL_BINS, LENGTH_BINS, PERCENTILES, TREND_GROUPS
from packer.stats.step_balance import RowSample

# Largest count of documents (and of sequences) whose stats.json is computed from whole arrays (the
# lengths, the units' parts while concatenated, the sort; every sequence's summary): 50M web-like
# documents (8.1M sequences at 4096) add 1065 MB, 22 bytes a document; the summaries add 36 MB at any
# size, 100M or 1B (benchmarks/bench_finalize_stats.py, 2026-12-01).
STREAM_ABOVE = 50_000_000
CHUNK_DOCS = 1 << 20  # lengths counted at once (8 MB of int64)
DOT_CHUNK = 1 << 16  # position * value sums in int64: below 2**16 * 2**16 * L, safe for L < 2**31


@dataclass(frozen=True)
class Histogram:
    """An integer array as its distinct values (ascending, int64) and how often each occurs (>= 1)."""

    values: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, x) -> "Histogram":
        x = np.asarray(x)
        if not len(x):
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))
        if 0 <= int(x.min()) and int(x.max()) < 4 * len(x) + (1 << 16):  # dense enough: a bincount, no sort
            c = np.bincount(x)
            v = np.flatnonzero(c)
            return cls(v.astype(np.int64), c[v].astype(np.int64))
        v, c = np.unique(x, return_counts=True)
        return cls(v.astype(np.int64), c.astype(np.int64))

    def merged(self, other: "Histogram") -> "Histogram":
        v = np.concatenate([self.values, other.values])
        c = np.concatenate([self.counts, other.counts])
        order = np.argsort(v, kind="stable")
        v, c = v[order], c[order]
        if not len(v):
            return self
        first = np.flatnonzero(np.concatenate([[True], v[1:] != v[:-1]]))
        return Histogram(v[first], np.add.reduceat(c, first))

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    @property
    def total(self) -> int:
        return int((self.values * self.counts).sum())


def length_histogram(parts) -> Histogram:
    """Histogram of the concatenation of `parts` (arrays, one unit's lengths each), CHUNK_DOCS at a time."""
    out, held, n = Histogram.of([]), [], 0
    for x in parts:
        held.append(np.asarray(x))
        n += len(x)
        if n >= CHUNK_DOCS:
            out, held, n = out.merged(Histogram.of(np.concatenate(held))), [], 0
    return out.merged(Histogram.of(np.concatenate(held))) if held else out


def histogram_percentiles(values: np.ndarray, counts: np.ndarray, mean: float, qs=PERCENTILES) -> dict:
    """figures.percentiles of the sorted array holding values[i] counts[i] times, read off the
    cumulative counts (the same interpolation, on the same values); `mean` as given."""
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    n = int(counts.sum())
    if n == 0:
        return {**{f"p{q}": 0.0 for q in qs}, "max": 0, "mean": 0.0}
    cum = np.cumsum(counts)
    pos = np.asarray(qs, dtype=np.float64) / 100 * (n - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    s_lo, s_hi = values[np.searchsorted(cum, lo, side="right")], values[np.searchsorted(cum, hi, side="right")]
    v = s_lo + (pos - lo) * (s_hi.astype(np.float64) - s_lo)
    return {**{f"p{q}": float(x) for q, x in zip(qs, v)}, "max": values[-1].item(), "mean": mean}


def histogram_length_figures(h: Histogram, context_length: int) -> dict:
    """figures.length_figures from the lengths' histogram."""
    n, n_tokens = h.n, h.total
    long = h.values > context_length
    n_long = int(h.counts[long].sum())
    long_tokens = int((h.values[long] * h.counts[long]).sum())
    top = int(h.values[-1]) + 1 if n else 2
    # return_index: without it numpy 2.4's np.unique imports numpy.ma (8-15 ms of a tiny build, 2026-12-05)
    edges = np.unique(np.floor(np.geomspace(1, top, LENGTH_BINS + 1)).astype(np.int64), return_index=True)[0]
    edges[-1] = top
    below = np.concatenate([[0], np.cumsum(h.counts)])[np.searchsorted(h.values, edges, side="left")]
    return {
        "documents": n,
        "tokens": n_tokens,
        "percentiles": histogram_percentiles(h.values, h.counts, n_tokens / n if n else 0.0),
        "long_documents_share": n_long / n if n else 0.0,
        "long_tokens_share": long_tokens / n_tokens if n_tokens else 0.0,
        "histogram": {"edges": edges.tolist(), "counts": np.diff(below).tolist()},
    }


def histogram_rows(h: Histogram, context_length: int) -> np.ndarray:
    """figures.row_histogram from the lengths' histogram: counts[v] = rows of length v (v = 0..L)."""
    L = context_length
    counts = np.zeros(L + 1, np.int64)
    short = h.values <= L
    counts[h.values[short]] = h.counts[short]
    lv, lc = h.values[~short], h.counts[~short]
    counts[L] += int((lv // L * lc).sum())
    np.add.at(counts, lv % L, lc)
    counts[0] = 0  # remainders of zero are no rows
    return counts


def histogram_strategies(h: Histogram, context_length: int, batch_size: int) -> dict:
    """figures.padding_strategies (no pack rows) from the lengths' histogram."""
    short = h.values <= context_length
    kept = int((h.values[short] * h.counts[short]).sum()) + context_length * int(h.counts[~short].sum())
    return figures.strategies_of(histogram_rows(h, context_length), h.n, h.total, kept, context_length, batch_size, {})


class SequenceSums:
    """What figures.composition needs of sequences in output order, added bucket by bucket
    (`add(tokens, docs, split)`, each an array over the bucket's sequences): counts of tokens
    per sequence (0..L) and of documents per sequence, sequences of one split piece, and exact
    sums for the trend (per TREND_GROUPS group of output positions) and the correlations."""

    def __init__(self, n_sequences: int, context_length: int):
        self.n, self.L, self.seen = n_sequences, context_length, 0
        self.token_counts = np.zeros(context_length + 1, np.int64)
        self.doc_counts = np.zeros(1, np.int64)
        self.single_split = 0
        self.pos_tokens = self.pos_docs = 0
        k = min(TREND_GROUPS, n_sequences)
        q, r = divmod(n_sequences, k) if k else (0, 0)
        self.group_ends = np.cumsum([q + 1] * r + [q] * (k - r)).astype(np.int64)  # as np.array_split cuts
        self.group_tokens, self.group_docs = [0] * k, [0] * k

    def add(self, tokens: np.ndarray, docs: np.ndarray, split: np.ndarray):
        tokens, docs = np.asarray(tokens), np.asarray(docs)  # int32 as the plan stores them: int64 per chunk only
        off, m = self.seen, len(tokens)
        self.token_counts += np.bincount(tokens, minlength=self.L + 1)
        d = np.bincount(docs)
        if len(d) > len(self.doc_counts):
            self.doc_counts = np.concatenate([self.doc_counts, np.zeros(len(d) - len(self.doc_counts), np.int64)])
        self.doc_counts[: len(d)] += d
        self.single_split += int(np.count_nonzero((docs == 1) & (np.asarray(split) == 1)))
        for a in range(0, m, DOT_CHUNK):
            t, k = tokens[a : a + DOT_CHUNK].astype(np.int64), docs[a : a + DOT_CHUNK].astype(np.int64)
            j = np.arange(len(t), dtype=np.int64)
            self.pos_tokens += (off + a) * int(t.sum()) + int(j @ t)
            self.pos_docs += (off + a) * int(k.sum()) + int(j @ k)
        starts = np.concatenate([[0], self.group_ends[:-1]])
        for g, (g0, g1) in enumerate(zip(starts.tolist(), self.group_ends.tolist())):
            a, b = max(g0, off) - off, min(g1, off + m) - off
            if a < b:
                self.group_tokens[g] += int(tokens[a:b].sum(dtype=np.int64))
                self.group_docs[g] += int(docs[a:b].sum(dtype=np.int64))
        self.seen += m

    def composition(self) -> dict:
        """figures.composition(seq_docs, seq_tokens, single split, L) of every sequence added (output order only)."""
        assert self.seen == self.n, f"{self.seen} sequences added, {self.n} expected"
        n, L = self.n, self.L
        t_values, d_values = np.arange(L + 1, dtype=np.int64), np.arange(len(self.doc_counts), dtype=np.int64)
        t_sum, d_sum = _dot(t_values, self.token_counts), _dot(d_values, self.doc_counts)
        fill_values = t_values / L  # as seq_tokens / L gives them
        hist = np.histogram(fill_values, bins=FILL_BINS, range=(0.0, 1.0), weights=self.token_counts)[0]
        sizes = np.diff(self.group_ends, prepend=0).tolist()
        return {
            "docs_per_sequence": histogram_percentiles(d_values, self.doc_counts, d_sum / n if n else 0.0),
            "single_split_piece_share": self.single_split / n if n else 0.0,
            "fill_rate_percentiles": histogram_percentiles(fill_values, self.token_counts, t_sum / (L * n) if n else 0.0),
            "fill_histogram": {"edges": np.linspace(0, 1, FILL_BINS + 1).tolist(), "counts": hist.astype(np.int64).tolist()},
            "trend_output_order": {
                "fill_correlation": _correlation(n, t_sum, _dot(t_values**2, self.token_counts), self.pos_tokens),
                "docs_correlation": _correlation(n, d_sum, _dot(d_values**2, self.doc_counts), self.pos_docs),
                "fill_by_group": [s / (L * c) for s, c in zip(self.group_tokens, sizes)],
                "docs_by_group": [s / c for s, c in zip(self.group_docs, sizes)],
            },
            "trend_packing_order": None,
            "trend_noise_level": 2 / np.sqrt(n) if n else 1.0,
        }


def _dot(values: np.ndarray, counts: np.ndarray) -> int:
    """sum(values * counts) in Python integers (no int64 overflow)."""
    return sum(int(v) * int(c) for v, c in zip(values[counts > 0].tolist(), counts[counts > 0].tolist()))


def _correlation(n: int, sy: int, syy: int, sxy: int):
    """Pearson r of positions 0..n-1 against y from exact sums, or None when y is constant (figures._correlation)."""
    sx, sxx = n * (n - 1) // 2, (n - 1) * n * (2 * n - 1) // 6
    dx, dy = n * sxx - sx * sx, n * syy - sy * sy
    if n < 2 or dx == 0 or dy == 0:
        return None
    return max(-1.0, min(1.0, (n * sxy - sx * sy) / math.sqrt(dx * dy)))


def streamed_plan_stats(lengths: Histogram, plan, sequences: SequenceSums, context_length: int, *, algorithm: str,
                        seed: int, batch_size: int = 8, inputs=()) -> dict:
    """figures.plan_stats from the lengths' histogram and the sequences' sums."""
    figures._check_lengths(lengths.values)  # the distinct lengths: none, or one below 1, as the arrays' check says
    out = figures._header("corpus", context_length, batch_size, seed, inputs=[fs.redact(str(i)) for i in inputs],
                          documents_from="tokenized", sample=None)
    out["lengths"] = histogram_length_figures(lengths, context_length)
    out["strategies"] = histogram_strategies(lengths, context_length, batch_size)
    out["packing"] = out["attention"] = None
    return figures.add_plan_packing(out, plan, sequences.composition(), algorithm)


def finalize_stats(unit_lengths, plan, plan_dir, context_length: int, *, algorithm: str, seed: int, n_documents: int,
                   inputs=()) -> dict:
    """stats.json of a build: `unit_lengths()` iterates the accepted documents' lengths unit by
    unit, `plan` is its plan index (packer/preprocess/plan_groups.py PlanIndex: sequence_stats and
    bucket_stats read the per-sequence summaries under `plan_dir`). Up to STREAM_ABOVE documents
    and sequences from whole arrays (figures.plan_stats), above that from summaries."""
    kw = {"algorithm": algorithm, "seed": seed, "inputs": inputs}
    if n_documents <= STREAM_ABOVE and plan.n_sequences <= STREAM_ABOVE:
        lengths = np.concatenate(list(unit_lengths()) or [np.zeros(0, np.int64)])
        return figures.plan_stats(lengths, plan, plan.sequence_stats(plan_dir), context_length, **kw)
    sums, rows, squares = SequenceSums(plan.n_sequences, context_length), RowSample(plan.n_sequences, seed), True
    for part in plan.bucket_stats(plan_dir):
        sums.add(part["seq_tokens"], part["seq_docs"], part["seq_split"])
        if squares := squares and "seq_sq" in part:  # the step-balance table from a bounded sample of the rows
            rows.add(part["seq_tokens"], part["seq_sq"])
    out = streamed_plan_stats(length_histogram(unit_lengths()), plan, sums, context_length, **kw)
    if squares:  # as figures.plan_stats: step_balance over the same sampled rows
        out["step_balance"] = rows.figures()
    return out
