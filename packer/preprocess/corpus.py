"""`packer stats INPUT...`: the figures of one built dataset, or of a raw corpus whose lengths are counted
exactly as `packer build` stores them.

Same inputs, readers, skip rules and encode path as the build (packer/preprocess/readers, encode_stream in
packer/encode/text.py): every input format, `text_split`, `max_doc_bytes`, `strict`, and a unit
whose file fails under on_file_error="skip" counts none of its documents, as the build keeps none.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random

import numpy as np

from packer.config import BuildConfig
from packer.encode.records import RECORD_BATCH, RecordEncoder
from packer.encode.text import encode_stream, encode_texts
from packer.encode.tokenizer import load_encoder, tokenizer_info
from packer.io import fs
from packer.online_pack import online_fill_rate
from packer.preprocess import readers
from packer.preprocess.inputs import expand_inputs
from packer.preprocess.tokenize import unit_kind
from packer.stats import figures
from packer.store.dataset import open_dataset
from packer.store.manifest import MANIFEST


def corpus_lengths(inputs, tokenizer: str, config: BuildConfig, *, sample: int | None = None, seed: int = 0):
    """Tokens per document of raw inputs, as `packer build INPUT... --tokenizer T` with `config`
    stores them (eos/bos included per config): of every document in input order, or of a seeded
    uniform sample of `sample` documents (only the sample is tokenized), in input order.
    Returns (lengths int64, sample info {"documents", "of_documents", "seed"}, or None when every
    document was measured)."""
    if sample is not None and sample < 1:
        raise ValueError(f"--sample must be >= 1 documents, got {sample}")
    if config.input_kind != "text":
        if sample is not None:
            raise ValueError(f"--sample measures text documents; drop it for --input-kind {config.input_kind} "
                             "(every record is encoded)")
        return record_lengths(inputs, tokenizer, config)[0], None
    files = expand_inputs(inputs)
    info = tokenizer_info(tokenizer, config)
    tok = load_encoder(info.path, info.engine)
    skipped_files = [] if config.on_file_error == "skip" else None
    units = readers.plan_units(files, config.unit_bytes, text_split=config.text_split, skipped_files=skipped_files)

    def lengths_of(texts) -> list[np.ndarray]:
        return [n for _, n in encode_stream(tok, texts, dtype=info.dtype, eos_id=info.eos_id, bos_id=info.bos_id)]

    if sample is None:
        parts = [part for unit in units for part in _read_unit(unit, config, lengths_of) or ()]
        return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), None
    picked, n_docs = _sample_texts(units, config, sample, seed)
    parts = lengths_of(picked)
    lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return lengths, ({"documents": len(lengths), "of_documents": n_docs, "seed": seed} if n_docs > sample else None)


def _read_unit(unit, config: BuildConfig, consume):
    """consume(the unit's texts), or None when the unit's file fails and config says skip it."""
    skips = readers.SkipLog.empty(strict=config.strict)
    texts = readers.read_unit(unit, skips, text_field=config.text_field, text_split=config.text_split,
                              max_doc_bytes=config.max_doc_bytes)
    try:
        return consume(texts)
    except readers.FileError:
        if config.on_file_error != "skip":
            raise
        return None


def _sample_texts(units, config: BuildConfig, sample: int, seed: int) -> tuple[list[str], int]:
    """(texts of a seeded uniform sample of `sample` accepted documents, in input order; the number
    of accepted documents). Bottom-k sampling: each document draws a random key, the `sample`
    smallest keys win. A unit's candidates join the winners only once the whole unit was read, so a
    unit dropped by on_file_error="skip" leaves no trace and the sample stays uniform."""
    rng = random.Random(seed)
    winners: list = []  # a max-heap on the key: (-key, document number, text)
    n_docs = 0
    for unit in units:
        def candidates(texts, first=n_docs):
            heap, n_read = [], 0
            for n_read, text in enumerate(texts, 1):
                _offer(heap, (-rng.random(), first + n_read - 1, text), sample)
            return heap, n_read

        result = _read_unit(unit, config, candidates)
        if result is not None:
            heap, n_read = result
            for entry in heap:
                _offer(winners, entry, sample)
            n_docs += n_read
    return [text for _, _, text in sorted(winners, key=lambda entry: entry[1])], n_docs


def _offer(heap: list, entry: tuple, size: int):
    if len(heap) < size:
        heapq.heappush(heap, entry)
    elif entry[0] > heap[0][0]:  # a smaller key than the largest kept
        heapq.heapreplace(heap, entry)


def record_lengths(inputs, tokenizer: str, config: BuildConfig):
    """Fine-tuning records (config.input_kind other than text) measured as `packer build` stores them:
    (tokens per example int64, trained tokens in all, trained tokens inside each example's first
    context_length tokens, summed: what truncating keeps). Reads, skips and encodes exactly as the
    build's tokenize stage (packer/encode/records.py); a text file under input_kind auto counts
    every token as trained. No sampling: every record is encoded."""
    info = tokenizer_info(tokenizer, config)
    skipped_files = [] if config.on_file_error == "skip" else None
    units = readers.plan_units(expand_inputs(inputs), config.unit_bytes, text_split=config.text_split,
                               skipped_files=skipped_files)
    lengths, trained, truncated = [], 0, 0
    L = config.context_length
    for unit in units:
        kind = unit_kind(unit, config)
        if kind == "text":
            text_config = dataclasses.replace(config, input_kind="text")  # the whole file, read once, by its first unit
            n = corpus_lengths([unit.path], tokenizer, text_config)[0] if unit.start == 0 else np.zeros(0, np.int64)
            lengths.append(n)
            trained += int(n.sum())
            truncated += int(np.minimum(n, L).sum())
            continue
        encoder = RecordEncoder(kind, info, config, encode_texts)
        skips = readers.SkipLog.empty(strict=config.strict)
        records = readers.read_records(unit, skips, encoder.fields(), max_doc_bytes=config.max_doc_bytes)
        try:
            for batch in iter(lambda: list(itertools.islice(records, RECORD_BATCH)), []):
                enc = encoder.encode(batch, skips)
                starts = np.cumsum(enc.lengths) - enc.lengths
                cum = np.concatenate([[0], np.cumsum(enc.mask, dtype=np.int64)])
                lengths.append(enc.lengths)
                trained += int(cum[-1])
                truncated += int((cum[starts + np.minimum(enc.lengths, L)] - cum[starts]).sum())
        except readers.FileError:
            if config.on_file_error != "skip":
                raise
    return (np.concatenate(lengths) if lengths else np.zeros(0, np.int64)), trained, truncated


def is_dataset(inputs) -> bool:
    """One input holding a manifest.json: a built dataset (else a raw corpus)."""
    return len(inputs) == 1 and (fs.location(inputs[0]) / MANIFEST).is_file()


def measure(inputs, *, tokenizer=None, config=None, batch_size: int = 8, sample: int | None = None,
            online: bool = False, buffer_docs: int = 10_000, cost=None) -> dict:
    """Figures (schema: packer/stats/stats_schema.json) of a dataset directory or URI, or of raw
    inputs (then `tokenizer` and a `config` with the context length are required). `cost`: a dataset's
    step-balance cost model (packer.balance.CostModel; None: the default)."""
    if is_dataset(inputs):
        if tokenizer or config is not None or sample or online:
            raise ValueError(f"{fs.redact(inputs[0])} is a built dataset: its tokenizer and context length come from "
                             "its manifest; drop --tokenizer/--context-length/--sample/--online")
        return figures.dataset_stats(open_dataset(inputs[0]), batch_size=batch_size, cost=cost)
    if cost is not None:
        raise ValueError("--cost/--model-* set the step-balance table of a built dataset; a raw corpus has none "
                         "(build it, then packer stats DIR --cost ...): drop them")
    if not tokenizer or config is None:
        raise ValueError("a raw corpus needs --tokenizer PATH and --context-length N (or give one built dataset directory)")
    trained = None
    if config.input_kind != "text" and sample is None:  # fine-tuning records: lengths and trained tokens at once
        lengths, *trained = record_lengths(inputs, tokenizer, config)
        sampled = None
    else:
        lengths, sampled = corpus_lengths(inputs, tokenizer, config, sample=sample, seed=config.seed)
    out = figures.corpus_stats(lengths, config.context_length, batch_size=batch_size, seed=config.seed,
                               algorithm=config.algorithm, sample=sampled, inputs=inputs)
    if trained is not None:
        figures.add_trained(out, *trained)
    if online:
        out["online"] = online_fill_rate(lengths, config.context_length, buffer_docs, config.algorithm,
                                         long_docs=config.long_docs)
    return out
