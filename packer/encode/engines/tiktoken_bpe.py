"""The `tiktoken` engine: a byte-level BPE tokenizer.json replayed by tiktoken with the same ids.

Used only for a tokenizer byte_level.ranked_vocab accepts (the rule and its proof are there).
tiktoken merges by the rank of the merged token; its ranks are the tokens in merge order and a
table maps each rank back to the tokenizer's id. No special tokens are given to it: a
special-token string is text, as in every encode (packer/encode/tokenizer.py). An NFC tokenizer's
texts are normalized by the tokenizer's own normalizer first, only where they are not NFC already
(packer/encode/nfc.py: a check costs about a thirteenth of the normalizer's pass).

Speed (2026-12-03, 2 busy cores, one thread each, 55 M characters of man pages, docs, Python
sources and translations, benchmarks/corpus.py): GPT-2-style 4.9 against `tokenizers`' 0.8
Mchar/s, NFC Qwen-style 6.5 against 1.2, a cl100k vocabulary 3.6 against 1.2; every document's
ids equal.
"""

from __future__ import annotations

import numpy as np

from packer.encode.engines import byte_level
from packer.encode.engines.threads import OwnThreads, engine_threads
from packer.encode.nfc import nfc_text

NAME = "tiktoken"
NEVER_ALLOWED = "<|packer: text, never a token|>"


def missing() -> str | None:
    """Why this engine cannot run here, or None."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return "tiktoken is not installed (pip install tiktoken; it is one of packer's own dependencies)"
    return None


def refusal(path: str) -> str | None:
    """Why this engine cannot encode the tokenizer.json at `path` exactly, or None."""
    found = byte_level.ranked_vocab_at(path)
    return found if isinstance(found, str) else None


class Encoder:
    """encode_ids(texts, dtype) -> (flat ids, int64 lengths), as hf.encode_batch gives them."""

    name = NAME

    def __init__(self, path: str, tok, check_reach: bool = True):
        import tiktoken

        vocab = byte_level.ranked_vocab_at(path, check_reach)
        if isinstance(vocab, str):
            raise ValueError(f"the tiktoken engine cannot encode this tokenizer exactly: {vocab}; use --encode-engine hf")
        self._ids = vocab.ids
        # One special token that is never allowed: encode_to_tiktoken_buffer then reads a text as
        # encode_ordinary does (a disallowed special's text stays text), but hands back a u32 buffer,
        # not a list of ints made under the GIL: 0.79 of the time on one thread (21 Mchar, 2026-12-04).
        # With no special token at all, its special-token search matches the empty string at every place.
        self._pattern = byte_level.FAST_FORMS.get(vocab.pattern, vocab.pattern)  # the same cuts, fewer steps
        self._core = tiktoken.Encoding("packer", pat_str=self._pattern, mergeable_ranks=vocab.ranks,
                                       special_tokens={NEVER_ALLOWED: len(vocab.ranks)})._core_bpe
        self._normalize = tok.normalizer.normalize_str if vocab.nfc else None
        self._pool = None
        self._vocab = vocab
        self._added = None  # (added tokens' texts, a CoreBPE that reads them, rank -> id) once asked for

    def _added_core(self, added: dict[str, int]):
        """A CoreBPE that also reads `added` as tokens, or None where its reading could differ from
        tokenizers': tiktoken takes the first alternative that matches at the leftmost place,
        tokenizers the longest, the same when no added text is a prefix of another; an NFC tokenizer
        normalizes the pieces between them apart (a combining mark after an added token)."""
        import tiktoken

        texts = sorted(added)
        if self._normalize is not None or any(b.startswith(a) for a, b in zip(texts, texts[1:])):
            return None
        if self._added is None or self._added[0] != texts:
            base = len(self._ids)
            core = tiktoken.Encoding("packer-added", pat_str=self._pattern, mergeable_ranks=self._vocab.ranks,
                                     special_tokens={t: base + i for i, t in enumerate(texts)})._core_bpe
            ids = np.concatenate([self._ids, np.array([added[t] for t in texts], self._ids.dtype)])
            self._added = texts, core, ids
        return self._added

    def encode_added(self, texts: list[str], added: dict[str, int], dtype) -> tuple[np.ndarray, np.ndarray] | None:
        """encode_ids with the `added` token texts (text -> id) read as those tokens and the text between
        encoded piece by piece, as the chat tokenizer reads a rendered conversation; one call per text
        (a call per piece cost a sixth more, 2026-12-03). None where _added_core refuses."""
        found = self._added_core(added)
        if found is None:
            return None
        texts_added, core, ids = found
        allowed = set(texts_added)
        return _joined([np.frombuffer(core.encode_to_tiktoken_buffer(text, allowed), np.uint32) for text in texts],
                       ids, dtype)

    def _threads(self) -> int:
        """The engine threads the executor gave this process, never more than its cores (threads.py's rule)."""
        return engine_threads()

    def _encode_one(self, text: str) -> np.ndarray:
        """The ranks of one text, as encode_ordinary gives them (NEVER_ALLOWED is not allowed)."""
        if self._normalize is not None:  # checked, and normalized only where it is not NFC already
            text = nfc_text(text, self._normalize)
        return np.frombuffer(self._core.encode_to_tiktoken_buffer(text, set()), np.uint32)

    def encode_ids(self, texts: list[str], dtype) -> tuple[np.ndarray, np.ndarray]:
        return self.submit_ids(texts, dtype)()

    def submit_ids(self, texts: list[str], dtype):
        """encode_ids started on this engine's threads (tiktoken lets go of the GIL while it encodes):
        a callable that waits for it and gives (flat ids, lengths). One thread: encoded here and now."""
        if min(self._threads(), len(texts)) > 1:
            if self._pool is None:
                self._pool = OwnThreads(self._threads(), "packer-tiktoken")
            futures = [self._pool.submit(self._encode_one, text) for text in texts]
            return lambda: self._gathered(lambda: [f.result() for f in futures], dtype)
        done = self._gathered(lambda: list(map(self._encode_one, texts)), dtype)
        return lambda: done

    def _gathered(self, ranks, dtype) -> tuple[np.ndarray, np.ndarray]:
        """_joined of the ranks `ranks()` gives, a lone surrogate refused as tokenizers refuses it."""
        try:
            return _joined(ranks(), self._ids, dtype)
        except UnicodeEncodeError as e:  # tokenizers refuses a lone surrogate too (a TypeError there)
            raise TypeError(f"a text holds a lone surrogate ({e.reason}), which no tokenizer encodes") from None


def _joined(ranks: list[np.ndarray], ids: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, int64 lengths) of each text's ranks, mapped to the tokenizer's ids."""
    lengths = np.fromiter(map(len, ranks), np.int64, len(ranks))
    flat = np.concatenate(ranks) if ranks else np.zeros(0, np.uint32)
    return ids[flat].astype(dtype, copy=False), lengths
