"""The structure test for the fast engines: is a tokenizer.json a byte-level BPE whose ids an
engine that merges by the rank of the merged token (tiktoken) reproduces exactly, and its ranks.
fastokens (tokenizers' own merge rule, reimplemented) is held to the same test.

A fast engine is used for a tokenizer only where `ranked_vocab` finds, in the file itself:

    model          BPE; no dropout, no unk_token, no byte_fallback, no continuing_subword_prefix or
                   end_of_word_suffix; all 256 byte-level characters in the vocabulary
    normalizer     none, or NFC (then applied by the tokenizer's own normalizer: the same text exactly)
    pre_tokenizer  ByteLevel(use_regex=true, add_prefix_space=false): GPT-2's regex, or
                   Sequence[Split(one of SPLIT_REGEXES, Isolated, invert=false), ByteLevel(use_regex=false)]
    added tokens   special only (special-token strings are text in every encode: packer/encode/tokenizer.py)
    decoder        ByteLevel
    merges         the condition below, checked merge by merge

Why the merges can be replayed by rank. `tokenizers` merges a word by the pair (a, b) of lowest
merge index (leftmost on ties); tiktoken merges the adjacent pair whose concatenation has the
lowest rank (leftmost on ties), and returns a word that is itself a token whole. Give each token
c made by merges the rank of the first merge making it (bytes rank below every merge), and ask:

  (B) every token's merges are consecutive in the list (merges that can never fire, a part not
      reachable from the bytes, left out): then "lower rank" and "lower merge index" order pairs
      of different results the same way;
  (S) every such token c, merged alone by `tokenizers` (merges only), gives [c].

Claim: with (B) and (S) both engines give the same ids for every word. Proof sketch, by steps
(both start from the bytes): let (x, y) be the pair tiktoken merges, c = x + y. No part crosses
the span of c, so the merges done inside it are `tokenizers`' own run on c alone (same rule,
same order), and [x, y] is a state of that run; by (S) the run ends in [c], so [x, y] is its
only two-part state, the pair (a, b) whose merge makes c there: a real merge, not just two
tokens that happen to spell c. Every pair `tokenizers` could merge is a tiktoken candidate with
the rank of its result; by (B) the lowest-index one makes the lowest-rank result, which is c,
and every candidate spelling c is that same pair (a, b): both pick the leftmost of them. When
tiktoken has no pair, neither has `tokenizers`. A whole word that is a token: tiktoken returns
it, and so does `tokenizers` (by (S), or at once with ignore_merges). With ignore_merges, a
vocabulary string no merge makes would be returned whole by `tokenizers` only: refused.
tests/encode/test_engines.py holds a tokenizer breaking (S) ((b, c) merged before (a, b)) and
checks it is refused and that tiktoken would indeed differ on it. Trained tokenizers pass both;
so does cl100k_base converted by transformers' TikTokenConverter (233,378 merges for 100,256
tokens, several per token, ignore_merges; 2026-12-03, benchmarks/bench_engines.py --cl100k).

Tokens no merge can make (GPT-2's "<|endoftext|>" in its vocabulary) are left out of the ranks:
`tokenizers` never gives them either (without ignore_merges). Checking (S) encodes each token
once with `tokenizers` (~0.25 s for 50,000 tokens), once per tokenizer per process, and not at all
where rule_verdicts.py kept the verdict for the same file's bytes.

The split regexes are a list, not any regex: tiktoken's regex engine (fancy-regex) and
`tokenizers`' (Oniguruma) agree on these patterns, every code point checked against the
tokenizer's own pre-tokenizer (tests/encode/test_engines.py); each covers every character
(letters, digits, whitespace, the rest), so no text falls between two matches.
"""

from __future__ import annotations

import contextlib
import gc
import json
from dataclasses import dataclass

import numpy as np

from packer.encode.engines import rule_verdicts

GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPLIT_REGEXES = {  # Split patterns the engines reproduce exactly, by their tokenizers
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "gpt2": GPT2_REGEX,
}


# Each split regex as the engine runs it: the same matches, written so tiktoken's regex engine
# (fancy-regex, a backtracking VM for these patterns) tries fewer alternatives at each place: 0.74
# (GPT-2) and 0.88 (Qwen 2) of tiktoken's time, one thread, on 6.4-14 M characters of
# benchmarks/bench_engines.py's corpus (2026-12-04; that benchmark times the build). Why they match alike, in any
# leftmost-first engine (the first alternative that matches at a place wins):
#   1. 's|'t|'re|'ve|'m|'ll|'d  ->  '(?:[stmd]|re|ve|ll): all begin with "'", and what follows it is
#      prefix-free (no rest is the start of another, under case folding too: (?i) gives each letter
#      its own variants, s also long s, none shared), so at a place at most one alternative matches
#      in either form, and it is the same one.
#   2. (GPT-2) " ?\p{L}+" moved before the contractions: its matches begin with a space or a letter,
#      theirs with "'": never both at one place, so their order decides nothing. (Not in Llama 3 /
#      Qwen 2, whose [^\r\n\p{L}\p{N}]?\p{L}+ also matches "'s".)
# tests/encode/test_engines.py runs the engine with these forms against tokenizers on every code point.
FAST_FORMS = {
    GPT2_REGEX: r""" ?\p{L}+|'(?:[stmd]|re|ve|ll)| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    SPLIT_REGEXES["llama3"]: r"""'(?i:[stmd]|re|ve|ll)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    SPLIT_REGEXES["qwen2"]: r"""'(?i:[stmd]|re|ve|ll)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}


@dataclass(frozen=True)
class RankedVocab:
    """What a rank-merging engine needs: bytes -> rank (bytes 0-255, then tokens in merge order),
    the tokenizer's id of each rank, the split regex, and whether NFC runs first; and the text of
    the tokenizer's first merged tokens, which the probe encodes (first_tokens)."""

    ranks: dict
    ids: np.ndarray
    pattern: str
    nfc: bool
    probe_text: str = ""


def read_spec(path: str) -> dict:
    """A tokenizer.json, parsed (local or remote: packer/io/fs.py)."""
    return loads(_read(path))


def _read(path: str) -> bytes:
    from packer.io import fs

    return fs.location(path).read_bytes()


def loads(data: bytes):
    """json.loads, by orjson where it can (a 100,000-token file: 0.21-0.28 s against 0.36, 2026-12-04);
    json reads what orjson refuses (NaN, lone surrogates, deep nesting) as before."""
    import orjson

    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def ranked_vocab_at(path: str, check_reach: bool = True, data: bytes | None = None) -> RankedVocab | str:
    """ranked_vocab of the file at `path`, once per process: a result with (S) checked serves a
    later call that skips it (the driver decides, a worker in the same process reuses it). The
    verdict is also kept on disk by the file's sha256 (rule_verdicts), so a later build of the same
    tokenizer, and each of its workers, does not check (S) again (~0.25 s per 50,000 tokens, a tenth
    of a 50 MB build); the ranks themselves are always made from the file (rule_verdicts says why).
    `data`: the file's bytes, where the caller read them already (packer/encode/tokenizer.py)."""
    found = _RANKED.get(path)
    if found is None or (check_reach and not found[0]):
        if len(_RANKED) >= 4:
            _RANKED.clear()
        data = _read(path) if data is None else data
        kept = rule_verdicts.get(data)  # why refused, "" for passed, or None
        if kept:
            found = (True, kept)
        else:
            with _collector_paused():
                result = ranked_vocab(loads(data), check_reach and kept is None)
            if check_reach and kept is None:
                rule_verdicts.put(data, result if isinstance(result, str) else "")
            found = (check_reach or kept is not None, result)
        _RANKED[path] = found
    return found[1]


_RANKED: dict = {}  # path -> ((S) checked, ranked_vocab's result)


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector off while a tokenizer.json's lists and dicts (100,000 for 50,000 merges,
    none in a cycle) are parsed and ranked: its passes over the growing heap cost a third of the parse
    (32 -> 22 ms, 2026-12-05). Turned back on after, as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def forget(path: str):
    """Drop what this process and the verdict directory hold for the file at `path` (its engine gave
    other ids than `tokenizers` on the probe): the next ranked_vocab_at checks (S) again."""
    _RANKED.pop(path, None)
    rule_verdicts.drop(_read(path))


def byte_chars() -> dict[str, int]:
    """The byte-level alphabet (GPT-2's bytes_to_unicode), character -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def structure_refusal(spec: dict) -> str | None:
    """Why the file's structure (all but the merges) is outside the rule, or None."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"model {model.get('type')}, not BPE"
    for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return f"BPE with {key} {model[key]!r}"
    if model.get("byte_fallback"):
        return "BPE with byte_fallback"
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return f"normalizer {normalizer.get('type')} (only none or NFC)"
    if (spec.get("decoder") or {}).get("type") != "ByteLevel":
        return "no ByteLevel decoder"
    if _pattern(spec.get("pre_tokenizer")) is None:
        return "pre-tokenizer is neither ByteLevel with its regex nor one known Split regex + ByteLevel"
    plain = [t["content"] for t in spec.get("added_tokens") or [] if not t.get("special")]
    if plain:
        return f"{len(plain)} added tokens that are not special (first {plain[0]!r})"
    return None


def _pattern(pre: dict | None) -> str | None:
    if not pre:
        return None
    if pre.get("type") == "ByteLevel":
        return GPT2_REGEX if pre.get("use_regex", True) and not pre.get("add_prefix_space", True) else None
    steps = pre.get("pretokenizers") or []
    if pre.get("type") != "Sequence" or len(steps) != 2:
        return None
    split, level = steps
    regex = (split.get("pattern") or {}).get("Regex")
    if (split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert")
            or regex not in SPLIT_REGEXES.values()):
        return None
    if level.get("type") != "ByteLevel" or level.get("use_regex", True) or level.get("add_prefix_space", True):
        return None
    return regex


def ranked_vocab(spec: dict, check_reach: bool = True) -> RankedVocab | str:
    """The engine's ranks for a tokenizer.json (parsed), or why it is refused (module docstring).
    `check_reach` False skips (S) (a caller that checked this file already)."""
    refused = structure_refusal(spec)
    if refused:
        return refused
    model = spec["model"]
    vocab = model["vocab"]
    alphabet = byte_chars()
    if any(c not in vocab for c in alphabet):
        return "not all 256 byte-level characters are in the vocabulary"
    order, refused = _merge_order(model["merges"], alphabet)
    if refused:
        return refused
    if model.get("ignore_merges"):
        made = set(order)
        whole = [s for s in vocab if len(s) > 1 and s not in made and all(c in alphabet for c in s)]
        if whole:
            return f"ignore_merges with {len(whole)} vocabulary strings no merge makes (first {whole[0]!r})"
    if check_reach and (bad := _unreachable(spec, order)):
        return f"{len(bad)} tokens are not what their own merges give (first {bad[0]!r}): merges out of rank order"
    to_latin1 = str.maketrans({c: chr(b) for c, b in alphabet.items()})  # a token's characters -> its bytes
    tokens = [*sorted(alphabet, key=alphabet.get), *order]
    ranks = {token.translate(to_latin1).encode("latin-1"): rank for rank, token in enumerate(tokens)}
    ids = np.fromiter(map(vocab.__getitem__, tokens), np.int64, len(tokens))
    return RankedVocab(ranks, ids, _pattern(spec["pre_tokenizer"]), spec.get("normalizer") is not None,
                       first_tokens(vocab))


PROBE_TOKENS = 4096  # how many of a tokenizer's first merged tokens the probe encodes (engines/__init__.py)


def first_tokens(vocab: dict, count: int = PROBE_TOKENS) -> str:
    """The first `count` tokens of the model's `vocab` (token -> id) past the first 256 (the bytes),
    by id, each as the text it spells, one after another: words whose merges compete, in the order a
    trained vocabulary made them. A token that is part of a character, or not byte-level, is left out.
    Where ids run 0, 1, 2, ... only the ids below 256 + count are sorted (3 ms for 50,000 tokens,
    against 40 for the tokenizer's get_vocab and a sort of all, 2026-12-05)."""
    want = 256 + count
    low = [(token, i) for token, i in vocab.items() if i < want]
    if len(low) < want:  # ids with gaps: the first `want` by id are not all below it
        low = list(vocab.items())
    low.sort(key=lambda item: item[1])
    to_bytes = str.maketrans({c: chr(b) for c, b in byte_chars().items()})
    pieces = []
    for token, _ in low[256:want]:
        try:
            pieces.append(token.translate(to_bytes).encode("latin-1").decode("utf-8"))
        except (UnicodeEncodeError, UnicodeDecodeError):
            continue  # part of a character, or not a byte-level token
    return "".join(pieces)


def _merge_order(merges: list, alphabet: dict) -> tuple[list[str], str | None]:
    """The tokens merges make, in the order of their first merge (merges a part of which no merge
    makes are left out: they never fire), or a refusal: a pair listed twice, or a token's merges
    not consecutive (B).

    One pass over the merges in order, growing the reachable set as it goes; only where a merge
    comes before the merge making its part (it fires all the same) is the reach closed over those
    late merges and, if one of them fires, the order made again with the closed reach. 50,000 merges: 20-25 ms
    against 65-75 ms for three passes (2026-12-05; tests/encode/test_engines.py holds the three-pass
    version as a reference and compares them on seeded random merge lists)."""
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
    if _listed_twice(pairs):
        return [], "a merge is listed twice"
    reach = set(alphabet)
    order, last, late, refused = [], None, [], None
    for i, (a, b) in enumerate(pairs):
        if a not in reach or b not in reach:
            late.append(i)
            continue
        c = a + b
        if c != last:
            if c in reach:  # made before (c is two characters or more: never a byte's)
                refused = refused or f"the merges making {c!r} are not consecutive (merge {i})"
            reach.add(c)
            order.append(c)
            last = c
    if late and _fires_late(reach, [pairs[i] for i in late]):
        return _order_in(pairs, reach)
    return ([], refused) if refused else (order, None)


def _listed_twice(pairs: list) -> bool:
    """Whether a pair is listed twice. Joined by a space first (2 ms for 50,000 against 13 for tuples):
    byte-level tokens hold no space, so two pairs join alike only when equal; tuples decide otherwise."""
    try:
        if len(set(map(" ".join, pairs))) == len(pairs):
            return False
    except TypeError:  # not strings: the tuples decide
        pass
    return len(set(map(tuple, pairs))) != len(pairs)


def _fires_late(reach: set, late: list) -> bool:
    """Add to `reach` what the `late` pairs make from it, until nothing more; whether one of them fires
    (what it makes may have been made already by a merge after it: it still takes its place in the order)."""
    grew = True
    while grew:
        size = len(reach)
        reach.update(a + b for a, b in late if a in reach and b in reach)
        grew = len(reach) > size
    return any(a in reach and b in reach for a, b in late)


def _order_in(pairs: list, reach: set) -> tuple[list[str], str | None]:
    """_merge_order's order (or refusal) given the closed reach."""
    order, placed, last = [], set(), None
    for i, (a, b) in enumerate(pairs):
        if a not in reach or b not in reach:
            continue
        c = a + b
        if c != last:
            if c in placed:
                return [], f"the merges making {c!r} are not consecutive (merge {i})"
            placed.add(c)
            order.append(c)
            last = c
    return order, None


def _unreachable(spec: dict, order: list[str]) -> list[str]:
    """(S): the tokens `tokenizers` does not give whole when it merges them alone (merges only)."""
    from tokenizers import Tokenizer

    bare = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": {**spec["model"], "ignore_merges": False}}
    import orjson

    try:
        text = orjson.dumps(bare).decode()
    except TypeError:  # a string orjson will not write (a lone surrogate): json writes it escaped
        text = json.dumps(bare)
    tok = Tokenizer.from_str(text)
    vocab = spec["model"]["vocab"]
    encodings = tok.encode_batch_fast(order, add_special_tokens=False)
    return [s for s, e in zip(order, encodings) if len(e.ids) != 1 or e.ids[0] != vocab[s]]
