"""A small built dataset with a loss mask, for loader and CLI tests until the build side makes them itself.

It builds a slice of the sample corpus (keeping `_work/`), gives every unit a mask in which each
document's first `PROMPT_SHARE` of tokens is untrained (a prompt) and the rest trained (a completion),
and writes the shards again through the writer with `loss_mask=True`, as a fine-tuning build would
(the same route as tests/store/test_extras.py). The stored masks are then read back with
`ds.mask_views`, which tests/store/test_extras.py checks against the unit files.
"""

from __future__ import annotations

import json

import numpy as np
from conftest import SAMPLE, TOKENIZER

PROMPT_SHARE = 0.4


def prompt_mask(lengths) -> np.ndarray:
    """uint8 [sum(lengths)]: per document of n tokens, int(0.4 n) zeros then ones. [5, 3] -> 0 0 1 1 1 0 1 1."""
    return np.concatenate([(np.arange(n) >= int(PROMPT_SHARE * n)).astype(np.uint8) for n in lengths])


def build_masked(out, *, fmt="arrow", context_length=128, n_docs=60):
    """Build `n_docs` sample documents at `context_length` into `out` with prompt masks; returns `out`."""
    from packer.config import BuildConfig, Job
    from packer.preprocess.pipeline import build

    with open(SAMPLE / "prose.jsonl", encoding="utf-8") as f:
        lines = [next(f) for _ in range(n_docs)]
    source = out.parent / f"{out.name}-input.jsonl"
    source.write_text("".join(lines), encoding="utf-8")
    job = Job(inputs=(str(source),), tokenizer=TOKENIZER, output=str(out), workers=1,
              config=BuildConfig(context_length=context_length, format=fmt))
    build(job, keep_work=True, progress="off")
    return add_prompt_masks(out)


def add_prompt_masks(out):
    """Give a dataset built with keep_work=True prompt masks: unit mask files, then every shard written
    again with loss_mask=True and the manifest's entries replaced. Returns `out`."""
    from packer.preprocess.plan_groups import INDEX, PLAN_DIR, PlanIndex
    from packer.preprocess.writer import write_shard

    units, work = out / "_work" / "units", out / "_work"
    for lengths_file in sorted(units.glob("unit-*.lengths.npy")):
        np.save(units / lengths_file.name.replace(".lengths.npy", ".loss_mask.npy"), prompt_mask(np.load(lengths_file)))
    manifest = json.loads((out / "manifest.json").read_text())
    fmt = manifest["config"]["format"]
    for p in [*(work / "shards").glob("*.json"), *out.glob("shard-*")]:
        p.unlink()
    index = PlanIndex.load(work / INDEX)
    manifest["shards"] = [write_shard(index.shard_path(work / PLAN_DIR, k), k, work, out,
                                      manifest["config"]["token_dtype"], fmt, loss_mask=True)
                          for k in range(len(manifest["shards"]))]
    from packer.store import formats

    for name, data in formats.derived_files(fmt, manifest["shards"]).items():  # arrow's name the shards' sha256
        (out / name).write_bytes(data)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out
