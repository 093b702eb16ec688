"""A chat whose messages hold a long content (a Utf8Text a huge JSONL line decoded in place, or a str over
PIECE_CHARS), encoded in bounded memory: the ids, mask and skips the whole-text path gives, in parts.

    messages  [{"role": "user", "content": "Write it out."}, {"role": "assistant", "content": <200 MB>}]
    rendered  <|im_start|>user\\nWrite it out.<|im_end|>\\n<|im_start|>assistant\\n\\ue0000\\ue001<|im_end|>\\n
                                                              the stand-in ^ where the content goes

The conversation is rendered with each long content swapped for a short stand-in, which is exact where
the template passes a content through as itself (chat_turns.content_verbatim); the trained spans come
from that rendering too. The text is then the rendering with each stand-in replaced by its content,
cut at the chat tokenizer's added tokens (as it reads them) and, inside a content, at the text path's
cut points (packer/encode/text.py: no pre-token spans them), and encoded a piece at a time; each token's
place in bytes comes from its id (ByteOffsets), so the mask is the whole path's, piece by piece.

Two passes: the first counts what decides the example's fate (a span edge inside a token, no trained
token, with long_prompts=drop a prompt that fills the context), so nothing is given for an example
that is then dropped; the second gives the parts. A long chat costs two encodes, never its ids at once.

Anything else goes the whole way, each long content made a str first (`as_str`): a template that
reads a content any other way, --store-roles, a tokenizer without ByteOffsets or whose added tokens
are matched otherwise, a content holding an added token's text, a stand-in the template renders
other than once.
"""

from __future__ import annotations

import numpy as np

from packer.encode.chat import RecordError
from packer.encode.offsets import _edge_masks
from packer.encode.text import PIECE_CHARS, _encode_ids, _pieces, _utf8_pieces
from packer.io.utf8 import Utf8Text, encodable

_NO_LENGTHS = np.zeros(0, np.int64)
_STAND_IN = "\ue000{}\ue001"  # private-use characters around the content's number


def is_long(content) -> bool:
    return isinstance(content, Utf8Text) or (isinstance(content, str) and len(content) > PIECE_CHARS)


def has_long(messages) -> bool:
    return isinstance(messages, list) and any(isinstance(m, dict) and is_long(m.get("content")) for m in messages)


def as_str(value):
    """`value` with every Utf8Text in it, at any depth, a str (the whole path's input)."""
    if isinstance(value, Utf8Text):
        return str(value)
    if isinstance(value, dict):
        return {k: as_str(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_str(v) for v in value]
    return value


def contains(pattern, longest: int, content) -> bool:
    """Whether `pattern` (an alternation of literal texts, the longest `longest` characters) matches in
    `content`, a Utf8Text searched a window at a time (windows overlap by longest - 1 characters)."""
    if not isinstance(content, Utf8Text):
        return pattern.search(content) is not None
    start, tail = 0, ""
    while start < content.n_bytes:
        window, taken = content.window(start, Utf8Text.WINDOW_BYTES)
        if pattern.search(tail + window):
            return True
        tail, start = (tail + window)[-(longest - 1):] if longest > 1 else "", start + taken
    return False


class LongChat:
    """One long conversation's encoding for a RecordEncoder `enc` (packer/encode/records.py)."""

    def __init__(self, enc, where: str, messages: list):
        self.enc, self.where, self.messages = enc, where, messages

    def parts(self, skips):
        """The example's parts, (ids, lengths, mask) each (the last one alone carries its length), with its
        skips counted; None where it must go the whole way (module docstring)."""
        enc = self.enc
        pattern, added_ids = enc.splitter
        longest = max(map(len, added_ids))
        contents = [m["content"] for m in self.messages if isinstance(m, dict) and is_long(m.get("content"))]
        if any(contains(pattern, longest, c) for c in contents):
            return None  # the chat tokenizer would read an added token inside a content
        stand_ins, k = [], 0
        for m in self.messages:
            if isinstance(m, dict) and is_long(m.get("content")):
                m = {**m, "content": _STAND_IN.format(k)}
                k += 1
            stand_ins.append(m)
        try:
            text, spans = enc.template.spans(stand_ins, self.where)[:2]
        except RecordError as e:
            phase(skips, 0).add(e.reason, f"{self.where}: {e.detail}"[:300])
            return iter(())
        marks = [_STAND_IN.format(i) for i in range(len(contents))]
        at = [text.find(mark) for mark in marks]
        if any(a < 0 or text.count(mark) != 1 for mark, a in zip(marks, at)) or at != sorted(at):
            return None
        widths = list(map(len, marks))
        if any(a < e < a + w for a, w in zip(at, widths) for s in spans for e in s):
            return None  # a span edge inside a stand-in: inside a content
        if not all(map(encodable, [text, *contents])):
            phase(skips, 0).add("invalid_utf8", self.where)
            return iter(())
        segments, last = [], 0  # the text: (False, template text) and (True, content), in order
        for a, w, content in zip(at, widths, contents):
            segments += [(False, text[last:a]), (True, content)]
            last = a + w
        segments.append((False, text[last:]))
        edges = _byte_edges(text, spans, at, widths, contents)
        return self._given(segments, edges, len(spans), skips)

    def _given(self, segments, edges, n_spans: int, skips):
        tokens = trained = 0
        first_trained, bad = None, False
        for ids, mask, chunk_bad in self._chunks(segments, edges, n_spans):  # the first pass: the example's fate
            bad |= chunk_bad
            if first_trained is None and mask.any():
                first_trained = tokens + int(np.argmax(mask))
            tokens += len(ids)
            trained += int(mask.sum())
        c = self.enc.config
        reason = "span_inside_token" if bad else "no_trained_tokens" if not trained else \
            "prompt_too_long" if c.long_prompts == "drop" and first_trained >= c.context_length else None
        if reason:
            phase(skips, 1 if bad else 2).add(reason, self.where)  # where one batch counts it (Ordered)
            return iter(())
        return self._parts(segments, edges, n_spans, tokens)

    def _parts(self, segments, edges, n_spans: int, tokens: int):
        dtype = self.enc.info.dtype
        for ids, mask, _ in self._chunks(segments, edges, n_spans):
            yield ids.astype(dtype, copy=False), _NO_LENGTHS, mask
        yield np.zeros(0, dtype), np.array([tokens], np.int64), np.zeros(0, np.uint8)

    def _chunks(self, segments, edges, n_spans: int):
        """(ids int64, mask uint8, whether a span edge falls inside one of them) of each piece, in order."""
        offsets, pos, first = self.enc.offsets, 0, True
        for piece, added_id in self._pieces(segments):
            ids = np.array([added_id], np.int64) if added_id is not None else \
                _encode_ids(self.enc.tok, [piece], np.int64)[0]
            if not len(ids):
                continue
            size = len(piece.encode("utf-8"))
            got = offsets.piece_offsets(ids, pos, size, first)
            if got is None:
                raise ValueError(f"{self.where}: the tokenizer's ids do not lay out this conversation's bytes; "
                                 "this is a bug in packer: report it with the tokenizer")
            mask, bad = _edge_masks(*got, edges, np.array([n_spans], np.int64))
            yield ids, mask, bool(bad[0])
            pos, first = pos + size, False

    def _pieces(self, segments):
        """(text, None) of each piece to encode and (added text, its id) of each added token, in order: the
        text cut at the added tokens, and inside a long content at the text path's cut points."""
        pattern, added_ids = self.enc.splitter
        pending = ""  # text since the last cut, not yet given
        for is_content, segment in segments:
            if is_content:  # no added token inside (checked)
                pieces = _utf8_pieces(segment, PIECE_CHARS) if isinstance(segment, Utf8Text) else \
                    _pieces(segment, PIECE_CHARS)
                for i, piece in enumerate(pieces):
                    if i:  # a cut point between the pieces: the text before it is encoded alone
                        yield pending, None
                        pending = ""
                    pending += piece
                continue
            parts = pattern.split(segment)  # [text, added, text, ..., text]
            for j, part in enumerate(parts):
                if j % 2:
                    yield pending, None
                    yield part, added_ids[part]
                    pending = ""
                else:
                    pending += part
        yield pending, None


def _byte_edges(text: str, spans, at: list[int], widths: list[int], contents) -> np.ndarray:
    """The spans' edges (characters of the rendering with stand-ins) in bytes of the text with the contents."""
    sizes = [c.n_bytes if isinstance(c, Utf8Text) else len(c.encode("utf-8")) for c in contents]
    out = []
    for edge in (e for s in spans for e in s):
        n = len(text[:edge].encode("utf-8"))
        n += sum(size - len(text[a:a + w].encode("utf-8")) for a, w, size in zip(at, widths, sizes) if a + w <= edge)
        out.append(n)
    return np.array(out, np.int64)


class Ordered:
    """A chat batch's skips, handed to the unit's SkipLog (flush) in the order one batch counts them:
    the records' own problems (phase 0: fields, messages, template, UTF-8), then span edges inside a
    token (1), then what _keep drops (2), each phase in record order. So a batch holding a long chat
    (parts of its own, this module) lists the same first examples as the whole batch would."""

    def __init__(self, skips, wheres: list[str]):
        self.skips, self.rank, self.events, self.phase = skips, {w: i for i, w in enumerate(wheres)}, [], 0

    def add(self, reason: str, where: str):
        rank = self.rank.get(where)
        if rank is None:  # "WHERE: detail" (a template error)
            rank = next((i for w, i in self.rank.items() if where.startswith(w + ":")), len(self.rank))
        self.events.append((self.phase, rank, len(self.events), reason, where))

    def flush(self):
        for _, _, _, reason, where in sorted(self.events):
            self.skips.add(reason, where)
        self.events = []


def phase(skips, n: int):
    """`skips`, an Ordered one set to count in phase `n`."""
    if isinstance(skips, Ordered):
        skips.phase = n
    return skips
