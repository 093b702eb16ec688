"""Tokenizer loading and the tokenize stage for one work unit: texts in, unit files out.

Unit files, in the work directory (all written atomically; the .json last, so its
presence means the unit is complete and is never redone):

    unit-000007.tokens.npy   all token ids of the unit's accepted documents, concatenated
    unit-000007.lengths.npy  int64 length of each document (eos/bos included)
    unit-000007.json         counters: docs read / accepted / skipped by reason, examples
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer import atomic
from packer.config import BuildConfig
from packer.readers import SkipLog, Unit, read_jsonl_unit

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
ENCODE_BATCH_DOCS = 1024


@dataclass(frozen=True)
class TokenizerInfo:
    """What the manifest records about a tokenizer, and the special ids a build uses."""

    path: str
    sha256: str
    vocab_size: int
    eos_id: int | None
    bos_id: int | None

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.vocab_size <= 2**16 else np.uint32)


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str):
    """Load a tokenizer.json once per process."""
    from tokenizers import Tokenizer

    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"tokenizer not found: {path} (give the path of a local tokenizer.json, "
            "e.g. sample_data/tokenizer.json; nothing is downloaded)"
        )
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a plain Exception on bad JSON
        raise ValueError(f"{path}: not a valid tokenizer.json ({e})") from None


def _special_id(tok, explicit: str | None, candidates, what: str, flag: str) -> int:
    names = (explicit,) if explicit else candidates
    for name in names:
        token_id = tok.token_to_id(name)
        if token_id is not None:
            return token_id
    if explicit:
        raise ValueError(f"the tokenizer has no token {explicit!r} (given by {flag})")
    raise ValueError(
        f"cannot find a {what} token in the tokenizer (tried {', '.join(candidates)}); "
        f"name it with {flag} or turn it off"
    )


def tokenizer_info(path: str, config: BuildConfig) -> TokenizerInfo:
    tok = load_tokenizer(path)
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    eos_id = _special_id(tok, config.eos_token, EOS_CANDIDATES, "end-of-text", "--eos-token") if config.eos else None
    bos_id = _special_id(tok, config.bos_token, BOS_CANDIDATES, "begin-of-text", "--bos-token") if config.bos else None
    return TokenizerInfo(path, digest, tok.get_vocab_size(with_added_tokens=True), eos_id, bos_id)


def unit_paths(work_dir: Path, index: int) -> dict[str, Path]:
    stem = work_dir / f"unit-{index:06d}"
    return {k: Path(f"{stem}.{k}") for k in ("tokens.npy", "lengths.npy", "json")}


def _encode(tok, texts, info: TokenizerInfo):
    encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
    head = [info.bos_id] if info.bos_id is not None else []
    tail = [info.eos_id] if info.eos_id is not None else []
    ids = [head + e.ids + tail for e in encodings]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter((t for x in ids for t in x), dtype=info.dtype, count=int(lengths.sum()))
    return flat, lengths


def tokenize_unit(unit: Unit, info: TokenizerInfo, config: BuildConfig, work_dir: str) -> dict:
    """Tokenize one unit into its unit files (skipped if already complete); return its counters."""
    paths = unit_paths(Path(work_dir), unit.index)
    if paths["json"].exists():
        return json.loads(paths["json"].read_text(encoding="utf-8"))
    tok = load_tokenizer(info.path)
    skips = SkipLog.empty()
    token_parts, length_parts, batch = [], [], []
    n_read = 0

    def flush():
        flat, lengths = _encode(tok, batch, info)
        token_parts.append(flat)
        length_parts.append(lengths)
        batch.clear()

    for text in read_jsonl_unit(unit, config.text_field, skips):
        batch.append(text)
        if len(batch) >= ENCODE_BATCH_DOCS:
            flush()
    if batch:
        flush()
    tokens = np.concatenate(token_parts) if token_parts else np.zeros(0, info.dtype)
    lengths = np.concatenate(length_parts) if length_parts else np.zeros(0, np.int64)
    n_accepted = len(lengths)
    n_read = n_accepted + sum(skips.counts.values())
    atomic.save_npy(paths["tokens.npy"], tokens)
    atomic.save_npy(paths["lengths.npy"], lengths)
    counters = {
        "unit": unit.index,
        "path": unit.path,
        "start": unit.start,
        "end": unit.end,
        "docs_read": n_read,
        "docs_accepted": n_accepted,
        "skipped": dict(sorted(skips.counts.items())),
        "skip_examples": skips.examples,
        "tokens": int(lengths.sum()),
    }
    atomic.write_json(paths["json"], counters)
    return counters
