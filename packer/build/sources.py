"""Named sources through a build: their files and units, packed source after source, and their totals.

    sources  web: [a.jsonl, b.jsonl]   code: [c.jsonl]          (config.Job.sources)
    units    0 1 2 (a, b)  |  3 4 (c)             unit_sources (0, 0, 0, 1, 1), source_starts [0, 3, 5]
    plan     rows [0, 40) web  |  rows [40, 52) code   shards [0, 2) web  |  [2, 3) code

Each source is planned on its own (its documents packed and its bins shuffled apart from the
others'), so no row mixes sources and each source's rows are contiguous in shard order: the
loader blends sources by those row ranges (manifest["sources"][i]["sequences"]), and every
stored segment carries its source's index (`unit_sources` to the writer). A job without named
sources never comes here: its build is the one it always was.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from packer.build import readers
from packer.build.plan import Plan, plan_bins
from packer.config import BuildConfig, Source
from packer.io import fs


@dataclass(frozen=True)
class Named:
    """A job's named sources as the stages need them: their files, then (once planned) the source of
    each unit, the first unit of each source, and each unit's config (its source's text settings)."""

    sources: tuple[Source, ...]
    files_by_source: tuple[tuple[str, ...], ...]
    unit_sources: tuple[int, ...] = ()
    source_starts: tuple[int, ...] = ()
    unit_configs: tuple[BuildConfig, ...] = ()

    @classmethod
    def of(cls, job) -> "Named":
        return cls(job.sources, tuple(map(tuple, expand_sources(job.sources))))

    @property
    def files(self) -> list[str]:
        return [f for files in self.files_by_source for f in files]

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    @property
    def described(self) -> list[dict]:
        return fingerprint_sources(self.sources, self.files_by_source)

    @property
    def fingerprint(self) -> dict:
        return {"sources": self.described}

    def planned(self, config: BuildConfig, skipped_files=None) -> tuple[list, "Named"]:
        """(units of every source, this with unit_sources, source_starts and unit_configs filled in)."""
        units, unit_sources, starts = plan_source_units(self.sources, self.files_by_source, config, skipped_files)
        configs = [source_config(config, s) for s in self.sources]
        return units, dataclasses.replace(self, unit_sources=unit_sources, source_starts=tuple(starts),
                                          unit_configs=tuple(configs[s] for s in unit_sources))


def expand_sources(sources: tuple[Source, ...]) -> list[list[str]]:
    """The input files of each source, in build order (readers.expand_inputs per source)."""
    return [readers.expand_inputs(s.inputs) for s in sources]


def source_config(config: BuildConfig, source: Source) -> BuildConfig:
    """The build's config with the source's own text_field / text_split, where it sets them."""
    own = {k: getattr(source, k) for k in ("text_field", "text_split") if getattr(source, k) is not None}
    return dataclasses.replace(config, **own) if own else config


def plan_source_units(sources, files_by_source, config: BuildConfig, skipped_files=None):
    """Units of every source, numbered on across sources -> (units, unit_sources, source_starts).

    source_starts[i] : source_starts[i + 1] are the units of source i (len(sources) + 1 entries)."""
    units, unit_sources, starts = [], [], [0]
    for i, (source, files) in enumerate(zip(sources, files_by_source)):
        own = source_config(config, source)
        planned = readers.plan_units(files, own.unit_bytes, text_split=own.text_split, skipped_files=skipped_files)
        units += [dataclasses.replace(u, index=len(units) + k) for k, u in enumerate(planned)]
        unit_sources += [i] * len(planned)
        starts.append(len(units))
    return units, tuple(unit_sources), starts


def plan_by_source(unit_lengths: list[np.ndarray], source_starts, **plan_options) -> Plan:
    """plan_bins over each source's units on its own, the plans laid end to end: units, documents,
    sequences and shards of source i + 1 are numbered on after those of source i.

        source_starts [0, 2, 3]: units 0-1 packed together, unit 2 apart; a source with no units
        (or no accepted document) has no rows and no shard."""
    parts = []
    for a, b in zip(source_starts[:-1], source_starts[1:]):
        parts.append(plan_bins(unit_lengths[a:b], **plan_options))
    unit_base = np.asarray(source_starts[:-1], dtype=np.int64)
    doc_base = np.cumsum([0] + [sum(len(x) for x in unit_lengths[a:b])
                                for a, b in zip(source_starts[:-1], source_starts[1:])])
    piece_base = np.cumsum([0] + [len(p.piece_len) for p in parts])
    seq_base = np.cumsum([0] + [p.n_sequences for p in parts])

    def cat(name, base):
        return np.concatenate([getattr(p, name) + off for p, off in zip(parts, base)] or [np.zeros(0, np.int64)])

    return Plan(
        piece_unit=cat("piece_unit", unit_base),
        piece_start=cat("piece_start", [0] * len(parts)),
        piece_len=cat("piece_len", [0] * len(parts)),
        piece_doc=cat("piece_doc", doc_base),
        seq_starts=np.concatenate([[0]] + [p.seq_starts[1:] + off for p, off in zip(parts, piece_base)]).astype(np.int64),
        shard_starts=np.concatenate([[0]] + [p.shard_starts[1:] + off for p, off in zip(parts, seq_base)]).astype(np.int64),
        n_truncated_tokens=sum(p.n_truncated_tokens for p in parts),
        n_dropped_docs=sum(p.n_dropped_docs for p in parts),
    )


def source_rows(plan: Plan, unit_sources, n_sources: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """((first_row, end_row), (first_shard, end_shard)) of each source, read off the plan: the source
    of a row is the source of its first piece's unit. Asserts what plan_by_source promises (rows of
    one source contiguous, no shard across two sources)."""
    unit_sources = np.asarray(unit_sources, dtype=np.int64)
    row_source = unit_sources[plan.piece_unit[plan.seq_starts[:-1]]] if plan.n_sequences else np.zeros(0, np.int64)
    assert np.all(np.diff(row_source) >= 0), "rows of a source are not contiguous"
    row_ends = np.searchsorted(row_source, np.arange(n_sources), side="right")
    row_firsts = np.searchsorted(row_source, np.arange(n_sources), side="left")
    shard_ends = np.searchsorted(plan.shard_starts, row_ends)
    shard_firsts = np.searchsorted(plan.shard_starts, row_firsts)
    assert np.all(plan.shard_starts[shard_ends] == row_ends), "a shard holds rows of two sources"
    return [((int(a), int(b)), (int(c), int(d))) for a, b, c, d in zip(row_firsts, row_ends, shard_firsts, shard_ends)]


def fingerprint_sources(sources, files_by_source) -> list[dict]:
    """What of the sources decides the bytes (names, files, own settings), for _work/fingerprint.json
    and manifest["sources"]: [{"name": "web", "inputs": ["a.jsonl", ...], "text_field": "content"}, ...]."""
    out = []
    for source, files in zip(sources, files_by_source):
        entry = {"name": source.name, "inputs": [fs.redact(str(f)) for f in files]}
        entry.update({k: getattr(source, k) for k in ("text_field", "text_split") if getattr(source, k) is not None})
        out.append(entry)
    return out


def source_entries(described: list[dict], unit_sources, counters, plan: Plan, context_length: int) -> list[dict]:
    """manifest["sources"]: each source's description plus its rows, shards and totals. Summed over the
    sources, docs_read, docs_accepted, docs_skipped, tokens_in, tokens and the row counts are the
    build's totals; documents (stored) is docs_accepted less docs_dropped_long."""
    unit_sources = np.asarray(unit_sources, dtype=np.int64)
    piece_source = unit_sources[plan.piece_unit] if len(plan.piece_unit) else np.zeros(0, np.int64)
    n = len(described)
    tokens = np.bincount(piece_source, weights=plan.piece_len, minlength=n).astype(np.int64)
    _, first_piece = np.unique(plan.piece_doc, return_index=True)  # one piece of each stored document
    stored_docs = np.bincount(piece_source[first_piece], minlength=n)
    out = []
    for i, ((r0, r1), (k0, k1)) in enumerate(source_rows(plan, unit_sources, n)):
        mine = [c for c, s in zip(counters, unit_sources.tolist()) if s == i]
        skipped: dict[str, int] = {}
        for c in mine:
            for reason, k in c["skipped"].items():
                skipped[reason] = skipped.get(reason, 0) + k
        accepted = sum(c["docs_accepted"] for c in mine)
        tokens_in = sum(c["tokens"] for c in mine)
        slots = (r1 - r0) * context_length
        out.append({
            **described[i],
            "sequences": [r0, r1],
            "shards": [k0, k1],
            "docs_read": sum(c["docs_read"] for c in mine),
            "docs_accepted": accepted,
            "docs_skipped": dict(sorted(skipped.items())),
            "documents": int(stored_docs[i]),
            "tokens_in": tokens_in,
            "tokens": int(tokens[i]),
            "padding": slots - int(tokens[i]),
            "fill_rate": int(tokens[i]) / slots if slots else None,
        })
    return out


def require_same_sources(manifest: dict, described: list[dict], out):
    """A complete dataset is 'already complete' only for the same sources (resume.require_same_dataset
    compares config, tokenizer and the file list, which two namings of the same files share)."""
    old = [{k: v for k, v in s.items() if k in ("name", "inputs", "text_field", "text_split")}
           for s in manifest.get("sources") or ()]
    if old != described:
        raise ValueError(f"{fs.redact(out)} already holds a complete dataset built with other sources "
                         f"({[s['name'] for s in old] or 'none named'} there, {[s['name'] for s in described] or 'none named'} "
                         "now, or other files or settings in one); pass --overwrite to replace it, or choose another --output")
