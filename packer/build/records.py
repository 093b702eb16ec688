"""Fine-tuning records -> token ids and a per-token loss mask (1 = trained), one batch at a time.

    prompt-completion  {"prompt": "2+2=", "completion": "4"}, eos on, bos off:
        ids   [17, 10, 17, 28 | 19 | 0  ]      prompt "2+2=" | completion "4" | eos
        mask  [ 0,  0,  0,  0 |  1 | 1  ]      bos (if on) and prompt untrained; completion and eos trained

    chat  {"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}: rendered by the chat template
        (packer/build/chat.py), encoded once with special tokens read as such, and a token is trained
        iff it lies inside a trained turn's span; packer adds no bos/eos (the template places them).

    tokens  {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}   or   {"input_ids": [...], "loss_mask": [0, 1, 1]}
        ids   [5, 6, 7]   mask [0, 1, 1]      taken as they are: no bos/eos added; ids checked < vocab

Prompt and completion are encoded apart (encode_texts, the text path), so the completion's tokens
never depend on the prompt's last characters. Every problem with one record is a skip reason
(SKIP_REASONS), counted like any bad record; with long_prompts="drop" an example whose prompt
(the untrained tokens before its first trained one) fills the context is skipped as prompt_too_long.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass

import numpy as np

from packer.build.chat import ChatTemplate, RecordError
from packer.build.readers.common import encodable
from packer.build.tokenizer import TokenizerInfo, chat_template_of, load_tokenizer, template_specials

SKIP_REASONS = {
    "missing_field": "the record lacks the kind's field (--prompt-field, --messages-field, --ids-field, ...)",
    "non_string_text": "a prompt or completion that is not a string",
    "empty_completion": "an empty or whitespace-only completion",
    "empty_messages": "messages missing, not a list, or empty",
    "missing_role": "a message that is not an object with a string role",
    "non_string_content": "a message whose content is not a string",
    "special_token_in_content": "a message holding a special token's text (it would read as that token)",
    "template_error": "the chat template rejected the conversation (raise_exception, an undefined value)",
    "span_inside_token": "a trained span starts or ends inside a token of the rendered text",
    "invalid_utf8": "a lone surrogate in the text",
    "bad_ids": "input ids that are not a non-empty list of whole numbers",
    "id_out_of_range": "an input id not below the vocabulary size",
    "bad_labels": "labels of another length, or a label that is neither -100 nor its input id",
    "bad_loss_mask": "a loss mask of another length, or a value other than 0 and 1",
    "no_trained_tokens": "no token of the example is trained",
    "prompt_too_long": "long_prompts=drop: the prompt alone fills the context",
}


@dataclass
class Encoded:
    """One batch: flat ids, the length of each example, the flat 0/1 mask aligned with ids."""

    ids: np.ndarray
    lengths: np.ndarray
    mask: np.ndarray


class RecordEncoder:
    """Encodes batches of (where, record) of one kind for one build (module docstring). `encode_texts`
    is the text encode path (packer/build/tokenize.py's, handed in: tokenize imports this module),
    so prompts and completions are encoded exactly as text documents are."""

    def __init__(self, kind: str, info: TokenizerInfo, config, encode_texts):
        self.kind, self.info, self.config, self.encode_texts = kind, info, config, encode_texts
        self.tok = load_tokenizer(info.path)
        if kind == "chat":
            source, _ = chat_template_of(info.path, config.chat_template)
            self.template = ChatTemplate(source, template_specials(info), config.roles)
            self.chat_tok, self.specials_re, self.offsets = _chat_encoding(info.path)

    def fields(self) -> tuple[str, ...]:
        """The record fields this kind reads, the required one first."""
        c = self.config
        return {"prompt-completion": (c.prompt_field, c.completion_field), "chat": (c.messages_field,),
                "tokens": (c.ids_field, c.labels_field, c.loss_mask_field)}[self.kind]

    def encode(self, batch: list[tuple[str, dict]], skips) -> Encoded:
        kind = {"prompt-completion": self._prompt_completion, "chat": self._chat, "tokens": self._tokens}[self.kind]
        wheres, encoded = kind(batch, skips)
        return self._keep(wheres, encoded, skips)

    def _keep(self, wheres: list[str], e: Encoded, skips) -> Encoded:
        """The batch without its examples that train nothing, or (long_prompts="drop") whose prompt
        fills the context: one vectorized pass, a Python step only per example dropped."""
        starts = np.cumsum(e.lengths) - e.lengths
        cum = np.concatenate([[0], np.cumsum(e.mask, dtype=np.int64)])
        trained = cum[starts + e.lengths] - cum[starts]
        keep = trained > 0
        if self.config.long_prompts == "drop":
            positions = np.flatnonzero(e.mask)
            first = positions[np.minimum(np.searchsorted(positions, starts), max(len(positions) - 1, 0))] - starts \
                if len(positions) else np.zeros(len(starts), np.int64)
            too_long = keep & (first >= self.config.context_length)
        else:
            too_long = np.zeros(len(keep), bool)
        for i in np.flatnonzero(~keep | too_long).tolist():
            skips.add("no_trained_tokens" if not keep[i] else "prompt_too_long", wheres[i])
        keep &= ~too_long
        if keep.all():
            return e
        tokens = np.repeat(keep, e.lengths)
        return Encoded(e.ids[tokens], e.lengths[keep], e.mask[tokens])

    def _empty(self) -> tuple[list, Encoded]:
        return [], Encoded(np.zeros(0, self.info.dtype), np.zeros(0, np.int64), np.zeros(0, np.uint8))

    def _prompt_completion(self, batch, skips):
        c = self.config
        good = []
        for where, record in batch:
            prompt, completion = record.get(c.prompt_field), record.get(c.completion_field)
            if prompt is None or completion is None:
                skips.add("missing_field", where)
            elif not isinstance(prompt, str) or not isinstance(completion, str):
                skips.add("non_string_text", where)
            elif not completion.strip():
                skips.add("empty_completion", where)
            elif not (encodable(prompt) and encodable(completion)):
                skips.add("invalid_utf8", where)
            else:
                good.append((where, prompt, completion))
        if not good:
            return self._empty()
        dtype, info = self.info.dtype, self.info
        p_ids, p_len = self.encode_texts(self.tok, [p for _, p, _ in good], dtype=dtype, bos_id=info.bos_id)
        c_ids, c_len = self.encode_texts(self.tok, [c for _, _, c in good], dtype=dtype, eos_id=info.eos_id)
        lengths = p_len + c_len
        out_starts = np.cumsum(lengths) - lengths
        p_at = np.arange(len(p_ids)) + np.repeat(out_starts - (np.cumsum(p_len) - p_len), p_len)
        c_at = np.arange(len(c_ids)) + np.repeat(out_starts + p_len - (np.cumsum(c_len) - c_len), c_len)
        ids = np.empty(int(lengths.sum()), dtype)
        ids[p_at], ids[c_at] = p_ids, c_ids
        mask = np.zeros(len(ids), np.uint8)
        mask[c_at] = 1
        return [w for w, _, _ in good], Encoded(ids, lengths, mask)

    def _chat(self, batch, skips):
        rendered = []
        for where, record in batch:
            messages = self._messages(record, where, skips)
            if messages is None:
                continue
            try:
                text, spans = self.template.spans(messages, where)
            except RecordError as e:
                skips.add(e.reason, f"{where}: {e.detail}"[:300])
                continue
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:
                skips.add("invalid_utf8", where)
                continue
            rendered.append((where, text, spans, data))
        if not rendered:
            return self._empty()
        texts = [text for _, text, _, _ in rendered]
        spans = [s for _, _, s, _ in rendered]
        got = None
        if self.offsets is not None:  # ids only, offsets from the ids (ByteOffsets): the same mask, 1.7x faster
            got = self.offsets.batch_masks(self.chat_tok.encode_batch_fast(texts, add_special_tokens=False), texts,
                                           spans, [d for _, _, _, d in rendered])
        if got is None:
            got = batch_masks(self.chat_tok.encode_batch(texts, add_special_tokens=False), [len(t) for t in texts],
                              spans)
        ids, lengths, mask, bad = got
        for i in np.flatnonzero(bad).tolist():
            skips.add("span_inside_token", rendered[i][0])
        wheres = [w for (w, _, _, _), b in zip(rendered, bad.tolist()) if not b]
        if bad.any():
            tokens = np.repeat(~bad, lengths)
            ids, lengths, mask = ids[tokens], lengths[~bad], mask[tokens]
        return wheres, Encoded(ids.astype(self.info.dtype, copy=False), lengths, mask)

    def _messages(self, record, where, skips):
        messages = record.get(self.config.messages_field)
        if not isinstance(messages, list) or not messages:
            skips.add("missing_field" if messages is None else "empty_messages", where)
            return None
        special = self.specials_re.search if self.specials_re is not None else None
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                skips.add("missing_role", where)
                return None
            content = m.get("content")
            if not isinstance(content, str):
                skips.add("non_string_content", where)
                return None
            if special is not None and special(content):
                skips.add("special_token_in_content", where)
                return None
        roles = self.template.roles
        if not self.template.has_generation and not any(m["role"] in roles for m in messages):
            skips.add("no_trained_tokens", where)
            return None
        return messages

    def _tokens(self, batch, skips):
        c, out = self.config, []
        for where, record in batch:
            ids = _int_array(record.get(c.ids_field))
            if c.ids_field not in record:
                skips.add("missing_field", where)
            elif ids is None or not len(ids):
                skips.add("bad_ids", where)
            elif ids.min() < 0 or ids.max() >= self.info.vocab_size:
                skips.add("id_out_of_range", where)
            elif (mask := self._token_mask(record, ids, where, skips)) is not None:
                out.append((where, ids, mask))
        if not out:
            return self._empty()
        return [w for w, _, _ in out], Encoded(np.concatenate([i for _, i, _ in out]).astype(self.info.dtype),
                                               np.fromiter((len(i) for _, i, _ in out), np.int64, len(out)),
                                               np.concatenate([m for _, _, m in out]))

    def _token_mask(self, record, ids: np.ndarray, where: str, skips):
        c = self.config
        if c.labels_field in record:
            labels = _int_array(record[c.labels_field])
            if labels is None or len(labels) != len(ids) or not np.all((labels == -100) | (labels == ids)):
                skips.add("bad_labels", where)
                return None
            return (labels != -100).astype(np.uint8)
        if c.loss_mask_field in record:
            mask = _int_array(record[c.loss_mask_field])
            if mask is None or len(mask) != len(ids) or not np.all((mask == 0) | (mask == 1)):
                skips.add("bad_loss_mask", where)
                return None
            return mask.astype(np.uint8)
        skips.add("missing_field", where)
        return None


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


def _int_array(value) -> np.ndarray | None:
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        return None
    try:
        return np.asarray(value, dtype=np.int64)
    except OverflowError:
        return None


@functools.lru_cache(maxsize=4)
def _chat_encoding(path: str):
    """(the chat tokenizer, a pattern of its special tokens' texts, its ByteOffsets or None), once per
    process and path, as load_tokenizer: shared, never changed."""
    tok = _chat_tokenizer(path)
    specials = sorted((t.content for t in tok.get_added_tokens_decoder().values() if t.special), key=len, reverse=True)
    return tok, re.compile("|".join(map(re.escape, specials))) if specials else None, ByteOffsets.of(tok)


def _chat_tokenizer(path: str):
    """The build's tokenizer with its special tokens read as tokens (the template emits them as text);
    no truncation, no padding, as everywhere."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(load_tokenizer(path).to_str())
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = False
    return tok


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
    caller then asks the tokenizer for offsets. tests/build/test_chat.py holds both ways equal on
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
        byte_of = _unicode_bytes()
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
        belongs to, None for ASCII), or None when a text's ids do not lay out its bytes."""
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


def _unicode_bytes() -> dict[str, int]:
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
