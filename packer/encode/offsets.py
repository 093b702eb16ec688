"""Token offsets -> loss masks (which tokens lie inside a record's trained character spans) and role ids
(the turn each token starts in), and token offsets computed from the ids alone for byte-level BPE
(ByteOffsets), for the record kinds."""

from __future__ import annotations

import itertools

import numpy as np

from packer.encode.engines.byte_level import byte_chars


def batch_masks(encodings, text_lengths: list[int], spans: list[list[tuple[int, int]]]):
    """A batch of encoded texts and each one's trained character spans -> (flat ids int64, lengths,
    flat mask uint8, bad: bool per text whose span boundary falls inside a token), in one
    vectorized pass: each text's offsets are shifted by the lengths (+1) of the texts before it, so
    the whole batch is one sorted run of tokens and spans_to_mask's rule applies to all at once."""
    n_texts = len(encodings)
    lengths = np.fromiter(map(len, encodings), np.int64, n_texts)
    total = int(lengths.sum())
    ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), np.int64, total)
    offsets = [e.offsets for e in encodings]
    bases = _bases(text_lengths)
    bounds = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(offsets)), np.int64, 2 * total)
    shift = np.repeat(bases, lengths)
    starts, ends = bounds[0::2] + shift, bounds[1::2] + shift
    if not (np.all(starts[1:] >= starts[:-1]) and np.all(ends[1:] >= ends[:-1])):  # offsets out of order: one by one
        masks = [spans_to_mask(o, s) for o, s in zip(offsets, spans)]
        bad = np.array([m is None for m in masks], bool)
        mask = np.concatenate([m if m is not None else np.zeros(n, np.uint8) for m, n in zip(masks, lengths)]
                              or [np.zeros(0, np.uint8)])
        return ids, lengths, mask, bad
    return (ids, lengths, *_sorted_masks(starts, ends, bases, spans))


def token_roles(encodings, text_lengths: list[int], turns, table: dict[str, int]) -> np.ndarray:
    """uint8, one per token of the batch: the role id of the turn each token starts in. `turns`:
    per text, ((where each turn starts, where the last ends), each turn's role); before the first
    turn and after the last the id is table["template"]; a role the table does not name gets
    table["other"].

        text "<s>Hi</s><s>Yo</s>[END]", turns ([0, 9], 18), roles [user, assistant]
        tokens <s> Hi </s> | <s> Yo </s> | [END]  ->  user user user | assistant ... | template
    """
    n_texts = len(encodings)
    lengths = np.fromiter(map(len, encodings), np.int64, n_texts)
    bases = _bases(text_lengths)
    starts = np.fromiter((a for e in encodings for a, _ in e.offsets), np.int64, int(lengths.sum()))
    starts += np.repeat(bases, lengths)
    template, other = table["template"], table["other"]
    edges, ids = [], []  # per text: its base (template), each turn's start, its end (template)
    for base, ((turn_starts, end), turn_roles) in zip(bases.tolist(), turns):
        edges += [base, *(base + s for s in turn_starts), base + end]
        ids += [template, *(table.get(r, other) for r in turn_roles), template]
    at = np.searchsorted(np.asarray(edges, np.int64), starts, side="right") - 1  # equal edges: the later one
    return np.asarray(ids, np.uint8)[at]


def _bases(text_lengths) -> np.ndarray:
    """Where each text starts when the batch's texts are laid end to end, one character apart."""
    step = np.asarray(text_lengths, np.int64) + 1
    return np.cumsum(step) - step


def _sorted_masks(starts: np.ndarray, ends: np.ndarray, bases: np.ndarray, spans) -> tuple[np.ndarray, np.ndarray]:
    """The batch's token offsets (shifted by `bases`, in order) + each text's spans -> (mask, bad)."""
    return _edge_masks(starts, ends, *_span_edges(bases, spans))


def _span_edges(bases: np.ndarray, spans) -> tuple[np.ndarray, np.ndarray]:
    """Each text's spans, shifted by its base, as one flat array of edges [a0, b0, a1, b1, ...] (int64),
    and the number of spans of each text."""
    n_spans = np.fromiter(map(len, spans), np.int64, len(bases))
    edges = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(spans)), np.int64,
                        2 * int(n_spans.sum()))
    return edges + np.repeat(bases, 2 * n_spans), n_spans


def _edge_masks(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray, n_spans: np.ndarray):
    """Sorted token offsets + the spans' edges in the same coordinates -> (mask, bad per text)."""
    n_texts, total = len(n_spans), len(starts)
    inside = np.searchsorted(ends, edges, side="right")  # the first token ending after each edge
    hit = (inside < total) & (starts[np.minimum(inside, max(total - 1, 0))] < edges) if total else np.zeros(len(edges), bool)
    bad = np.zeros(n_texts, bool)
    bad[np.repeat(np.arange(n_texts), 2 * n_spans)[hit]] = True
    change = np.zeros(total + 1, np.int64)
    np.add.at(change, np.searchsorted(starts, edges[0::2], side="left"), 1)
    np.add.at(change, np.searchsorted(ends, edges[1::2], side="right"), -1)
    mask = (np.cumsum(change[:-1]) > 0).astype(np.uint8)
    mask[ends <= starts] = 0  # a zero-width token lies inside no span
    return mask, bad


def spans_to_mask(offsets, spans: list[tuple[int, int]]) -> np.ndarray | None:
    """Token character offsets + trained character spans -> a 0/1 mask per token; None when a span
    boundary falls strictly inside a token.

        offsets [(0, 3), (3, 5), (5, 9)]  spans [(3, 9)]  ->  [0, 1, 1]
        offsets [(0, 3), (3, 5), (5, 9)]  spans [(4, 9)]  ->  None   (4 is inside token (3, 5))
    """
    n = len(offsets)
    mask = np.zeros(n, np.uint8)
    if not n:
        return mask
    bounds = np.fromiter(itertools.chain.from_iterable(offsets), np.int64, 2 * n)
    starts, ends = bounds[0::2], bounds[1::2]
    edges = np.asarray(spans, dtype=np.int64).reshape(-1)
    if np.all(starts[1:] >= starts[:-1]) and np.all(ends[1:] >= ends[:-1]):  # in order, as BPE gives them
        inside = np.searchsorted(ends, edges, side="right")  # the first token ending after each edge
        at = np.minimum(inside, n - 1)
        if np.any((inside < n) & (starts[at] < edges)):
            return None
        first, last = np.searchsorted(starts, edges[0::2], side="left"), np.searchsorted(ends, edges[1::2], side="right")
        change = np.zeros(n + 1, np.int64)
        np.add.at(change, first, 1)
        np.add.at(change, last, -1)
        mask[np.cumsum(change[:-1]) > 0] = 1
        mask[ends <= starts] = 0  # a zero-width token lies inside no span
        return mask
    for a, b in spans:
        if np.any((starts < a) & (ends > a)) or np.any((starts < b) & (ends > b)):
            return None
        mask[(starts >= a) & (ends <= b) & (ends > starts)] = 1
    return mask


# char.is_whitespace() in Rust (Unicode White_Space), which tokenizers' ByteLevel offset trimming reads
_RUST_WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                             "\u200a\u2028\u2029\u202f\u205f\u3000")
_SPLITTING = {"ByteLevel", "Split", "Digits", "Punctuation"}  # pre-tokenizers that only cut the text into pieces


class ByteOffsets:
    """Token offsets from the ids alone, for byte-level BPE tokenizers (GPT-2, Llama 3, the sample's):
    each id stands for fixed bytes, so a text's tokens lay its bytes end to end and the offsets are
    running sums of byte lengths, trimmed as the tokenizer does (its ByteLevel post-processor moves a
    token's start past its leading spaces, its end before its trailing ones). encode_batch_fast + this
    gives what encode_batch's offsets give, without the per-text byte->char table the tokenizer
    builds (70% of a chat build's encode time).

        text  "a  héllo"       bytes  a ␠ ␠ h é(2) l l o      ids  [a] [Ġ] [Ġh] [é] [llo]
        bytes (0,1) (1,2) (2,4) (4,6) (6,9)  ->  chars (0,1) (1,2) (2,4) (4,5) (5,8)  ->  trimmed (0,1) (2,2) (3,4) ...

    `offsets` gives them in characters, as encode_batch; `batch_masks` stays in bytes, the spans'
    few edges moved to bytes instead of every token to characters (the same mask: an edge lies on a
    character boundary, so a token starts at or after it, ends at or before it, or straddles it, the
    same in both units). `of` is None for a tokenizer outside that model (a normalizer, another
    model or pre-tokenizer, added tokens that strip their neighbours' spaces); `batch_masks` is
    None for a batch a text of which its ids do not lay out exactly (checked by byte count): the
    caller then asks the tokenizer for offsets. tests/encode/test_chat.py holds both ways equal on
    hostile texts."""

    def __init__(self, byte_len: np.ndarray, lead: np.ndarray, trail: np.ndarray, one_lead: np.ndarray, trim: bool,
                 prefix_space: bool):
        """Per id: its bytes, the bytes of its leading and trailing spaces (what trimming skips), and
        whether its leading spaces are one character (add_prefix_space keeps that one)."""
        self.byte_len, self.lead, self.trail, self.one_lead = byte_len, lead, trail, one_lead
        self.trim, self.prefix_space = trim, prefix_space

    @classmethod
    def of(cls, tok) -> ByteOffsets | None:
        import json

        spec = json.loads(tok.to_str())
        model, pre, post = spec.get("model") or {}, spec.get("pre_tokenizer"), spec.get("post_processor")
        pres = (pre or {}).get("pretokenizers", [pre]) if (pre or {}).get("type") == "Sequence" else [pre]
        posts = (post or {}).get("processors", [post]) if (post or {}).get("type") == "Sequence" else [post]
        added = spec.get("added_tokens") or []
        if (spec.get("normalizer") is not None or model.get("type") != "BPE" or model.get("byte_fallback")
                or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")
                or not all(p and p.get("type") in _SPLITTING and p.get("behavior", "Isolated") != "Removed" for p in pres)
                or not any(p.get("type") == "ByteLevel" for p in pres)
                or not all(p is None or p.get("type") in ("ByteLevel", "TemplateProcessing") for p in posts)
                or any(a.get("lstrip") or a.get("rstrip") for a in added)):
            return None
        level = next((p for p in posts if p is not None and p.get("type") == "ByteLevel"), None)
        trim = bool(level and level.get("trim_offsets", True))
        byte_of = byte_chars()
        strings = {i: s for s, i in model.get("vocab", {}).items()}
        size = 1 + max([*strings, *(a["id"] for a in added), -1])
        byte_len = np.full(size, -1, np.int64)
        for i, s in strings.items():
            if all(c in byte_of for c in s):
                byte_len[i] = len(s)
        texts = {}  # added tokens: their text (a vocabulary string is one character a byte)
        for a in added:
            content = a["content"].encode("utf-8")
            if a["id"] in strings and bytes(byte_of.get(c, 0) for c in strings[a["id"]]) != content:
                return None  # one id, two byte strings: not a layout
            strings[a["id"]] = texts[a["id"]] = a["content"]
            byte_len[a["id"]] = len(content)
        lead, trail, one_lead = np.zeros(size, np.int64), np.zeros(size, np.int64), np.zeros(size, bool)
        if trim:
            spaces = "".join(_RUST_WHITESPACE) + "\u0120"
            for i, s in strings.items():
                stripped = s.lstrip(spaces)
                lead[i], trail[i] = len(s) - len(stripped), len(s) - len(s.rstrip(spaces))
                one_lead[i] = lead[i] == 1
                if i in texts:  # an added token's text: its spaces' bytes, not characters
                    lead[i], trail[i] = (len(s.encode("utf-8")) - len(t.encode("utf-8"))
                                         for t in (stripped, s.rstrip(spaces)))
        return cls(byte_len, lead, trail, one_lead, trim, bool(level and level.get("add_prefix_space", True)))

    def batch_masks(self, encodings, texts: list[str], spans, data: list[bytes] | None = None):
        """As records.batch_masks, in bytes (class docstring); `data`: the texts in UTF-8, when the
        caller has them. None when a text's ids do not lay out its bytes exactly."""
        got = self._layout(encodings, texts, data)
        if got is None:
            return None
        ids, lengths, starts, ends, _, bases, owner = got
        edges, n_spans = _span_edges(bases, spans)  # in characters of the joined texts
        if owner is not None:  # ... and in bytes: + the continuation bytes of the characters before each
            edges += np.searchsorted(owner, edges, side="left")
        return (ids, lengths, *_edge_masks(starts, ends, edges, n_spans))

    def offsets(self, encodings, texts: list[str]):
        """(flat ids, lengths, token starts, ends, text bases): the offsets in characters as
        encode_batch gives them, shifted as in records.batch_masks; None when a text's ids do not
        lay out its bytes."""
        got = self._layout(encodings, texts)
        if got is None:
            return None
        ids, lengths, starts, ends, _, bases, owner = got
        if owner is not None:  # a token's characters: those its first and last bytes belong to
            tail = owner + np.arange(1, len(owner) + 1)
            starts, ends = starts - _count_upto(tail, starts), ends - _count_upto(tail, ends - 1)
        return ids, lengths, starts, ends, bases

    def _layout(self, encodings, texts: list[str], data: list[bytes] | None = None):
        """(flat ids, lengths, token starts, ends, text bases, all in bytes of the texts joined one
        "\\0" apart; the texts' bases in characters; `owner`: the character each continuation byte
        belongs to, None for ASCII), or None when a text's ids do not lay out its bytes. `encodings`:
        tokenizers' Encodings, or (flat ids, lengths) as an encode engine gives them."""
        if isinstance(encodings, tuple):
            ids, lengths = encodings[0].astype(np.int64, copy=False), encodings[1]
            n_texts, total = len(lengths), len(ids)
        else:
            n_texts = len(encodings)
            lengths = np.fromiter(map(len, encodings), np.int64, n_texts)
            total = int(lengths.sum())
            ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), np.int64, total)
        if total and (ids.max() >= len(self.byte_len) or ids.min() < 0):
            return None
        n_bytes = self.byte_len[ids]
        bases = _bases([len(t) for t in texts])  # characters; texts one character ("\\0", one byte) apart
        raw = b"\0".join(data if data is not None else [t.encode("utf-8") for t in texts])
        if len(raw) == sum(map(len, texts)) + max(n_texts - 1, 0):  # all ASCII: bytes are characters
            byte_bases, owner = bases, None
        else:  # the UTF-8 continuation bytes, and the character each belongs to
            tail = np.flatnonzero((np.frombuffer(raw, np.uint8) & 0xC0) == 0x80)
            owner = tail - np.arange(1, len(tail) + 1)
            byte_bases = bases + np.searchsorted(owner, bases, side="left")
        text_bytes = np.append(byte_bases[1:] - 1, len(raw)) - byte_bases
        cum = np.zeros(total + 1, np.int64)
        np.cumsum(n_bytes, out=cum[1:])
        first = np.cumsum(lengths) - lengths
        if np.any(n_bytes < 0) or not np.array_equal(cum[first + lengths] - cum[first], text_bytes):
            return None
        starts = cum[:-1] + np.repeat(byte_bases - cum[first], lengths)
        ends = starts + n_bytes
        if self.trim:
            starts, ends = self._trimmed(ids, starts, ends, np.repeat(byte_bases, lengths), first)
        return ids, lengths, starts, ends, byte_bases, bases, owner

    def piece_offsets(self, ids: np.ndarray, start: int, n_bytes: int, first: bool):
        """(token starts, ends) in bytes of one piece of a text that starts at byte `start` of it (the
        text's first piece: `first`), trimmed as _layout trims them; None when the ids do not lay out
        the piece's n_bytes exactly (packer/encode/chat_long.py: a text encoded a piece at a time)."""
        sizes = self.byte_len[ids]
        if np.any(sizes < 0) or int(sizes.sum()) != n_bytes:
            return None
        starts = start + np.cumsum(sizes) - sizes
        ends = starts + sizes
        if self.trim:
            starts, ends = self._trimmed(ids, starts, ends, np.zeros(len(ids), np.int64),
                                         np.zeros(1 if first else 0, np.int64))
        return starts, ends

    def _trimmed(self, ids, starts, ends, base, first):
        """tokenizers' ByteLevel process_offsets: start past the leading spaces (not the one space of a
        text's first token when add_prefix_space), end before the trailing ones, never crossing."""
        lead, trail = self.lead[ids], self.trail[ids]
        if self.prefix_space:
            is_first = np.zeros(len(ids), bool)
            is_first[first[first < len(ids)]] = True
            lead = np.where((is_first | (starts == base)) & self.one_lead[ids], 0, lead)
        starts = np.where(lead > 0, np.minimum(starts + lead, ends), starts)
        ends = np.where((trail > 0) & (ends - base >= trail), np.maximum(ends - trail, starts), ends)
        return starts, ends


def _count_upto(few: np.ndarray, points: np.ndarray) -> np.ndarray:
    """For each of the sorted `points`, how many of the sorted `few` are <= it: searchsorted(few,
    points, "right"), by a search per one of the few (a UTF-8 text has few continuation bytes
    against its tokens)."""
    return np.cumsum(np.bincount(np.searchsorted(points, few, side="left"), minlength=len(points) + 1)[:-1])
