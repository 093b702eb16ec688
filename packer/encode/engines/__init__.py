"""The encode engines, by name, and the rule that picks one for a tokenizer.

Each engine module has `missing()` (why it cannot run here, or None), `refusal(path)` (why it
cannot encode that tokenizer.json exactly, or None) and an `Encoder(path, tok)` whose
`encode_ids(texts, dtype)` gives (flat ids, int64 lengths) with no specials added.

    hf         HuggingFace `tokenizers`, the reference: every tokenizer
    fastokens  byte-level BPE (GPT-2, Llama 3, Qwen 2 style): tokenizers' own algorithm in a faster
               implementation (packer/encode/engines/fastokens_bpe.py)
    tiktoken   the same tokenizers replayed by tiktoken, merging by rank; the rule and its proof:
               packer/encode/engines/byte_level.py

`--encode-engine auto` (the default) takes the first of FAST that can run and does not refuse
the file, else hf; a named engine is used as asked, or the build stops saying why it cannot be.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from packer.encode.engines import fastokens_bpe, hf, tiktoken_bpe

ENGINES = {"hf": hf, "fastokens": fastokens_bpe, "tiktoken": tiktoken_bpe}
# what auto tries, in order: only engines whose equality with tokenizers is proven for the files the
# structure test accepts (tiktoken: byte_level.py's proof). fastokens measured 30-55x tokenizers' speed
# with ids equal on 55 M characters (tiktoken 3-6x; 2026-12-03, benchmarks/bench_engines.py), but it
# re-implements tokenizers' merge loop: equal by tests, not by proof, so it runs only when asked for.
FAST = ("tiktoken",)
CHOICES = ("auto", *ENGINES)


@dataclass(frozen=True)
class Choice:
    """The engine a build runs and why ("auto: ..." or "asked for"), for the summary and manifest."""

    name: str
    reason: str


@functools.lru_cache(maxsize=8)
def choose_engine(path: str, choice: str = "auto") -> Choice:
    """The engine for the tokenizer.json at `path` (already resolved) under `choice` (auto|hf|NAME),
    once per process for a path (as load_tokenizer loads it once)."""
    if choice not in CHOICES:
        raise ValueError(f"--encode-engine {choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "hf":
        return Choice("hf", "asked for")
    if choice != "auto":
        engine = ENGINES[choice]
        why = engine.missing() or engine.refusal(path)
        if why:
            raise ValueError(f"--encode-engine {choice} cannot encode {path} exactly: {why}; "
                             "use --encode-engine auto (it falls back to hf) or hf")
        return Choice(choice, "asked for")
    reasons = []
    for name in FAST:
        why = ENGINES[name].missing() or ENGINES[name].refusal(path)
        if why is None:
            return Choice(name, "auto: a byte-level BPE it encodes exactly")
        reasons.append(f"{name}: {why}")
    return Choice("hf", "auto: " + "; ".join(reasons))


def make_encoder(path: str, name: str, tok):
    """Engine `name`'s encoder for the tokenizer at `path` (`tok`: it, loaded and configured).
    `name` comes from choose_engine, which checked the merges: not redone here."""
    if name == "hf":
        return hf.Encoder(path, tok)
    return ENGINES[name].Encoder(path, tok, check_reach=False)
