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

Every process that builds a fast engine's encoder (make_encoder) first encodes PROBE (and the
tokenizer's first merged tokens) with it and with `tokenizers`: equal ids, or the kept verdict is
dropped and the file checked again; still unequal, ProbeError, on which a build's driver
(packer/encode/tokenizer.py checked_engine) runs hf under auto and stops the build for a named
engine. So equality is checked on every build, not only when a verdict was first kept, and the
manifest's encode_engine "check" names the checks the engine passed (CHECKS).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from packer.encode.engines import byte_level, fastokens_bpe, hf, tiktoken_bpe

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


def offer_bytes(path: str, choice: str, data: bytes):
    """Hand the tokenizer.json's bytes, read once by the caller (packer/encode/tokenizer.py), to the rule:
    where choose_engine(path, choice) would make a fast engine's ranks from the file (an engine it
    asks that can run here), they are made from `data` now, and choose_engine finds them made."""
    names = FAST if choice == "auto" else (choice,) if choice in ENGINES and choice != "hf" else ()
    if any(ENGINES[name].missing() is None for name in names):
        byte_level.ranked_vocab_at(path, data=data)


# What the manifest's tokenizer.encode_engine.check says each engine passed on the build that wrote it.
CHECKS = {"hf": "reference (tokenizers itself)",
          "tiktoken": "byte-level rule (docs/engines.md) and the probe, equal to tokenizers on this build",
          "fastokens": "byte-level rule (docs/engines.md) and the probe, equal to tokenizers on this build"}

# Texts every fast encoder must encode as tokenizers does before it is used (with the tokenizer's first
# PROBE_TOKENS merged tokens, written out): contractions, digits, runs of whitespace and newlines, code,
# composed and decomposed accents (NFC), scripts without spaces, emoji sequences, a special token's text.
PROBE = [
    "Hello, world! It's 2026; they'd've said 'no' -- isn't THAT odd?  Yes:\n\n\tindented\r\n  ",
    "1234567890 3.14159 -42 0x1F 1,000,000 2026-12-05T20:34:08Z 1e-9",
    "def f(x):\n    return {'a': [x ** 2, x // 3]}  # comment\n\n\nclass A: pass\n",
    "caf\u00e9 cafe\u0301 na\u00efve \u00c5ngstr\u00f6m A\u030angstro\u0308m \ufb01ne \u2126 \u212b",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002\u4e2d\u6587\uff0c\ud55c\uad6d\uc5b4 "
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0939\u093f\u0928\u094d\u0926\u0940 \u0e44\u0e17\u0e22",
    "\U0001f600\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467 \u2764\ufe0f  \u00a0\u2003x",
    "<|endoftext|><s></s>[CLS]<|im_start|>user\n",
    "", " ", "\n", "a", "   leading and trailing   ",
]
PROBE_TOKENS = byte_level.PROBE_TOKENS


class ProbeError(ValueError):
    """A fast engine's ids differ from tokenizers' on the probe; `why`: what the file checked again says."""

    def __init__(self, name: str, path: str, why: str):
        self.why = f"other ids than tokenizers on the probe: {why}"
        super().__init__(f"the {name} engine gives {self.why} ({path}); use --encode-engine hf")


def probe_difference(encoder, tok, first_tokens: str | None = None) -> str | None:
    """Where `encoder` (a fast engine's) and `tokenizers` (`tok`) give other ids on the probe texts, or None.
    `first_tokens`: the tokenizer's first merged tokens written out (RankedVocab.probe_text), else read from `tok`."""
    texts = [*PROBE, _first_tokens(tok) if first_tokens is None else first_tokens]
    got, got_lengths = encoder.encode_ids(texts, np.int64)
    want, want_lengths = hf.encode_batch(tok, texts, np.int64)
    if np.array_equal(got_lengths, want_lengths) and np.array_equal(got, want):
        return None
    gots, wants = np.split(got, np.cumsum(got_lengths)[:-1]), np.split(want, np.cumsum(want_lengths)[:-1])
    i = next(i for i, (a, b) in enumerate(zip(gots, wants)) if not np.array_equal(a, b))
    return f"probe text {i} ({texts[i][:30]!r}...) gives other ids"


def _first_tokens(tok) -> str:
    """The tokenizer's first PROBE_TOKENS tokens past the bytes (by id), each as the text it spells
    (byte_level.first_tokens), read from the loaded tokenizer."""
    return byte_level.first_tokens(tok.get_vocab(with_added_tokens=False), PROBE_TOKENS)


def _probed(path: str, name: str, tok):
    """Engine `name`'s encoder for `path` and where its ids differ from tokenizers' on the probe (or None);
    the probe's first tokens come from the ranks this process made from the file (no get_vocab)."""
    encoder = ENGINES[name].Encoder(path, tok, check_reach=False)
    return encoder, probe_difference(encoder, tok, byte_level.ranked_vocab_at(path, check_reach=False).probe_text)


def make_encoder(path: str, name: str, tok, data: bytes | None = None):
    """Engine `name`'s encoder for the tokenizer at `path` (`tok`: it, loaded and configured; `data`: the
    file's bytes where the caller read them, else read here). `name` comes from choose_engine, which
    checked the merges: not redone here, unless the probe finds other ids than tokenizers' (then the
    ranks are made again from the file, kept ones dropped)."""
    if name == "hf":
        return hf.Encoder(path, tok)
    if data is not None:  # this process's ranks made from the bytes its tokenizer was loaded from
        byte_level.ranked_vocab_at(path, check_reach=False, data=data)
    encoder, differs = _probed(path, name, tok)
    if differs:  # a verdict of "passed" that is not true, or a bug: the file checked again, the verdict kept again
        byte_level.forget(path)
        refused = ENGINES[name].refusal(path)
        if refused:
            raise ProbeError(name, path, refused)
        encoder, differs = _probed(path, name, tok)
    if differs:
        raise ProbeError(name, path, f"{differs}, with the rule checked again (a packer bug: please report it)")
    return encoder
