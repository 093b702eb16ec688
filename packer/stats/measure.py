"""`packer stats INPUT...`: the figures of one built dataset, or of a raw corpus tokenized as a build would."""

from __future__ import annotations

from packer.io import fs
from packer.store.manifest import MANIFEST


def is_dataset(inputs) -> bool:
    """One input holding a manifest.json: a built dataset (else a raw corpus)."""
    return len(inputs) == 1 and (fs.location(inputs[0]) / MANIFEST).is_file()


def measure(inputs, *, tokenizer=None, config=None, batch_size: int = 8, sample: int | None = None,
            online: bool = False, buffer_docs: int = 10_000) -> dict:
    """Figures (schema: packer/stats/stats_schema.json) of a dataset directory or URI, or of raw
    inputs (then `tokenizer` and a `config` with the context length are required)."""
    from packer.stats import figures

    if is_dataset(inputs):
        if tokenizer or config is not None or sample or online:
            raise ValueError(f"{fs.redact(inputs[0])} is a built dataset: its tokenizer and context length come from "
                             "its manifest; drop --tokenizer/--context-length/--sample/--online")
        from packer.store.dataset import open_dataset

        return figures.dataset_stats(open_dataset(inputs[0]), batch_size=batch_size)
    if not tokenizer or config is None:
        raise ValueError("a raw corpus needs --tokenizer PATH and --context-length N (or give one built dataset directory)")
    from packer.stats.corpus import corpus_lengths, record_lengths

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
        from packer.train.online import online_fill_rate

        out["online"] = online_fill_rate(lengths, config.context_length, buffer_docs, config.algorithm,
                                         long_docs=config.long_docs)
    return out
