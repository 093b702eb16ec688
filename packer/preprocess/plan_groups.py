"""Planning in bounded memory: groups of documents packed as tasks, bins dealt into buckets, one plan file per shard.

    units (lengths.npy)  ──  sources: consecutive unit ranges, each planned on its own
        │  group task g (any worker): lengths of documents [d0, d1) -> split -> FFD/BFD -> bins;
        │  each bin dealt to one of the source's B buckets (seeded, i.i.d. uniform)
        ▼
    _work/plan/group-GGGGGG.npy  pieces sorted by (bucket, bin)   + .starts.npy  [B + 1] piece offsets
        │  bucket task b (any worker): its slice of every group file of its source, bins shuffled
        │  (seeded), cut into shards greedily
        ▼
    _work/plan/bucket-BBBBBB-JJJJJ.npz  one shard's plan (a packer.preprocess.plan.Plan with one shard)
    _work/plan/bucket-BBBBBB.json, .stats.npz   per-shard counts, per-sequence tokens/docs/split/squares (stats.json)
        │  driver: numbers the shards bucket after bucket, source after source
        ▼
    _work/plan.npz    the index: shard -> bucket, counts per shard, per-source sequence and shard ranges

The shuffle. A source of G groups has B = G buckets. Every bin goes to exactly one bucket (drawn
uniformly and independently, rng keyed by (seed, source, group)), and each bucket's bins are put in
a uniformly random order (rng keyed by (seed, source, bucket)); buckets are output one after the
other. So every bin is written exactly once, and the order of a source's bins is a uniformly random
permutation of them (whatever the bucket sizes came out as, each order has the same chance), drawn
without any array over all bins; nothing depends on which worker ran what, or when. One group (no
--pack-group / --plan-memory) is one bucket shuffled by default_rng(seed): exactly the in-memory
plan_bins order, so small builds keep their bytes.

Memory. A group task holds its group's lengths and pieces: about GROUP_BYTES_PER_DOC bytes a document
at its peak (measured by benchmarks/bench_scale.py); a bucket task holds its bucket (one group's worth
on average). The driver holds O(units + groups + shards) small numbers, nothing per document.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from packer.binpack import pack, split_documents
from packer.io import atomic, failpoints, fs
from packer.preprocess.plan import _shard_boundaries

# Peak bytes a document of one group task (lengths, pieces, the packer's sort, the sorted records),
# from benchmarks/bench_scale.py, 2026-12-01: 108-112 measured, plus room for a bucket above the mean.
# --plan-memory M gives groups of M // this documents.
GROUP_BYTES_PER_DOC = 128
PLAN_DIR = "plan"
INDEX = "plan.npz"
# One piece in a group file (25 bytes): where its tokens are (unit, start, len), its document (from
# the group's first), its bin in the group's packing order, and whether its document is longer than
# the context (for stats).
PIECE = np.dtype([("unit", "<u4"), ("start", "<u8"), ("len", "<u4"), ("doc", "<u4"), ("bin", "<u4"), ("split", "u1")])
_DEAL, _SHUFFLE = 0x6465616C, 0x73687566  # tags that keep the two kinds of rng streams apart
# Per sequence in a bucket's .stats.npz: tokens, pieces (documents in the row; with --long-docs split a piece
# of a long document counts as one), pieces of documents longer than the context, and the sum of the pieces'
# squared lengths (the row's attention pairs: its step-balance cost, packer/stats/step_balance.py).
SEQUENCE_STATS = ("seq_tokens", "seq_docs", "seq_split", "seq_sq")


@dataclass(frozen=True)
class GroupTask:
    """Documents [d0, d1) (global numbers) of one source, as (unit, first, end) local document ranges."""

    source: int
    group: int  # global group number (names the file)
    local: int  # group number within the source
    n_buckets: int
    d0: int
    d1: int
    units: tuple  # ((unit, first doc in unit, end doc in unit), ...)


@dataclass(frozen=True)
class BucketTask:
    source: int
    bucket: int  # global bucket number (names the files)
    local: int  # bucket number within the source
    groups: tuple  # global numbers of the source's groups
    group_docs: tuple  # the first document of each of those groups


@dataclass(frozen=True)
class PlanIndex:
    """What the driver keeps of a plan: counts per shard and totals, nothing per document.

    shard_bucket[k], shard_local[k]   shard k's plan is bucket-{bucket}-{local}.npz
    source_sequences[s] : source_sequences[s+1]   the sequences of source s (same for shards)
    """

    shard_bucket: np.ndarray
    shard_local: np.ndarray
    shard_sequences: np.ndarray
    shard_tokens: np.ndarray
    shard_pieces: np.ndarray
    source_sequences: np.ndarray
    source_shards: np.ndarray
    n_buckets: int
    n_truncated_tokens: int
    n_dropped_docs: int
    piece_sq_sum: int  # sum of piece length squared (attention cost)

    @property
    def n_shards(self) -> int:
        return len(self.shard_bucket)

    @property
    def n_sequences(self) -> int:
        return int(self.shard_sequences.sum())

    @property
    def n_tokens(self) -> int:
        return int(self.shard_tokens.sum())

    @property
    def n_pieces(self) -> int:
        return int(self.shard_pieces.sum())

    def source_ranges(self) -> list[dict]:
        """[{"sequences": [first, end), "shards": [first, end)} per source], for the manifest."""
        q, k = self.source_sequences.tolist(), self.source_shards.tolist()
        return [{"sequences": [q[s], q[s + 1]], "shards": [k[s], k[s + 1]]} for s in range(len(q) - 1)]

    def shard_path(self, plan_dir: fs.Place, shard: int):
        return plan_dir / _shard_name(int(self.shard_bucket[shard]), int(self.shard_local[shard]))

    def sequence_stats(self, plan_dir) -> dict:
        """Per-sequence tokens, pieces, split pieces and squared piece lengths in output order (O(sequences),
        for stats.json); no seq_sq when a bucket's file has none (planned by a packer before it)."""
        parts = list(self.bucket_stats(plan_dir))
        keys = [k for k in SEQUENCE_STATS if all(k in p for p in parts)]
        return {k: np.concatenate([p[k] for p in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
                for k in keys}

    def bucket_stats(self, plan_dir):
        """sequence_stats one bucket at a time, in output order: {"seq_tokens", "seq_docs", "seq_split"}
        (int32 arrays over the bucket's sequences) and "seq_sq" (int64: the sum of its pieces' squared
        lengths, a row's attention pairs), one bucket's file in memory at a time."""
        for b in range(self.n_buckets):
            with np.load(fs.for_numpy(plan_dir / f"bucket-{b:06d}.stats.npz")) as z:
                yield {k: z[k] for k in SEQUENCE_STATS if k in z.files}

    def save(self, path):
        atomic.save_npz(path, **{k: np.asarray(getattr(self, k)) for k in self.__dataclass_fields__})

    @classmethod
    def load(cls, path) -> "PlanIndex":
        with np.load(fs.for_numpy(path)) as z:
            f = {k: z[k] for k in z.files}
        for k in ("n_buckets", "n_truncated_tokens", "n_dropped_docs", "piece_sq_sum"):
            f[k] = int(f[k])
        return cls(**f)


def _shard_name(bucket: int, local: int) -> str:
    return f"bucket-{bucket:06d}-{local:05d}.npz"


def group_size(pack_group: int | None, plan_memory: int | None) -> int | None:
    """Documents a group: --pack-group, else what --plan-memory holds, else None (one group a source)."""
    if pack_group is not None:
        return pack_group
    if plan_memory is not None:
        return max(1, plan_memory // GROUP_BYTES_PER_DOC)
    return None


def plan_tasks(unit_docs, source_units, group: int | None) -> tuple[list[GroupTask], list[BucketTask]]:
    """Cut each source's documents into groups of `group` (None: one group), and give each source
    as many buckets as groups. unit_docs[u]: documents of unit u; source_units: first unit of each
    source, ascending, starting at 0.

        unit_docs [3, 4, 2], source_units [0, 2], group 4
          source 0: docs [0, 7): groups [0, 4) units ((0, 0, 3), (1, 0, 1)) | [4, 7) ((1, 1, 4),)
          source 1: docs [7, 9): group  [7, 9) ((2, 0, 2),)
    """
    unit_docs = [int(n) for n in unit_docs]
    first_doc = np.concatenate([[0], np.cumsum(unit_docs, dtype=np.int64)]).tolist()
    bounds = list(source_units) + [len(unit_docs)]
    groups, buckets = [], []
    for s, (u0, u1) in enumerate(zip(bounds[:-1], bounds[1:])):
        D0, D1 = first_doc[u0], first_doc[u1]
        step = group or max(D1 - D0, 1)
        cuts = list(range(D0, D1, step)) + [D1] if D1 > D0 else [D0, D1]
        n = len(cuts) - 1
        mine = []
        for j, (d0, d1) in enumerate(zip(cuts[:-1], cuts[1:])):
            spans = tuple((u, max(d0, first_doc[u]) - first_doc[u], min(d1, first_doc[u + 1]) - first_doc[u])
                          for u in range(u0, u1) if first_doc[u] < d1 and first_doc[u + 1] > d0 or (d0 == d1 == first_doc[u]))
            mine.append(len(groups))
            groups.append(GroupTask(s, len(groups), j, n, d0, d1, spans))
        first = tuple(groups[g].d0 for g in mine)
        buckets += [BucketTask(s, len(buckets) + j, j, tuple(mine), first) for j in range(n)]
    return groups, buckets


def _group_pieces(task: GroupTask, units_dir, config):
    """The pieces of a group's documents (document order) and what the long-doc policy removed."""
    L = config.context_length
    lengths, unit, start = [], [], []
    for u, a, b in task.units:
        x = np.asarray(_read_slice(units_dir / f"unit-{u:06d}.lengths.npy", 0, b), dtype=np.int64)
        starts = np.cumsum(x) - x
        lengths.append(x[a:])
        start.append(starts[a:])
        unit.append(np.full(b - a, u, dtype=np.int64))
    doc_len, doc_unit, doc_start = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (lengths, unit, start))
    n_truncated = n_dropped = 0
    if config.long_docs == "split":
        piece_doc, piece_offset, piece_len = split_documents(doc_len, L)
    else:
        long = doc_len > L
        if config.long_docs == "truncate":
            n_truncated, keep = int((doc_len[long] - L).sum()), np.arange(len(doc_len))
        else:
            n_dropped, keep = int(long.sum()), np.flatnonzero(~long)
        piece_doc, piece_offset, piece_len = keep, np.zeros(len(keep), np.int64), np.minimum(doc_len[keep], L)
    columns = {"unit": doc_unit[piece_doc], "start": doc_start[piece_doc] + piece_offset, "len": piece_len,
               "doc": piece_doc, "split": doc_len[piece_doc] > L}
    return columns, n_truncated, n_dropped


def stable_order(key: np.ndarray) -> np.ndarray:
    """np.argsort(key, kind="stable") for non-negative integer keys: below 2**32 as two stable
    16-bit radix passes (low half, then high half), which numpy sorts about 10x faster than the
    timsort it uses for wider keys."""
    if not len(key) or int(key.max()) >= 2**32:
        return np.argsort(key, kind="stable")
    low = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
    return low[np.argsort((key[low] >> 16).astype(np.uint16), kind="stable")]


def plan_group(task: GroupTask, config, work: fs.Place) -> dict:
    """Pack one group and deal its bins into the source's buckets; write its pieces sorted by
    (bucket, bin) and where each bucket starts. Skipped when a finished run left its .json."""
    failpoints.hit("group", task.group)
    plan_dir = work / PLAN_DIR
    done = plan_dir / f"group-{task.group:06d}.json"
    if done.exists():
        return json.loads(done.read_text(encoding="utf-8"))
    columns, n_truncated, n_dropped = _group_pieces(task, work / "units", config)
    bins = pack(columns["len"], config.context_length, config.algorithm)
    n_bins = int(bins.max()) + 1 if len(bins) else 0
    if task.n_buckets > 1:
        deal = np.random.default_rng([config.seed, _DEAL, task.source, task.local])
        bucket = deal.integers(task.n_buckets, size=n_bins)
    else:
        bucket = np.zeros(n_bins, dtype=np.int64)
    columns["bin"] = bins
    order = stable_order(bucket[bins] * max(n_bins, 1) + bins)  # by bucket, bin, then document
    counts = np.bincount(bucket, minlength=task.n_buckets)
    starts = np.concatenate([[0], np.cumsum(np.bincount(bucket[bins], minlength=task.n_buckets))]).astype(np.int64)
    del bins, bucket
    rec = np.empty(len(order), dtype=PIECE)
    for name in PIECE.names:
        rec[name] = columns.pop(name)[order]
    del order
    atomic._save(plan_dir / f"group-{task.group:06d}.npy", lambda f: np.save(f, rec))
    atomic._save(plan_dir / f"group-{task.group:06d}.starts.npy", lambda f: np.save(f, starts))
    result = {"group": task.group, "docs": task.d1 - task.d0, "pieces": len(rec), "bins": n_bins,
              "tokens": int(rec["len"].sum(dtype=np.int64)), "bins_per_bucket_max": int(counts.max()) if len(counts) else 0,
              "truncated_tokens": n_truncated, "dropped_docs": n_dropped}
    atomic.write_json(done, result)
    return result


def _bucket_rng(seed: int, source: int, local: int):
    """default_rng(seed) for the first bucket of the first source (the in-memory plan's shuffle), a
    stream of its own for every other bucket."""
    if source == 0 and local == 0:
        return np.random.default_rng(seed)
    return np.random.default_rng([seed, _SHUFFLE, source, local])


def _read_slice(path: fs.Place, a: int, b: int) -> np.ndarray:
    """Rows [a, b) of a .npy file: a memory map locally (only those pages are read).
    TODO(plan-remote): a ranged read of the rows on a remote store, instead of the whole file."""
    return np.array(fs.load_npy(path)[a:b])


def _bucket_records(task: BucketTask, plan_dir) -> tuple[np.ndarray, np.ndarray]:
    """This bucket's pieces from every group of its source (group order) and bucket-local bin ids."""
    parts, docs = [], []
    for g, d0 in zip(task.groups, task.group_docs):
        s = np.load(fs.for_numpy(plan_dir / f"group-{g:06d}.starts.npy"))
        parts.append(_read_slice(plan_dir / f"group-{g:06d}.npy", int(s[task.local]), int(s[task.local + 1])))
        docs.append(d0 + parts[-1]["doc"].astype(np.int64))
    rec = np.concatenate(parts) if parts else np.zeros(0, PIECE)
    doc = np.concatenate(docs) if docs else np.zeros(0, np.int64)
    new = np.ones(len(rec), dtype=bool)  # a piece starts a new bin: another bin number, or another group
    if len(rec):
        new[1:] = rec["bin"][1:] != rec["bin"][:-1]
        edges = np.cumsum([len(p) for p in parts])[:-1]
        new[edges[edges < len(rec)]] = True
    return rec, doc, np.cumsum(new) - 1


def _small(x: np.ndarray) -> np.ndarray:
    """x in the smallest unsigned type that holds it (shard plans: 18 bytes a piece, not 32)."""
    top = int(x.max()) if len(x) else 0
    return x.astype(np.uint16 if top < 2**16 else np.uint32 if top < 2**32 else np.uint64)


def plan_bucket(task: BucketTask, config, work: fs.Place) -> dict:
    """Shuffle one bucket's bins, cut them into shards, write one plan file per shard; return the
    shards' counts. Skipped when a finished run left its .json."""
    failpoints.hit("bucket", task.bucket)
    plan_dir = work / PLAN_DIR
    done = plan_dir / f"bucket-{task.bucket:06d}.json"
    if done.exists():
        return json.loads(done.read_text(encoding="utf-8"))
    rec, doc, bins = _bucket_records(task, plan_dir)
    n_bins = int(bins[-1]) + 1 if len(bins) else 0
    position = _bucket_rng(config.seed, task.source, task.local).permutation(n_bins)  # output position of each bin
    seq_of_piece = position[bins]
    del bins
    order = stable_order(seq_of_piece)  # by output position, then as the group file had them
    cols = {name: rec[name][order] for name in ("unit", "start", "len", "split")}
    doc = doc[order]
    del rec
    seq_counts = np.bincount(seq_of_piece, minlength=n_bins)
    del order, seq_of_piece
    seq_starts = np.concatenate([[0], np.cumsum(seq_counts)]).astype(np.int64)
    piece_len = cols["len"].astype(np.int64)
    seq_tokens = np.add.reduceat(piece_len, seq_starts[:-1]) if n_bins else np.zeros(0, np.int64)
    seq_split = np.add.reduceat(cols["split"].astype(np.int64), seq_starts[:-1]) if n_bins else np.zeros(0, np.int64)
    piece_sq = piece_len * piece_len
    seq_sq = np.add.reduceat(piece_sq, seq_starts[:-1]) if n_bins else np.zeros(0, np.int64)
    shard_starts = _shard_boundaries(seq_tokens, config.shard_size)
    shards = []
    for j, (s0, s1) in enumerate(zip(shard_starts[:-1].tolist(), shard_starts[1:].tolist())):
        p0, p1 = int(seq_starts[s0]), int(seq_starts[s1])
        atomic.save_npz(plan_dir / _shard_name(task.bucket, j), piece_unit=cols["unit"][p0:p1],
                        piece_start=_small(cols["start"][p0:p1]), piece_len=_small(cols["len"][p0:p1]), piece_doc=doc[p0:p1],
                        seq_starts=seq_starts[s0 : s1 + 1] - p0,
                        shard_starts=np.array([0, s1 - s0], dtype=np.int64))
        shards.append({"sequences": s1 - s0, "tokens": int(seq_tokens[s0:s1].sum()), "pieces": p1 - p0})
    atomic.save_npz(plan_dir / f"bucket-{task.bucket:06d}.stats.npz", seq_tokens=seq_tokens.astype(np.int32),
                    seq_docs=seq_counts.astype(np.int32), seq_split=seq_split.astype(np.int32), seq_sq=seq_sq)
    result = {"bucket": task.bucket, "shards": shards, "piece_sq_sum": int(piece_sq.sum())}
    atomic.write_json(done, result)
    return result


def plan_streamed(unit_docs, config, work, executor, source_units=(0,), on_group=None) -> PlanIndex:
    """Plan a build whose units hold unit_docs[u] documents: group tasks, then bucket tasks, on
    `executor`; then number the shards and save the index (_work/plan.npz). Resumes: finished
    groups and buckets are not redone, and a saved index is returned as it is."""
    if (work / INDEX).exists():
        return PlanIndex.load(work / INDEX)
    source_units = list(source_units)
    if not source_units or source_units[0] != 0 or sorted(set(source_units)) != source_units or source_units[-1] > len(unit_docs):
        raise ValueError(f"source_units must ascend from 0 and stay below {len(unit_docs) + 1} units, got {source_units}")
    (work / PLAN_DIR).mkdir(exist_ok=True)
    groups, buckets = plan_tasks(unit_docs, source_units, group_size(config.pack_group, config.plan_memory))
    done = executor.map(plan_group, [(g, config, work) for g in groups], on_done=on_group)
    results = executor.map(plan_bucket, [(b, config, work) for b in buckets])
    index = _number_shards(buckets, results, done, len(source_units))
    index.save(work / INDEX)
    for g in groups:  # read by every bucket, needed by none now: the shard plans hold it all
        for suffix in (".npy", ".starts.npy"):
            (work / PLAN_DIR / f"group-{g.group:06d}{suffix}").unlink(missing_ok=True)
    return index


def _number_shards(buckets, results, group_results, n_sources: int) -> PlanIndex:
    """Shards numbered bucket after bucket (buckets come source after source)."""
    rows = [(t.bucket, j, t.source, s) for t, r in zip(buckets, results) for j, s in enumerate(r["shards"])]

    def col(f):
        return np.array([f(x) for x in rows], dtype=np.int64)

    shard_source = col(lambda x: x[2])
    shard_sequences = col(lambda x: x[3]["sequences"])
    cut = np.searchsorted(shard_source, np.arange(n_sources + 1)).astype(np.int64)
    seq_cum = np.concatenate([[0], np.cumsum(shard_sequences)]).astype(np.int64)
    return PlanIndex(
        shard_bucket=col(lambda x: x[0]), shard_local=col(lambda x: x[1]), shard_sequences=shard_sequences,
        shard_tokens=col(lambda x: x[3]["tokens"]), shard_pieces=col(lambda x: x[3]["pieces"]),
        source_sequences=seq_cum[cut], source_shards=cut, n_buckets=len(buckets),
        n_truncated_tokens=sum(r["truncated_tokens"] for r in group_results),
        n_dropped_docs=sum(r["dropped_docs"] for r in group_results),
        piece_sq_sum=sum(r["piece_sq_sum"] for r in results),
    )
