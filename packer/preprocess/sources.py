"""Named sources through a build: their files and units, packed source after source, and their totals.

    sources  web: [a.jsonl, b.jsonl]   code: [c.jsonl]          (config.Job.sources)
    units    0 1 2 (a, b)  |  3 4 (c)             unit_sources (0, 0, 0, 1, 1), source_starts [0, 3, 5]
    plan     rows [0, 40) web  |  rows [40, 52) code   shards [0, 2) web  |  [2, 3) code

Each source is planned on its own (packer/preprocess/plan_groups.py, given the first unit of each) (its documents packed and its bins shuffled apart from the
others'), so no row mixes sources and each source's rows are contiguous in shard order: the
loader blends sources by those row ranges (manifest["sources"][i]["sequences"]), and every
stored segment carries its source's index (`unit_sources` to the writer). A job without named
sources never comes here: its build is the one it always was.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from packer.config import BuildConfig, Source
from packer.io import fs
from packer.preprocess import readers


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


def summary(index, unit_long, counters, unit_sources, config: BuildConfig) -> dict:
    """Per source, from the plan index (packer/preprocess/plan_groups.py: each source planned on its own,
    its rows and shards contiguous), the units' counters and unit_long[u], the accepted documents of
    unit u longer than the context (read only under --long-docs drop; None otherwise):

        ranges     [((first_row, end_row), (first_shard, end_shard)), ...]
        tokens     int64 per source: tokens stored (the shard totals of its shards)
        documents  int64 per source: documents stored (accepted less dropped as too long)"""
    ranges = [(tuple(r["sequences"]), tuple(r["shards"])) for r in index.source_ranges()]
    n = len(ranges)
    shard_tokens = np.concatenate([[0], np.cumsum(index.shard_tokens, dtype=np.int64)])
    tokens = np.array([shard_tokens[k1] - shard_tokens[k0] for _, (k0, k1) in ranges], dtype=np.int64)
    stored = np.array([c["docs_accepted"] for c in counters], dtype=np.int64)
    if config.long_docs == "drop":
        stored -= np.asarray(unit_long, dtype=np.int64)
    documents = np.bincount(np.asarray(unit_sources, np.int64), weights=stored, minlength=n).astype(np.int64)
    return {"ranges": ranges, "tokens": tokens, "documents": documents}


def long_documents(unit_lengths, context_length: int) -> list[int]:
    """Documents longer than the context in each unit (`unit_lengths`: one array per unit, in order)."""
    return [int(np.count_nonzero(np.asarray(x) > context_length)) for x in unit_lengths]


def fingerprint_sources(sources, files_by_source) -> list[dict]:
    """What of the sources decides the bytes (names, files, own settings), for _work/fingerprint.json
    and manifest["sources"]: [{"name": "web", "inputs": ["a.jsonl", ...], "text_field": "content"}, ...]."""
    out = []
    for source, files in zip(sources, files_by_source):
        entry = {"name": source.name, "inputs": [fs.redact(str(f)) for f in files]}
        entry.update({k: getattr(source, k) for k in ("text_field", "text_split") if getattr(source, k) is not None})
        out.append(entry)
    return out


def source_entries(described: list[dict], unit_sources, counters, summary: dict, context_length: int) -> list[dict]:
    """manifest["sources"]: each source's description plus its rows, shards and totals (`summary`:
    see summary()). Summed over the sources, docs_read, docs_accepted, docs_skipped, tokens_in, tokens
    and the row counts are the build's totals; documents (stored) is docs_accepted less docs_dropped_long."""
    unit_sources = np.asarray(unit_sources, dtype=np.int64)
    tokens, stored_docs = summary["tokens"], summary["documents"]
    out = []
    for i, ((r0, r1), (k0, k1)) in enumerate(summary["ranges"]):
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
