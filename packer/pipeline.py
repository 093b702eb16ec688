"""The build, as stages over paths: tokenize -> plan -> write -> finalize.

    OUTPUT/_work/units/unit-XXXXXX.{tokens.npy,lengths.npy,json}   tokenize (one per work unit)
    OUTPUT/_work/plan.npz                                         plan (lengths only)
    OUTPUT/shard-XXXXX.arrow                                      write (one per shard)
    OUTPUT/stats.json, OUTPUT/manifest.json                       finalize (manifest last)

Each stage reads only what the one before wrote, and skips work whose output exists, so
re-running the same build resumes it.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from packer import __version__, atomic, readers, shards
from packer.config import Job
from packer.executors import make_executor
from packer.plan import Plan, plan_bins
from packer.stats import padding_stats
from packer.tokenize import tokenize_unit, tokenizer_info, unit_paths


def _tokenize_stage(units, info, config, units_dir: Path, executor):
    total = sum(max(u.size, 0) for u in units)
    with tqdm(total=total, unit="B", unit_scale=True, desc="tokenize", leave=False) as bar:
        seen = {"docs": 0, "tokens": 0}

        def done(counters):
            seen["docs"] += counters["docs_accepted"]
            seen["tokens"] += counters["tokens"]
            seconds = max(bar.format_dict["elapsed"], 1e-9)
            bar.update(max(counters.get("bytes", 0), 0))
            bar.set_postfix_str(f"{seen['docs'] / seconds:,.0f} docs/s, {seen['tokens'] / seconds:,.0f} tok/s", refresh=False)

        args = [(u, info, config, str(units_dir)) for u in units]
        return executor.map(tokenize_unit, args, on_done=done)


def _plan_stage(n_units: int, config, work: Path) -> Plan:
    path = work / "plan.npz"
    if path.exists():
        return Plan.load(path)
    unit_lengths = [np.load(unit_paths(work / "units", u)["lengths.npy"]) for u in range(n_units)]
    plan = plan_bins(
        unit_lengths,
        context_length=config.context_length,
        algorithm=config.algorithm,
        long_docs=config.long_docs,
        seed=config.seed,
        shard_size=config.shard_size,
    )
    tmp = atomic.tmp_path(path).with_suffix(".npz")
    plan.save(tmp)
    tmp.replace(path)
    return plan


def _write_stage(plan: Plan, info, work: Path, out: Path, executor):
    with tqdm(total=int(plan.piece_len.sum()), unit="tok", unit_scale=True, desc="write", leave=False) as bar:
        args = [
            (str(work / "plan.npz"), k, str(work / "units"), str(out), info.dtype.name)
            for k in range(plan.n_shards)
        ]
        return executor.map(shards.write_shard, args, on_done=lambda e: bar.update(e["tokens"]))


def _totals(unit_counters, plan: Plan, config, skipped_files=()) -> dict:
    skipped: dict[str, int] = {}
    failed = {f["path"]: f["error"] for f in skipped_files}
    for c in unit_counters:
        if c.get("file_error"):
            failed.setdefault(c["path"], c["file_error"])
        for reason, n in c["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + n
    tokens_in = sum(c["tokens"] for c in unit_counters)
    tokens_out = int(plan.piece_len.sum())
    slots = plan.n_sequences * config.context_length
    return {
        "docs_read": sum(c["docs_read"] for c in unit_counters),
        "docs_accepted": sum(c["docs_accepted"] for c in unit_counters),
        "docs_skipped": skipped,
        "skip_examples": [e for c in unit_counters for e in c["skip_examples"]][:20],
        "files_skipped": [{"path": p, "error": e} for p, e in failed.items()],
        "docs_dropped_long": plan.n_dropped_docs,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_truncated": plan.n_truncated_tokens,
        "sequences": plan.n_sequences,
        "pieces": len(plan.piece_len),
        "fill_rate": tokens_out / slots if slots else 1.0,
    }


def build(job: Job, *, keep_work: bool = False, overwrite: bool = False) -> dict:
    """Run (or resume) a build; return the manifest."""
    config = job.config
    out = Path(job.output)
    if (out / shards.MANIFEST).exists():
        if not overwrite:
            manifest = shards.read_manifest(out)
            manifest["already_complete"] = True
            return manifest
        shutil.rmtree(out)
    files = readers.expand_inputs(job.inputs)
    info = tokenizer_info(job.tokenizer, config)
    skipped_files = [] if config.on_file_error == "skip" else None
    units = readers.plan_units(files, config.unit_bytes, text_split=config.text_split, skipped_files=skipped_files)
    work = out / "_work"
    (work / "units").mkdir(parents=True, exist_ok=True)
    started = time.time()
    executor = make_executor(job.n_workers)
    try:
        counters = _tokenize_stage(units, info, config, work / "units", executor)
        plan = _plan_stage(len(units), config, work)
        shard_entries = _write_stage(plan, info, work, out, executor)
    finally:
        executor.close()
        for partial in (work / "units").glob("*.tmp*"):  # left by a worker stopped mid-write
            partial.unlink(missing_ok=True)
    totals = _totals(counters, plan, config, skipped_files or ())
    doc_lengths = np.concatenate(
        [np.load(unit_paths(work / "units", u.index)["lengths.npy"]) for u in units]
    )
    atomic.write_json(out / shards.STATS, padding_stats(doc_lengths, config.context_length, plan.n_sequences))
    manifest = {
        "format_version": shards.FORMAT_VERSION,
        "tool": {"name": "packer", "version": __version__},
        "config": {
            **config.to_dict(),
            "eos_id": info.eos_id,
            "bos_id": info.bos_id,
            "pad_id": info.eos_id if info.eos_id is not None else 0,
            "token_dtype": info.dtype.name,
        },
        "tokenizer": {"path": info.path, "sha256": info.sha256, "vocab_size": info.vocab_size},
        "inputs": readers.input_descriptions(files),
        "shards": shard_entries,
        "totals": totals,
        "created_unix": round(time.time(), 3),
        "build_seconds": round(time.time() - started, 3),
    }
    shutil.copyfile(info.path, out / "tokenizer.json")  # the dataset decodes without its source
    atomic.write_json(out / shards.MANIFEST, manifest)
    if not keep_work:
        shutil.rmtree(work)
    return manifest
