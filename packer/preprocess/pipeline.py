"""The build, as stages over paths: tokenize -> plan -> write -> finalize -> publish.

    OUTPUT/.packer.lock                                           held while a build runs (packer/io/lock.py)
    OUTPUT/.packer-owned.json                                     what packer wrote here, with sha256 (packer/preprocess/owned.py)
    OUTPUT/_work/fingerprint.json                                 config + inputs of this work (packer/preprocess/resume.py)
    OUTPUT/_work/units/unit-XXXXXX.{tokens.npy,lengths.npy,json}   tokenize (one per work unit)
    OUTPUT/_work/plan/{group,bucket}-*.{npy,npz,json}            plan tasks (lengths only; one plan file per shard)
    OUTPUT/_work/plan.npz                                         plan index: shard -> plan file, counts per shard
    OUTPUT/_work/dataset/shard-XXXXX.{arrow | bin+idx}, _work/shards/*.json
                                                                  write (one per shard; the .json says done)
    OUTPUT/_work/dataset/{stats.json, report.html, tokenizer.json, [the format's derived files], manifest.json}
                                                                  finalize (manifest last)
    OUTPUT/...                                                    publish: moved in, manifest last (owned.publish)

Every file is written under a temporary name and renamed into place; each stage reads
only what the one before wrote and skips work whose output exists, so re-running the
same command after a crash at any point resumes it and gives the same bytes. The new dataset
is complete in _work/dataset/ before anything in OUTPUT changes, so an --overwrite cut short
leaves the old one as it was. OUTPUT may also be a URI (packer/io/fs.py): there files go
straight to their final names, a unit's or shard's .json and the manifest, written after them,
say what is complete, publish moves by the filesystem's copy and delete, and no lock is held.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
import warnings

import numpy as np

from packer._version import __version__
from packer.config import Job
from packer.encode import engines
from packer.encode.chat_source import chat_template_manifest
from packer.encode.tokenizer import (
    TokenizerInfo,
    resolved_config,
    specials_manifest,
    tokenizer_info,
)
from packer.io import atomic, failpoints, fs, lock
from packer.io.progress import Progress
from packer.preprocess import changed, owned, plan_groups, readers, resume, sources, writer
from packer.preprocess.executors import make_executor, runs_inline
from packer.preprocess.plan import Plan
from packer.preprocess.plan_groups import PlanIndex
from packer.preprocess.tokenize import tokenize_task, trained_totals, unit_paths, warm_worker
from packer.stats import report
from packer.stats.figures import add_trained, plan_source_figures
from packer.stats.streamed import finalize_stats
from packer.store import formats
from packer.store.manifest import FORMAT_VERSION, MANIFEST, REPORT, STATS, read_manifest

WORK = "_work"


def _tokenize_stage(units, info, config, units_dir, executor, progress="auto", unit_configs=None):
    total = sum(max(u.size, 0) for u in units)
    n_done = [0]
    finished = [unit_paths(units_dir, u.index)["json"].exists() for u in units]  # by an earlier run: not in the rates
    earlier = {(fs.redact(u.path), u.start, u.end): max(u.size, 0) for u, was in zip(units, finished) if was}
    with Progress("tokenize", total, "B", mode=progress, before=sum(earlier.values()),
                  before_note=f"{len(earlier)} of {len(units)} units") as bar:
        seen = {"docs": 0, "tokens": 0}

        def done(counters):
            if (counters.get("path"), counters.get("start"), counters.get("end")) in earlier:  # an earlier run's
                n_done[0] += 1
                failpoints.hit("tokenize", n_done[0])
                return
            seen["docs"] += counters["docs_accepted"]
            seen["tokens"] += counters["tokens"]
            seconds = bar.elapsed()
            bar.update(max(counters.get("bytes", 0), 0),
                       f"{seen['docs'] / seconds:,.0f} docs/s, {seen['tokens'] / seconds:,.0f} tok/s")
            n_done[0] += 1
            failpoints.hit("tokenize", n_done[0])

        args = [(u, info, unit_configs[u.index] if unit_configs else config, units_dir) for u in units]
        sizes = [0 if was else u.size for u, was in zip(units, finished)]  # a pool starts the largest first
        return executor.map(tokenize_task, args, on_done=done, sizes=sizes)


def _unit_docs(units_dir, n_units: int) -> list[int]:
    """Documents of each unit, from its lengths.npy header alone."""
    out = []
    for u in range(n_units):
        with unit_paths(units_dir, u)["lengths.npy"].open("rb") as f:
            major, _ = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, _, _ = read_header(f)
        out.append(int(shape[0]))
    return out


def _plan_stage(n_units: int, config, work, executor, source_units=(0,), progress="auto") -> PlanIndex:
    """Plan as tasks on `executor` (packer/preprocess/plan_groups.py): groups of documents, then buckets
    of bins, one plan file per shard; the driver keeps only the index. source_units: the first unit
    of each source (one source: all units)."""
    if (work / plan_groups.INDEX).exists():
        return plan_groups.PlanIndex.load(work / plan_groups.INDEX)
    unit_docs = _unit_docs(work / "units", n_units)
    n_done = 0
    with Progress("plan", sum(unit_docs), "doc", mode=progress) as bar:

        def done(result):
            nonlocal n_done
            n_done += 1
            bar.update(result["docs"])
            failpoints.hit("planned", n_done)

        index = plan_groups.plan_streamed(unit_docs, config, work, executor, source_units, on_group=done)
    failpoints.hit("plan", 0)
    return index


def _write_stage(plan: PlanIndex, info, config, work, out, executor, progress="auto", unit_sources=None,
                 loss_mask: bool = False):
    role_ids = loss_mask and config.store_roles  # chat with --store-roles (every unit then holds records)
    (work / "shards").mkdir(exist_ok=True)
    n_done = 0
    shard_done = [work / "shards" / f"shard-{k:05d}.json" for k in range(plan.n_shards)]
    earlier = [json.loads(p.read_text(encoding="utf-8")) for p in shard_done if p.exists()]  # an earlier run's
    with Progress("write", plan.n_tokens, "tok", mode=progress, before=sum(e["tokens"] for e in earlier),
                  before_note=f"{len(earlier)} of {plan.n_shards} shards") as bar:
        earlier_files = {e["file"] for e in earlier}

        def done(entry):
            nonlocal n_done
            n_done += 1
            if entry["file"] not in earlier_files:
                bar.update(entry["tokens"])
            failpoints.hit("write", n_done)

        args = [
            (plan.shard_path(work / plan_groups.PLAN_DIR, k), k, work, out, info.dtype.name, config.format)
            for k in range(plan.n_shards)
        ]
        if unit_sources or loss_mask:  # named and described as write_shard in errors (executors.describe_call)
            options = {"unit_sources": unit_sources} if unit_sources else {}
            options.update({"role_ids": True} if role_ids else {})
            write = functools.update_wrapper(functools.partial(writer.write_shard, loss_mask=loss_mask, **options),
                                             writer.write_shard)
        else:
            write = writer.write_shard
        return executor.map(write, args, on_done=done)


def _shard_plans(plan: PlanIndex, work):
    """Each shard's own plan, one at a time (packer/preprocess/plan_groups.py)."""
    for k in range(plan.n_shards):
        yield Plan.load(fs.for_numpy(plan.shard_path(work / plan_groups.PLAN_DIR, k)))


def _totals(unit_counters, plan: PlanIndex, config, work, skipped_files=()) -> dict:
    skipped: dict[str, int] = {}
    failed = {f["path"]: f["error"] for f in skipped_files}
    for c in unit_counters:
        if c.get("file_error"):
            failed.setdefault(c["path"], c["file_error"])
        for reason, n in c["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + n
    tokens_in = sum(c["tokens"] for c in unit_counters)
    tokens_out = plan.n_tokens
    slots = plan.n_sequences * config.context_length
    return {
        "docs_read": sum(c["docs_read"] for c in unit_counters),
        "docs_accepted": sum(c["docs_accepted"] for c in unit_counters),
        "docs_skipped": skipped,
        "skip_examples": [e for c in unit_counters for e in c["skip_examples"]][:20],
        "files_skipped": [{"path": p, "error": e} for p, e in failed.items()],
        "docs_dropped_long": plan.n_dropped_docs,
        **_inner_eos(unit_counters),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_truncated": plan.n_truncated_tokens,
        "sequences": plan.n_sequences,
        "pieces": plan.n_pieces,
        "fill_rate": tokens_out / slots if slots else None,  # no sequence: no fill to speak of
        **trained_totals(unit_counters, _shard_plans(plan, work), work),
    }


def _inner_eos(unit_counters) -> dict:
    """docs_inner_eos, the accepted documents holding the EOS id before their last token, summed over
    the units (packer/preprocess/inner_eos.py); {} when a unit did not count them (a tokenizer without
    EOS, or units of an older packer resumed)."""
    if not unit_counters or any("docs_inner_eos" not in c for c in unit_counters):
        return {}
    return {"docs_inner_eos": sum(c["docs_inner_eos"] for c in unit_counters)}


class BuildRejected(ValueError):
    """The inputs were read but too few documents were accepted to call the build a success."""


def _skip_summary(counters, limit: int = 3) -> str:
    """("{'missing_field': 3837, 'empty_text': 2}", "; e.g. missing_field at a.jsonl:1; ..."): the top reasons."""
    skipped: dict[str, int] = {}
    for c in counters:
        for reason, n in c["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + n
    top = dict(sorted(skipped.items(), key=lambda kv: -kv[1])[:limit])
    examples = {}
    for e in (e for c in counters for e in c["skip_examples"]):
        examples.setdefault(e["reason"], e["where"])
    shown = [f"{r} at {examples[r]}" for r in top if r in examples]
    return f"{top}", (f"; e.g. {'; '.join(shown)}" if shown else "")


def _no_document_fix(counters, config, units) -> str:
    """What to do when nothing was accepted: give inputs that hold records (nothing read), name the field
    the records do have (each skipped for lacking the text field: its first record's fields), or look at
    the reasons."""
    if not sum(c["docs_read"] for c in counters):
        return "the inputs are empty: give files that hold documents"
    if config.input_kind == "text" and all(set(c["skipped"]) <= {"missing_field"} for c in counters):
        for unit, c in zip(units, counters):
            if c["skipped"].get("missing_field"):
                try:
                    fields = sorted(readers.field_names(unit, max_doc_bytes=config.max_doc_bytes))
                except (ValueError, OSError):
                    break
                if fields:
                    from packer.encode.records import kind_of_fields

                    shown = ", ".join(map(repr, fields[:20])) + (", ..." if len(fields) > 20 else "")
                    kind = kind_of_fields(fields, config)
                    other = f", or read them as {kind} records with --input-kind {kind}" if kind != "text" else ""
                    return (f"no record has the field {config.text_field!r}; the first record of "
                            f"{fs.redact(unit.path)} has {shown}: name the text's field with --text-field{other}")
                break
    return "fix the inputs or the settings (the reasons above) and run again"


def _check_accepted(counters, config, work, units=()):
    """Refuse to finish a build that accepted nothing, or skipped more than config.max_skip_fraction
    of what it read. Nothing accepted: `work` is deleted (nothing in it is worth resuming, and the
    fix, e.g. another --text-field, is another fingerprint). Too many skipped: `work` is kept, so the
    same command with a higher limit resumes from the finished units."""
    read = sum(c["docs_read"] for c in counters)
    accepted = sum(c["docs_accepted"] for c in counters)
    skipped = sum(sum(c["skipped"].values()) for c in counters)
    if not accepted:
        fs.rmtree(work)
        reasons, examples = _skip_summary(counters)
        why = f" ({skipped:,} skipped: {reasons}){examples}" if skipped else " (the inputs hold no records)"
        raise BuildRejected(f"no document accepted: 0 accepted of {read:,} read{why}; nothing was written: "
                            f"{_no_document_fix(counters, config, units)}")
    limit = config.max_skip_fraction
    if limit is not None and skipped / read > limit:
        reasons, examples = _skip_summary(counters)
        raise BuildRejected(f"{skipped / read:.2%} of {read:,} documents read were skipped ({skipped:,}), over "
                            f"--max-skip-fraction {limit:g}: {reasons}{examples};\nfinished work is kept: fix "
                            "the inputs, or raise the limit and run the same command to resume")


def _shipped(info) -> dict:
    """What the tokenizer file turned on that packer turns off (written only when on: sample builds
    keep their bytes)."""
    out = {}
    if info.shipped_truncation is not None:
        out["shipped_truncation"] = info.shipped_truncation
    if info.shipped_padding:
        out["shipped_padding"] = True
    return out


@dataclasses.dataclass
class _Run:
    """One build as its stages hand it on: what it reads (inputs, tokenizer, sources), where it writes
    (`work`, and `staged` = work/dataset/), and what each stage produced; finalize reads it whole."""

    job: Job
    files: list
    info: TokenizerInfo
    work: fs.Place
    staged: fs.Place
    named: sources.Named | None = None
    units: list = dataclasses.field(default_factory=list)
    skipped_files: list = dataclasses.field(default_factory=list)
    counters: list = dataclasses.field(default_factory=list)  # tokenize: each unit's counters
    plan: PlanIndex | None = None
    entries: list = dataclasses.field(default_factory=list)  # write: each shard's manifest entry


def _finalize(run: _Run) -> dict:
    """stats.json, report.html, tokenizer.json and a format's extra files into run.staged; the manifest (returned)."""
    config, info, counters, plan, named = run.job.config, run.info, run.counters, run.plan, run.named
    out, work, files = run.staged, run.work, run.files
    length_files = [unit_paths(work / "units", u.index)["lengths.npy"] for u in run.units]

    def unit_lengths():  # one unit's lengths in memory at a time
        return (np.load(fs.for_numpy(p)) for p in length_files)

    n_docs = sum(int(c["docs_accepted"]) for c in counters)
    if named:
        unit_long = sources.long_documents(unit_lengths(), config.context_length) if config.long_docs == "drop" else None
        summary = sources.summary(plan, unit_long, counters, named.unit_sources, config)
    if n_docs:  # no accepted document: nothing to measure, so no stats.json
        figures = finalize_stats(unit_lengths, plan, work / plan_groups.PLAN_DIR, config.context_length,
                                 algorithm=config.algorithm, seed=config.seed, n_documents=n_docs, inputs=files)
        if named:
            figures["sources"] = plan_source_figures(summary, named.names, counters, named.unit_sources,
                                                     config.context_length)
        if trained := trained_totals(counters, (), work):  # fine-tuning data: trained share per strategy
            add_trained(figures, trained["trained_tokens_in"])  # the strategies see every accepted example
        atomic.write_json(out / STATS, figures)
    atomic.copy_file(info.path, out / "tokenizer.json")  # the dataset decodes without its source
    for name, data in formats.derived_files(config.format, run.entries).items():  # arrow: HF datasets' files
        atomic.write_bytes(out / name, data)
    manifest = {
        "format_version": FORMAT_VERSION,
        "tool": {"name": "packer", "version": __version__},
        "config": {
            **config.to_dict(),
            "eos_id": info.eos_id,
            "bos_id": info.bos_id,
            "pad_id": info.pad_id,
            "token_dtype": info.dtype.name,
        },
        "tokenizer": {"path": fs.redact(info.path), "sha256": info.sha256, "vocab_size": info.vocab_size,
                      **_shipped(info), **specials_manifest(info),
                      # which engine encoded (every engine gives the same ids: packer/encode/engines)
                      "encode_engine": {"name": info.engine, "reason": info.engine_reason,
                                        "check": engines.CHECKS[info.engine]},
                      **chat_template_manifest(info, config, any(c.get("input_kind") == "chat" for c in counters))},
        "inputs": readers.input_descriptions(files),
        "shards": run.entries,
        "totals": _totals(counters, plan, config, work, run.skipped_files),
        "created_unix": round(time.time(), 3),  # before the page: its header says the date
    }
    if named:
        manifest["sources"] = sources.source_entries(named.described, named.unit_sources, counters, summary,
                                                     config.context_length)
    if config.store_roles:  # what the shards' role_ids mean (docs/role_masks.md)
        manifest["roles"] = config.role_table
    if n_docs:  # the page's header names the build from its manifest (packer/stats/report.py page_build)
        atomic.write_bytes(out / REPORT, report.html_page(figures, report.page_build(manifest)).encode("utf-8"))
    for line in formats.build_notes(config.format, manifest):  # nemo: what its trainer does with EOS inside documents
        warnings.warn(line, stacklevel=2)
    failpoints.hit("finalize", 0)
    return fs.redact_json(manifest)  # as written: no credentials from input, tokenizer or output URIs


def build(job: Job, *, keep_work: bool = False, overwrite: bool = False, progress: str = "auto") -> dict:
    """Run, resume, or (with nothing left to do) skip a build; return the manifest. `progress`:
    "auto" (a bar on a terminal, plain lines otherwise), "bar", "lines" or "off" (packer/io/progress.py).

    Under the output's lock: a directory holding files packer did not write is refused (by its
    record, packer/preprocess/owned.py); a complete dataset from the same command is returned as is
    (`already_complete`); one from another command, or a `_work/` from another config or other
    inputs, is refused unless `overwrite`. The new dataset is built in `_work/dataset/` and moved
    into OUTPUT once complete, so with `overwrite` the old one stays whole until then."""
    config = job.config
    out = fs.location(job.output)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output {fs.redact(out)} is a file; give a directory (new, or one packer wrote)")
    if fs.is_process_local(out) and not runs_inline(job):
        raise ValueError(f"--output {fs.redact(out)} is in this process's memory, which worker processes do not share; use --workers 1")
    named = sources.Named.of(job) if job.sources else None  # None: one unnamed source, the build as it always was
    files = named.files if named else readers.expand_inputs(job.inputs)
    pool = _pool_started_early(job, files, out, overwrite)
    try:
        # A started pool's first free worker, which loaded the tokenizer and its engine for its tasks,
        # reads the build's info: the driver never loads them (0.25-0.3 s of CPU for 50,000 tokens, on
        # the cores the workers warm up on; 55 MB).
        info = pool.call(tokenizer_info, job.tokenizer, config) if pool else tokenizer_info(job.tokenizer, config)
        job = dataclasses.replace(job, config=resolved_config(config, info))  # bos/eos as used, never None
        made = _dirs_to_make(out)
        try:
            return _build_locked(job, files, info, out, named, keep_work, overwrite, progress, pool)
        except BaseException:
            _remove_empty(made)  # a build refused before writing leaves no empty output directory behind
            raise
    finally:
        if pool is not None:
            pool.close(now=True)  # a build that used it closed it already; one that stopped early ends it here


def _pool_started_early(job: Job, files, out, overwrite: bool):
    """The local pool a build will tokenize on, started first, each worker loading the tokenizer and
    engine as it starts (tokenize.warm_worker), so that the workers are ready when the first unit is
    (and one of them reads the build's tokenizer_info: build()): None where the build may need no pool
    (Ray, one worker, one input no larger than a unit) or has a complete dataset to return (an
    unchanged command run again)."""
    if runs_inline(job) or job.executor != "local" or ((out / MANIFEST).exists() and not overwrite):
        return None
    if len(files) < 2 and not (files and _local_size(files[0]) > job.config.unit_bytes):
        return None
    pool = make_executor(job, warm=(warm_worker, (job.tokenizer, job.config.encode_engine)))
    pool.start()
    return pool


def _local_size(path) -> int:
    """A local file's size; 0 for a URI or what cannot be read (the build names it later)."""
    try:
        return 0 if fs.is_uri(path) else os.path.getsize(path)
    except (OSError, TypeError, ValueError):
        return 0


def _dirs_to_make(out) -> list:
    """The output directory and the parents above it that do not exist yet (a local output; a store
    has no directories), deepest first: what the lock will create, and all a failed build removes."""
    made = []
    if fs.is_remote(out) or fs.is_process_local(out):
        return made
    while not out.exists() and out != out.parent:
        made.append(out)
        out = out.parent
    return made


def _remove_empty(made: list):
    """Remove the directories packer made for this build, deepest first, each only while it is empty
    (rmdir refuses otherwise: resumable work, a lock another build holds, anyone's file stay)."""
    for d in made:
        try:
            os.rmdir(d)
        except OSError:
            return


def _build_locked(job: Job, files, info, out, named, keep_work: bool, overwrite: bool, progress: str,
                  pool=None) -> dict:
    """build() under the output's lock (its docstring); `pool`: the executor started early, or None."""
    config = job.config
    with lock.hold(out):
        record = _owned_record(out)
        work = out / WORK
        expected = {**resume.fingerprint(config, info, files), **(named.fingerprint if named else {})}
        if (out / MANIFEST).exists() and not overwrite:
            manifest = read_manifest(out)
            resume.require_same_dataset(manifest, config, info, files, out)
            if named or manifest.get("sources"):
                sources.require_same_sources(manifest, named.described if named else [], out)
            missing = resume.missing_files(out, manifest)
            if not missing:
                if (work.exists() or record["work"]) and not keep_work:  # a run stopped after its manifest, before
                    owned.remove_work(out, record)  # this (or before the record said _work/ was gone: a full disk)
                return {**manifest, "already_complete": True}
            if not (work.exists() and resume.same_work(work, expected)):  # else: rebuilt from _work/ below
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise ValueError(f"{fs.redact(out / missing[0])}{more} is missing from the complete dataset its "
                                 "manifest describes: run the same command with --overwrite to rebuild the dataset "
                                 "(byte-identical), or restore the file")
        if overwrite and work.exists() and not resume.same_work(work, expected):
            owned.remove_work(out, record)  # another command's unfinished work: the old dataset stays
        earlier = _earlier_work(work)
        manifest = _build_into(job, files, info, out, work, record, expected, progress, named, overwrite, pool)
        owned.publish(out, manifest, record)
        if not keep_work:
            owned.remove_work(out, record)
    return {**manifest, "resumed": earlier} if earlier else manifest  # `resumed` is not written: the summary's


def _earlier_work(work) -> dict | None:
    """What an earlier run of this build left finished in `work` (None: nothing, a fresh build):
    {"units": tokenized units, "shards": written shards}."""
    done = {kind: sum(1 for p in (work / kind).iterdir() if p.name.endswith(".json")) if (work / kind).is_dir() else 0
            for kind in ("units", "shards")}
    return done if any(done.values()) else None


def _owned_record(out) -> dict:
    """The output's record of packer's files, with an interrupted publish finished; refuses foreign files."""
    owned.clear_leftovers(out)
    had_record = (out / owned.RECORD).exists()
    record = owned.load(out)
    owned.finish(out, record)
    if record["work"] == owned.REMOVING:  # a kill while _work/ was deleted: finish that first, never resume from it
        owned.remove_work(out, record)
    resume.refuse_foreign(out, record)
    if not had_record and (record["files"] or record["work"]):
        owned.save(out, record)  # a dataset of a packer without records, adopted once
    return record


def _start_work(out, work, record: dict, expected: dict):
    """Create or resume `work` (its fingerprint `expected`), recorded as packer's; return its staging dir."""
    owned.claim_work(out, record)
    resume.start_or_resume(work, expected)
    staged = work / owned.STAGED
    for d in (work, work / "units", work / "shards", staged):
        d.mkdir(parents=True, exist_ok=True)
        atomic.remove_leftovers(d)
    return staged


def _build_into(job: Job, files, info, out, work, record: dict, expected: dict, progress, named=None,
                overwrite: bool = False, pool=None) -> dict:
    """Tokenize, plan, write and finalize into `work`/dataset/ (manifest last); return the manifest.
    `named`: the job's named sources (packer/preprocess/sources.py), or None for one unnamed source.
    `overwrite`: work whose inputs changed since it was read is discarded, not refused. `pool`: the
    job's executor, started already (_pool_started_early), else one is made here; closed here either way."""
    config = job.config
    started = time.time()
    skipped_files = [] if config.on_file_error == "skip" else None
    # Planned before any work file is written: a refused input (unsupported, a FIFO, a loop) leaves
    # nothing behind, so fixing it and running the same command starts cleanly.
    if named:
        units, named = named.planned(config, skipped_files)
    else:
        units = readers.plan_units(
            files, config.unit_bytes, text_split=config.text_split, skipped_files=skipped_files
        )
    staged = _start_work(out, work, record, expected)
    executor = pool if pool is not None else make_executor(job)
    unit_counters = [(u, unit_paths(work / "units", u.index)["json"]) for u in units]
    try:
        try:
            changed.refuse_changed(unit_counters, executor, stage="resume")  # finished units' inputs
        except changed.InputChanged:
            if not overwrite:
                raise
            owned.remove_work(out, record)  # --overwrite: build from the inputs as they are now
            staged = _start_work(out, work, record, expected)
        counters = _tokenize_stage(units, info, config, work / "units", executor, progress,
                                   named.unit_configs if named else None)
        try:
            _check_accepted(counters, config, work, units)
        except BuildRejected:
            if not work.exists():  # nothing accepted: nothing kept, not even the record
                owned.remove_work(out, record)
            raise
        plan = _plan_stage(len(units), config, work, executor, named.source_starts[:-1] if named else (0,), progress)
        masked = any("trained_tokens" in c for c in counters)  # some unit holds records (packer/encode/records.py)
        entries = _write_stage(plan, info, config, work, staged, executor, progress,
                               named.unit_sources if named else None, loss_mask=masked)
        changed.refuse_changed(unit_counters, executor, stage="finalize")  # edited during the build?
    finally:
        executor.close()
        for d in (work / "units", work / "shards", staged):  # left by a worker stopped mid-write
            if d.exists():
                atomic.remove_leftovers(d)
    run = _Run(job=job, files=files, info=info, work=work, staged=staged, named=named, units=units,
               skipped_files=skipped_files or [], counters=counters, plan=plan, entries=entries)
    manifest = _finalize(run)
    manifest["build_seconds"] = round(time.time() - started, 3)
    atomic.write_json(staged / MANIFEST, manifest)  # last: the new dataset is complete
    return manifest
