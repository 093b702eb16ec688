"""Padding-waste figures of a corpus or a built dataset, from lengths alone: what each batching strategy costs and what packing saves.

Documents [3, 10, 5], context L = 8, batch B = 2 (18 tokens; the 10 is a long document):

    rows (a long document is ceil(l / L) rows)   [3] [8] [2] [5]          4 rows
    pad to context        4 rows x 8        = 32 slots   padding 14/32
    pad to longest, sorted  [2 3] [5 8] -> 2*3 + 2*8 = 22 slots   padding  4/22
    pad to longest, random  expected over every deal of the rows into batches of 2:
                            2 batches * 2 rows * E[longest of 2 rows] (37/6) = 24.67 slots
    truncate to context   3 rows x 8        = 24 slots   16 kept, 2 lost, padding 8/24
    pack (FFD)            [8] [5 3] [2]     = 24 slots   padding 6/24, lower bound ceil(18/8) = 3
    attention             dense 3 * 8^2/2 = 96, block-causal (8^2 + 5^2 + 3^2 + 2^2)/2 = 51

Every share is an unrounded fraction in [0, 1]. The result is one JSON-ready dict whose
shape is `SCHEMA` (packer/stats/stats_schema.json); packer.stats.report draws and prints it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from packer.balance import Balance, CostModel, row_document_lengths, row_sums
from packer.binpack import lower_bound, pack, split_documents
from packer.io import fs
from packer.stats.step_balance import step_balance
from packer.store.dataset import read_rows

SCHEMA_ID = "packer.stats/1"
SCHEMA = json.loads((Path(__file__).with_name("stats_schema.json")).read_text(encoding="utf-8"))
PERCENTILES = (50, 90, 99)
STRATEGIES = ("pad_to_context", "pad_random_batches", "pad_sorted_batches", "truncate", "pack_ffd", "pack_bfd")
FILL_BINS = 20
LENGTH_BINS = 40
TREND_GROUPS = 10


def percentiles(values, qs=PERCENTILES, *, is_sorted: bool = False) -> dict:
    """{"p50": ..., "p90": ..., "p99": ..., "max": ..., "mean": ...}; linear interpolation
    between closest ranks (numpy's default), read off one sorted copy."""
    s = np.asarray(values) if is_sorted else np.sort(values)
    if len(s) == 0:
        return {**{f"p{q}": 0.0 for q in qs}, "max": 0, "mean": 0.0}
    pos = np.asarray(qs, dtype=np.float64) / 100 * (len(s) - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, len(s) - 1)
    v = s[lo] + (pos - lo) * (s[hi].astype(np.float64) - s[lo])
    return {**{f"p{q}": float(x) for q, x in zip(qs, v)}, "max": s[-1].item(), "mean": float(s.mean())}


def length_figures(sorted_lengths: np.ndarray, context_length: int) -> dict:
    """Counts, percentiles, the share of documents (and of their tokens) longer than the context,
    and a log-spaced histogram [edges[k], edges[k+1]) read off the sorted lengths."""
    s = sorted_lengths
    n_tokens = int(s.sum())
    first_long = int(np.searchsorted(s, context_length, side="right"))
    long_tokens = int(s[first_long:].sum())
    top = int(s[-1]) + 1 if len(s) else 2
    # return_index: without it numpy 2.4's np.unique imports numpy.ma (8-15 ms of a tiny build, 2026-12-05)
    edges = np.unique(np.floor(np.geomspace(1, top, LENGTH_BINS + 1)).astype(np.int64), return_index=True)[0]
    edges[-1] = top
    counts = np.diff(np.searchsorted(s, edges, side="left"))
    return {
        "documents": int(len(s)),
        "tokens": n_tokens,
        "percentiles": percentiles(s, is_sorted=True),
        "long_documents_share": (len(s) - first_long) / len(s) if len(s) else 0.0,
        "long_tokens_share": long_tokens / n_tokens if n_tokens else 0.0,
        "histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
    }


def _strategy(sequences: int, slots, kept: int, lost: int, n_tokens: int, **extra) -> dict:
    return {
        "sequences": int(sequences),
        "compute_slots": slots if isinstance(slots, float) else int(slots),
        "tokens_kept": int(kept),
        "padding_share": 1 - kept / slots if slots else 0.0,
        "tokens_lost": int(lost),
        "tokens_lost_share": lost / n_tokens if n_tokens else 0.0,
        **extra,
    }


def row_histogram(sorted_lengths: np.ndarray, context_length: int) -> np.ndarray:
    """counts[v] = rows of length v (v = 0..L) when each document is cut into rows of at most L:
    a long document gives l // L full rows and a remainder row. Read off the sorted document
    lengths in O(L log n), no per-row array.

    doc lengths [3, 5, 10], L = 8  ->  rows [3] [5] [8 2]  ->  counts[2] = counts[3] = counts[5] = counts[8] = 1
    """
    L, s = context_length, sorted_lengths
    first_long = int(np.searchsorted(s, L, side="right"))
    counts = np.diff(np.searchsorted(s[:first_long], np.arange(L + 2), side="left"))  # [0, L]
    long = s[first_long:]
    counts[L] += int((long // L).sum())
    counts += np.bincount(long % L, minlength=L + 1)[: L + 1]
    counts[0] = 0  # remainders of zero are no rows
    return counts


def sorted_batch_slots(counts: np.ndarray, batch_size: int) -> int:
    """Slots of padding each batch to its longest row, batches of `batch_size` consecutive rows
    in ascending length order (the last batch, holding the longest rows, may be short). O(L), nothing
    per batch: the full batches that end among the rows of length v are floor(cum[v] / B) - floor(cum[v-1] / B),
    with cum[v] the rows of length <= v.

        counts [0, 1, 0, 2, 1] (rows 1 3 3 4), B = 3  ->  full batches end at v = 0 0 0 1 0; slots 3*3 + 1*4 = 13
    """
    cum = np.cumsum(counts)
    n = int(cum[-1]) if len(cum) else 0
    full = np.diff(cum // batch_size, prepend=0)
    top = int(np.flatnonzero(counts)[-1]) if n else 0
    return batch_size * int((np.arange(len(counts)) * full).sum()) + (n % batch_size) * top


def _expected_max(cum: np.ndarray, n: int, k: int) -> float:
    """E[longest of k rows drawn without replacement]: sum over v of P(max > v), where
    P(max <= v) = C(N_v, k) / C(n, k) and N_v = rows of length <= v (lgamma, so any n and k)."""
    lgamma = np.frompyfunc(math.lgamma, 1, 1)
    m = cum[:-1].astype(np.float64)  # N_v for v = 0 .. max-1
    ok = m >= k
    log_p = np.zeros(len(m))
    log_p[ok] = (lgamma(m[ok] + 1) - lgamma(m[ok] - k + 1)).astype(np.float64)
    log_p -= math.lgamma(n + 1) - math.lgamma(n - k + 1)
    p_le = np.where(ok, np.exp(np.minimum(log_p, 0.0)), 0.0)
    return float((1 - p_le).sum())


def random_batch_slots(counts: np.ndarray, batch_size: int) -> float:
    """Expected slots of padding each batch to its longest row when rows are dealt into batches
    of `batch_size` uniformly at random (exact expectation, not one draw): every full batch is a
    uniform random subset of the rows, and so is the short last one."""
    n = int(counts.sum())
    top = int(np.flatnonzero(counts)[-1]) if n else 0
    cum = np.cumsum(counts[: top + 1])
    full, rest = divmod(n, batch_size)
    slots = full * batch_size * _expected_max(cum, n, batch_size) if full else 0.0
    return slots + (rest * _expected_max(cum, n, rest) if rest else 0.0)


def padding_strategies(sorted_lengths: np.ndarray, context_length: int, batch_size: int, packs: dict) -> dict:
    """The six strategies from sorted document lengths alone (a long document is ceil(l / L)
    rows except under truncation); `packs` maps "ffd"/"bfd" to the bins packing those rows took."""
    L = context_length
    first_long = int(np.searchsorted(sorted_lengths, L, side="right"))
    kept_truncated = int(sorted_lengths[:first_long].sum()) + L * (len(sorted_lengths) - first_long)
    return strategies_of(row_histogram(sorted_lengths, L), len(sorted_lengths), int(sorted_lengths.sum()),
                         kept_truncated, L, batch_size, packs)


def strategies_of(counts: np.ndarray, n_docs: int, n_tokens: int, kept_truncated: int, context_length: int,
                  batch_size: int, packs: dict) -> dict:
    """padding_strategies from what they need of the lengths: the row histogram (row_histogram), the
    documents, their tokens, and the tokens truncation to the context keeps."""
    L, n_rows = context_length, int(counts.sum())
    out = {
        "pad_to_context": _strategy(n_rows, n_rows * L, n_tokens, 0, n_tokens),
        "pad_random_batches": _strategy(n_rows, random_batch_slots(counts, batch_size), n_tokens, 0, n_tokens),
        "pad_sorted_batches": _strategy(n_rows, sorted_batch_slots(counts, batch_size), n_tokens, 0, n_tokens),
        "truncate": _strategy(n_docs, n_docs * L, kept_truncated, n_tokens - kept_truncated, n_tokens),
    }
    bound = lower_bound([n_tokens], L)
    for algorithm, n_bins in packs.items():
        out[f"pack_{algorithm}"] = _strategy(
            n_bins, n_bins * L, n_tokens, 0, n_tokens,
            fill_rate=n_tokens / (n_bins * L) if n_bins else 1.0,
            lower_bound=bound,
            bins_over_lower_bound=n_bins - bound,
        )
    return out


def _correlation(x: np.ndarray, y: np.ndarray):
    """Pearson r, or None when either side is constant (no trend can be measured)."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x.astype(np.float64), y.astype(np.float64))[0, 1])


def _trend(fill: np.ndarray, docs: np.ndarray) -> dict:
    """Correlation of fill and documents per sequence with position, and their means over
    TREND_GROUPS consecutive groups of positions (what a plot of drift would show)."""
    pos = np.arange(len(fill))
    groups = np.array_split(pos, min(TREND_GROUPS, len(pos))) if len(pos) else []
    return {
        "fill_correlation": _correlation(pos, fill),
        "docs_correlation": _correlation(pos, docs),
        "fill_by_group": [float(fill[g].mean()) for g in groups],
        "docs_by_group": [float(docs[g].mean()) for g in groups],
    }


def composition(seq_docs: np.ndarray, seq_tokens: np.ndarray, seq_single_split: np.ndarray,
                context_length: int, packing_order: np.ndarray | None = None) -> dict:
    """Pack composition of sequences given in output order: documents (segments) per sequence,
    the share that hold one split piece of a long document only, the fill distribution, and the
    trend over output position; over packing order too when `packing_order` (output index of
    each sequence in the order the packer opened them) is given."""
    fill = seq_tokens / context_length
    n = len(seq_docs)
    counts, _ = np.histogram(fill, bins=FILL_BINS, range=(0.0, 1.0))
    return {
        "docs_per_sequence": percentiles(seq_docs),
        "single_split_piece_share": float(seq_single_split.sum() / n) if n else 0.0,
        "fill_rate_percentiles": percentiles(fill),
        "fill_histogram": {"edges": np.linspace(0, 1, FILL_BINS + 1).tolist(), "counts": counts.tolist()},
        "trend_output_order": _trend(fill, seq_docs),
        "trend_packing_order": None if packing_order is None else _trend(fill[packing_order], seq_docs[packing_order]),
        "trend_noise_level": 2 / np.sqrt(n) if n else 1.0,
    }


def attention_cost(segment_lengths: np.ndarray, n_sequences: int, context_length: int) -> dict:
    """Causal attention score entries: dense over whole sequences (n * L^2 / 2) against
    block-causal within each document segment (sum of l^2 / 2)."""
    return _attention(float((segment_lengths.astype(np.float64) ** 2).sum() / 2), n_sequences, context_length)


def _attention(block: float, n_sequences: int, context_length: int) -> dict:
    dense = n_sequences * context_length**2 / 2
    return {"dense_causal": dense, "block_causal": block, "saving_share": 1 - block / dense if dense else 0.0}


def _check_lengths(doc_lengths) -> np.ndarray:
    lengths = np.asarray(doc_lengths)
    if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
        raise ValueError(f"document lengths must be a 1-D integer array, got {lengths.dtype} of shape {lengths.shape}")
    if lengths.size == 0:
        raise ValueError("no documents to measure: the input holds no accepted documents")
    if lengths.min() < 1:
        raise ValueError(f"document lengths must be >= 1, found {int(lengths.min())}")
    return lengths.astype(np.int64, copy=False)


def _header(kind: str, context_length: int, batch_size: int, seed: int, **source) -> dict:
    if context_length < 1 or batch_size < 1:
        raise ValueError(f"context length ({context_length}) and batch size ({batch_size}) must be >= 1")
    return {"schema": SCHEMA_ID, "source": {"kind": kind, **source}, "context_length": context_length,
            "batch_size": batch_size, "seed": seed}


def corpus_stats(doc_lengths, context_length: int, *, batch_size: int = 8, seed: int = 0,
                 algorithm: str | None = "ffd", algorithms=("ffd", "bfd"), sample: dict | None = None,
                 inputs=()) -> dict:
    """All figures for documents of these lengths, packed the way `packer build` would
    (long documents split, `algorithm`, bins shuffled with `seed`). algorithms=() skips packing."""
    out = _header("corpus", context_length, batch_size, seed, inputs=[fs.redact(str(i)) for i in inputs],
                  documents_from="tokenized", sample=sample)
    lengths = _check_lengths(doc_lengths)
    piece_doc, _, piece_len = split_documents(lengths, context_length) if algorithms else (None, None, None)
    bins = {a: pack(piece_len, context_length, a) for a in algorithms}
    n_bins = {a: int(b.max()) + 1 for a, b in bins.items()}
    sorted_lengths = np.sort(lengths)
    out["lengths"] = length_figures(sorted_lengths, context_length)
    out["strategies"] = padding_strategies(sorted_lengths, context_length, batch_size, n_bins)
    out["packing"] = None
    out["attention"] = None
    if algorithm in bins:
        b, n = bins[algorithm], n_bins[algorithm]
        position = np.random.default_rng(seed).permutation(n)  # as packer.preprocess.plan shuffles bins
        split = lengths[piece_doc] > context_length
        seq_of_piece = position[b]
        seq_docs = np.bincount(seq_of_piece, minlength=n)
        seq_tokens = np.bincount(seq_of_piece, weights=piece_len, minlength=n)
        seq_single = (seq_docs == 1) & (np.bincount(seq_of_piece, weights=split, minlength=n) == 1)
        out["packing"] = {
            "algorithm": algorithm, "source": "computed",
            **_pack_totals(n, int(piece_len.sum()), context_length),
            **composition(seq_docs, seq_tokens, seq_single, context_length, packing_order=position),
        }
        out["attention"] = attention_cost(piece_len, n, context_length)
    return out


def plan_stats(doc_lengths, plan, sequences: dict, context_length: int, *, algorithm: str, seed: int,
               batch_size: int = 8, inputs=()) -> dict:
    """Figures of a build from its plan's summaries, never its pieces: `plan` (a packer.preprocess.plan_groups
    PlanIndex: n_sequences, n_tokens, piece_sq_sum), `sequences` (per sequence in output order:
    seq_tokens, seq_docs = pieces, seq_split = pieces of documents longer than the context, seq_sq = the
    sum of its pieces' squared lengths), and the lengths of all accepted documents. Nothing is packed
    again, so only the build's own algorithm has a pack row. The step-balance table (default cost model)
    is the one `packer stats DIR` draws from the stored rows: a row's segments are its plan's pieces."""
    out = corpus_stats(doc_lengths, context_length, batch_size=batch_size, seed=seed, algorithm=None, algorithms=(),
                       inputs=inputs)
    seq_docs, seq_tokens, seq_split = sequences["seq_docs"], sequences["seq_tokens"], sequences["seq_split"]
    add_plan_packing(out, plan, composition(seq_docs, seq_tokens, (seq_docs == 1) & (seq_split == 1), context_length),
                     algorithm)
    if "seq_sq" in sequences:  # a plan of a packer before it has none: no table
        out["step_balance"] = step_balance(seq_tokens, sequences["seq_sq"], seed=seed)
    return out


def add_plan_packing(out: dict, plan, composed: dict, algorithm: str) -> dict:
    """A build's own pack row, packing and attention into corpus figures `out` (in place): from the
    plan's totals and `composed`, the composition of its sequences."""
    L, n, n_tokens = out["context_length"], plan.n_sequences, plan.n_tokens
    doc_tokens = out["lengths"]["tokens"]
    bound = lower_bound([n_tokens], L)
    out["strategies"][f"pack_{algorithm}"] = _strategy(
        n, n * L, n_tokens, doc_tokens - n_tokens, doc_tokens,
        fill_rate=n_tokens / (n * L) if n else 1.0, lower_bound=bound, bins_over_lower_bound=n - bound)
    out["source"]["kind"] = "dataset"
    out["packing"] = {"algorithm": algorithm, "source": "dataset", **_pack_totals(n, n_tokens, L), **composed}
    out["attention"] = _attention(float(plan.piece_sq_sum) / 2, n, L)  # exact: integer squares below 2**53
    return out


def _pack_totals(n_sequences: int, n_tokens: int, context_length: int) -> dict:
    slots = n_sequences * context_length
    return {"sequences": n_sequences, "tokens": n_tokens, "fill_rate": n_tokens / slots if slots else 1.0,
            "lower_bound": lower_bound([n_tokens], context_length)}


def _stored_doc_ids(ds) -> np.ndarray | None:
    """Global document index of every stored segment, as the reader already holds them
    (`ds.doc_ids()`: every shard format stores them); None for readers without doc_ids or a
    dataset without shards (then each segment counts as a document)."""
    return ds.doc_ids() if hasattr(ds, "doc_ids") and ds.manifest.get("shards") else None


def dataset_stats(ds, *, batch_size: int = 8, cost: CostModel | None = None) -> dict:
    """Figures of a built dataset (an open_dataset reader): the strategies from its documents'
    lengths, and the composition, fill, trend and attention cost of its stored sequences; its step
    balance under `cost` (None: the default CostModel)."""
    config = ds.manifest["config"]
    L = int(config["context_length"])
    n = len(ds)
    seg_len, seq_docs = row_document_lengths(read_rows(ds, np.arange(n))[1])  # a segment: a stored document piece
    seq_tokens = row_sums(seg_len, seq_docs)
    doc_ids = _stored_doc_ids(ds)
    if doc_ids is not None and len(doc_ids) == len(seg_len):
        per_doc = np.bincount(doc_ids, weights=seg_len).astype(np.int64)
        lengths, documents_from = per_doc[per_doc > 0], "doc_ids"
        seg_split = per_doc[doc_ids] > L
    else:  # no document identity: a segment is a document, a full-context segment a split piece
        lengths, documents_from = seg_len, "segments"
        seg_split = seg_len == L
    algorithm = config.get("algorithm", "ffd")
    # the strategies a build's own report shows: its stored rows as the one pack row, nothing packed again
    out = corpus_stats(lengths, L, batch_size=batch_size, seed=int(config.get("seed", 0)), algorithm=None, algorithms=())
    n_tokens, doc_tokens, bound = int(seg_len.sum()), out["lengths"]["tokens"], lower_bound([int(seg_len.sum())], L)
    out["strategies"][f"pack_{algorithm}"] = _strategy(
        n, n * L, n_tokens, doc_tokens - n_tokens, doc_tokens,
        fill_rate=n_tokens / (n * L) if n else 1.0, lower_bound=bound, bins_over_lower_bound=n - bound)
    out["source"] = {"kind": "dataset", "inputs": [fs.redact(str(getattr(ds, "path", "")))], "sample": None,
                     "documents_from": documents_from}
    split_count = row_sums(seg_split.astype(np.int64), seq_docs)
    out["packing"] = {
        "algorithm": algorithm, "source": "dataset",
        **_pack_totals(n, int(seg_len.sum()), L),
        **composition(seq_docs, seq_tokens, (seq_docs == 1) & (split_count == 1), L),
    }
    out["attention"] = attention_cost(seg_len, n, L)
    named = ds.manifest.get("sources")
    if named and getattr(ds, "has_source_ids", False):
        seg_source = np.concatenate(ds.source_views(np.arange(n)), dtype=np.int64) if n else np.zeros(0, np.int64)
        seg_doc = doc_ids if doc_ids is not None and len(doc_ids) == len(seg_len) else np.arange(len(seg_len))
        row_source = seg_source[np.cumsum(seq_docs) - seq_docs]  # each row's first segment's (rows hold one or more)
        out["sources"] = source_figures([s["name"] for s in named], seg_source, seg_len, seg_doc, row_source, L,
                                        [s.get("docs_skipped", {}) for s in named])
    if (trained := dataset_trained(ds)) is not None:
        add_trained(out, trained)
    balance = Balance(cost=cost) if cost is not None else Balance()
    pairs = row_sums(seg_len.astype(np.float64) ** 2, seq_docs)  # as row_tokens_pairs, from the segments above
    out["step_balance"] = step_balance(seq_tokens, pairs, seed=int(config.get("seed", 0)), balance=balance)
    return out


def source_figures(names, seg_source, seg_len, seg_doc, row_source, context_length: int, skipped=None) -> list[dict]:
    """Per named source, from its stored segments (rows never mix sources):

        names [web, code], segments (source, length, doc) (0, 5, 0) (0, 3, 1) | (1, 8, 2), rows [0, 1], L 8
        -> web: 2 documents, 8 tokens, 1 sequence, fill 1.0 | code: 1 document, 8 tokens, 1 sequence, fill 1.0

    `skipped`: docs_skipped by reason of each source, where known (a build's counters, a manifest)."""
    n = len(names)
    seg_source = np.asarray(seg_source, dtype=np.int64)
    tokens = np.bincount(seg_source, weights=seg_len, minlength=n).astype(np.int64)
    _, first = np.unique(np.asarray(seg_doc), return_index=True)  # one segment of each document
    documents = np.bincount(seg_source[first], minlength=n)
    rows = np.bincount(np.asarray(row_source, dtype=np.int64), minlength=n)
    return counted_source_figures(names, documents, tokens, rows, context_length, skipped)


def counted_source_figures(names, documents, tokens, rows, context_length: int, skipped=None) -> list[dict]:
    """source_figures from each source's counts: documents, tokens, sequences (rows)."""
    out = []
    for i, name in enumerate(names):
        slots = int(rows[i]) * context_length
        entry = {"name": name, "documents": int(documents[i]), "tokens": int(tokens[i]), "sequences": int(rows[i]),
                 "fill_rate": int(tokens[i]) / slots if slots else 0.0,
                 "padding_share": 1 - int(tokens[i]) / slots if slots else 0.0}
        if skipped is not None:
            entry["docs_skipped"] = dict(sorted(skipped[i].items()))
        out.append(entry)
    return out


def plan_source_figures(summary: dict, names, counters, unit_sources, context_length: int) -> list[dict]:
    """source_figures of a build from its per-source summary (packer/preprocess/sources.py summary), the
    source of each unit and the units' counters (in unit order)."""
    skipped = [{} for _ in names]
    for c, s in zip(counters, unit_sources):
        for reason, k in c["skipped"].items():
            skipped[s][reason] = skipped[s].get(reason, 0) + k
    rows = [r1 - r0 for (r0, r1), _ in summary["ranges"]]
    return counted_source_figures(names, summary["documents"], summary["tokens"], rows, context_length, skipped)


def add_trained(out: dict, trained: int, truncate_trained: int | None = None) -> dict:
    """Trained tokens of fine-tuning data (a loss mask) into figures `out`, in place: the total and
    its share of all tokens, and per strategy the share of its compute slots that trains
    (trained_share = trained tokens kept / compute_slots). Every strategy keeps every trained token
    except truncate, whose share needs the trained tokens inside each document's first L
    (`truncate_trained`; without it truncate gets none).

        4 documents, 100 tokens, 40 trained; pack_ffd 2 x 64 = 128 slots  ->  trained 40 (share 0.4),
        pack_ffd trained_share 40 / 128 = 0.3125
    """
    n_tokens = out["lengths"]["tokens"]
    out["trained"] = {"tokens": int(trained), "share": trained / n_tokens if n_tokens else 0.0}
    for name, s in out["strategies"].items():
        kept = truncate_trained if name == "truncate" else trained
        if kept is not None:
            s["trained_share"] = kept / s["compute_slots"] if s["compute_slots"] else 0.0
    return out


def dataset_trained(ds) -> int | None:
    """Trained tokens stored in a dataset (the sum of its loss masks), None when it has none."""
    if not getattr(ds, "has_loss_mask", False):
        return None
    return sum(int(np.count_nonzero(m)) for m in ds.mask_views(np.arange(len(ds))))
