"""Lengths of a raw corpus, counted as `packer build` would store them (the input of `packer stats INPUT...`)."""

from __future__ import annotations

import numpy as np


def _texts(files, text_field: str, unit_bytes: int):
    from packer.build import readers

    for unit in readers.plan_units(files, unit_bytes):
        yield from readers.read_jsonl_unit(unit, text_field, readers.SkipLog.empty())


def corpus_lengths(inputs, tokenizer: str, *, text_field: str = "text", eos: bool = True,
                   sample: int | None = None, seed: int = 0, unit_bytes: int = 64 * 2**20):
    """Tokens per document of raw inputs, counted as `packer build` counts them (end-of-text
    token included when `eos`): of every document, or of a seeded uniform sample of `sample`
    documents (reservoir sampling; only the sample is tokenized). Returns (lengths, sample info
    or None when every document was measured)."""
    import random

    from packer.build import readers
    from packer.build.tokenize import ENCODE_BATCH_DOCS, load_tokenizer, tokenizer_info
    from packer.config import BuildConfig

    if sample is not None and sample < 1:
        raise ValueError(f"--sample must be >= 1 documents, got {sample}")
    files = readers.expand_inputs(inputs)
    info = tokenizer_info(tokenizer, BuildConfig(eos=eos, text_field=text_field))
    tok = load_tokenizer(tokenizer)
    extra = (info.eos_id is not None) + (info.bos_id is not None)
    texts, n_seen = _texts(files, text_field, unit_bytes), 0
    if sample is not None:
        rng, reservoir = random.Random(seed), []
        for n_seen, text in enumerate(texts, 1):
            if len(reservoir) < sample:
                reservoir.append(text)
            elif (j := rng.randrange(n_seen)) < sample:
                reservoir[j] = text
        texts = iter(reservoir)
    parts, batch = [], []
    for text in texts:
        batch.append(text)
        if len(batch) == ENCODE_BATCH_DOCS:
            parts.append([len(e.ids) + extra for e in tok.encode_batch_fast(batch, add_special_tokens=False)])
            batch = []
    if batch:
        parts.append([len(e.ids) + extra for e in tok.encode_batch_fast(batch, add_special_tokens=False)])
    lengths = np.array([x for p in parts for x in p], dtype=np.int64)
    sampled = sample is not None and n_seen > sample
    return lengths, ({"documents": len(lengths), "of_documents": n_seen, "seed": seed} if sampled else None)
