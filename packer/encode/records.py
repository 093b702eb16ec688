"""Fine-tuning records -> token ids and a per-token loss mask (1 = trained), one batch at a time.

    prompt-completion  {"prompt": "2+2=", "completion": "4"}, eos on, bos off:
        ids   [17, 10, 17, 28 | 19 | 0  ]      prompt "2+2=" | completion "4" | eos
        mask  [ 0,  0,  0,  0 |  1 | 1  ]      bos (if on) and prompt untrained; completion and eos trained

    chat  {"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}: rendered by the chat template
        (packer/encode/chat.py), encoded once with special tokens read as such, and a token is trained
        iff it lies inside a trained turn's span; packer adds no bos/eos (the template places them).

        With store_roles each token also gets its turn's role id (role_ids: the role table of the
        config; turns as ChatTemplate.turn_bounds cuts them, a token belonging where it starts):
        text   <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n
        roles  user ............................ assistant ....................................

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

from packer.encode import chat_long
from packer.encode.chat import ChatTemplate, RecordError
from packer.encode.chat_source import chat_template_of, template_specials
from packer.encode.offsets import ByteOffsets, batch_masks, spans_to_mask, token_roles  # noqa: F401  (spans_to_mask: re-exported)
from packer.encode.text import PIECE_CHARS, encode_parts
from packer.encode.tokenizer import TokenizerInfo, load_encoder, load_tokenizer
from packer.io.utf8 import HugeRecord, Utf8Text, encodable, is_blank

RECORD_BATCH = 256  # records encoded together (one encode_batch call; rendering is per record)
RECORD_KINDS = ("prompt-completion", "chat", "tokens")
_NO_LENGTHS = np.zeros(0, np.int64)
_DICT, _STR = {dict}, {str}

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
    """One batch: flat ids, the length of each example, the flat 0/1 mask aligned with ids, and
    (chat with store_roles) the flat uint8 role ids aligned with them."""

    ids: np.ndarray
    lengths: np.ndarray
    mask: np.ndarray
    roles: np.ndarray | None = None


class RecordEncoder:
    """Encodes batches of (where, record) of one kind for one build (module docstring). `encode_texts`
    is the text encode path (packer/encode/text.py's), so prompts and completions are encoded exactly
    as text documents are."""

    def __init__(self, kind: str, info: TokenizerInfo, config, encode_texts):
        self.kind, self.info, self.config, self.encode_texts = kind, info, config, encode_texts
        self.tok = load_encoder(info.path, info.engine)  # prompts and completions: the build's engine
        self.role_table = config.role_table if getattr(config, "store_roles", False) else None
        if kind == "chat":
            source, _ = chat_template_of(info.path, config.chat_template)
            self.template = ChatTemplate(source, template_specials(info), config.roles)
            self.chat_tok, self.specials_re, self.offsets = _chat_encoding(info.path)
            self.specials_longest = max((len(t.content) for t in self.chat_tok.get_added_tokens_decoder().values()
                                         if t.special), default=0)
            self.splitter = _added_splitter(info.path)
            # a fast engine encodes the text between the special tokens (the ids give the offsets)
            self.added = self.splitter if info.engine != "hf" and self.offsets is not None else None
            # a chat with a long content, in bounded memory where exact (packer/encode/chat_long.py)
            self.long_chats = (self.template.content_verbatim and self.offsets is not None and self.splitter is not None
                               and self.role_table is None)

    def fields(self) -> tuple[str, ...]:
        """The record fields this kind reads, the required one first."""
        c = self.config
        return {"prompt-completion": (c.prompt_field, c.completion_field), "chat": (c.messages_field,),
                "tokens": (c.ids_field, c.labels_field, c.loss_mask_field)}[self.kind]

    def encode(self, batch: list[tuple[str, dict]], skips) -> Encoded:
        parts = list(self.encode_parts(batch, skips))
        if len(parts) == 1:
            return parts[0]
        roles = None if parts[0].roles is None else np.concatenate([p.roles for p in parts])
        return Encoded(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("ids", "lengths", "mask")), roles)

    def encode_parts(self, batch: list[tuple[str, dict]], skips):
        """`encode` for writers that append what they get (the unit files): the same ids, lengths and
        mask, concatenated, in parts of bounded size. A prompt-completion example with a long prompt
        or completion (a Utf8Text, or over PIECE_CHARS) comes as parts of its own, the examples
        before and after it as batches (_long_prompt_completion); skips are counted in `encode`'s order."""
        if self.kind == "chat":
            yield from self._chat_parts(batch, skips)
            return
        if self.kind == "tokens":
            yield self._keep(*self._tokens(batch, skips), skips)
            return
        good = [g for g in (self._prompt_and_completion(where, record, skips) for where, record in batch) if g]
        run = []
        for example in good:
            if not any(isinstance(t, Utf8Text) or len(t) > PIECE_CHARS for t in example[1:]):
                run.append(example)
                continue
            if run:
                yield self._keep(*self._encode_prompt_completion(run), skips)
                run = []
            yield from self._long_prompt_completion(*example, skips)
        if run or not good:
            yield self._keep(*self._encode_prompt_completion(run), skips)

    def _chat_parts(self, batch, skips):
        """encode_parts for chats: a conversation with a long content (chat_long.py) as parts of its own
        where exact, else whole with its contents made str; the others in batches. The skips are counted
        as one batch counts them (chat_long.Ordered)."""
        if not any(type(r) is HugeRecord for _, r in batch):  # the common case: one type check a record
            yield self._keep(*self._chat(batch, skips), skips)
            return
        ordered = chat_long.Ordered(skips, [w for w, _ in batch])
        yield from self._long_chat_parts(batch, ordered)
        ordered.flush()

    def _long_chat_parts(self, batch, skips):
        run, given = [], 0
        for where, record in batch:
            if type(record) is not HugeRecord:
                run.append((where, record))
                continue
            if run:
                yield self._keep(*self._chat(run, skips), skips)
                run, given = [], given + 1
            parts = None
            if self.long_chats and chat_long.has_long(record.get(self.config.messages_field)):
                messages = self._messages(record, where, chat_long.phase(skips, 0))
                if messages is None:
                    continue
                parts = chat_long.LongChat(self, where, messages).parts(skips)
                parts = None if parts is None else (Encoded(*part) for part in parts)
            if parts is None:
                parts = [self._keep(*self._chat([(where, chat_long.as_str(record))], skips), skips)]
            for part in parts:
                yield part
                given += 1
        if run or not given:  # at least one part, as encode_parts always gave
            yield self._keep(*self._chat(run, skips), skips)

    def _long_prompt_completion(self, where: str, prompt, completion, skips):
        """One example's parts (Encoded; the last one alone carries its length), prompt then completion,
        each streamed a piece at a time through the text path (encode_parts): the ids and mask
        `_encode_prompt_completion` and `_keep` give, never gathered. What `_keep` would drop is
        decided before a part is given: no trained token (the completion's first parts are held
        until one comes), or with long_prompts="drop" a prompt that fills the context (its ids are
        held until they reach it: at most context_length of them)."""
        info, c = self.info, self.config
        completion_parts = encode_parts(self.tok, [completion], dtype=info.dtype, eos_id=info.eos_id, piece_chars=PIECE_CHARS)
        head = []  # the completion's parts up to its first token
        for ids, _ in completion_parts:
            head.append(ids)
            if len(ids):
                break
        else:
            skips.add("no_trained_tokens", where)
            return
        prompt_parts = encode_parts(self.tok, [prompt], dtype=info.dtype, bos_id=info.bos_id, piece_chars=PIECE_CHARS)
        if c.long_prompts == "drop":
            held, n = [], 0
            for ids, _ in prompt_parts:
                held.append(ids)
                n += len(ids)
                if n >= c.context_length:
                    skips.add("prompt_too_long", where)
                    return
            prompt_parts = ((ids, None) for ids in held)
        n = 0
        for ids, _ in prompt_parts:
            n += len(ids)
            yield Encoded(ids, _NO_LENGTHS, np.zeros(len(ids), np.uint8))
        for ids in itertools.chain(head, (ids for ids, _ in completion_parts)):
            n += len(ids)
            yield Encoded(ids, _NO_LENGTHS, np.ones(len(ids), np.uint8))
        yield Encoded(np.zeros(0, info.dtype), np.array([n], np.int64), np.zeros(0, np.uint8))

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
            chat_long.phase(skips, 2).add("no_trained_tokens" if not keep[i] else "prompt_too_long", wheres[i])
        keep &= ~too_long
        if keep.all():
            return e
        tokens = np.repeat(keep, e.lengths)
        return Encoded(e.ids[tokens], e.lengths[keep], e.mask[tokens], None if e.roles is None else e.roles[tokens])

    def _empty(self) -> tuple[list, Encoded]:
        roles = np.zeros(0, np.uint8) if self.role_table is not None else None
        return [], Encoded(np.zeros(0, self.info.dtype), np.zeros(0, np.int64), np.zeros(0, np.uint8), roles)

    def _prompt_and_completion(self, where: str, record: dict, skips) -> tuple | None:
        """(where, prompt, completion) of a usable record, else None with the skip counted. A prompt or
        completion may be a Utf8Text (a long string of a huge JSONL line: packer/preprocess/readers/huge_json.py)."""
        c = self.config
        prompt, completion = record.get(c.prompt_field), record.get(c.completion_field)
        if prompt is None or completion is None:
            skips.add("missing_field", where)
        elif not isinstance(prompt, (str, Utf8Text)) or not isinstance(completion, (str, Utf8Text)):
            skips.add("non_string_text", where)
        elif is_blank(completion):
            skips.add("empty_completion", where)
        elif not (encodable(prompt) and encodable(completion)):
            skips.add("invalid_utf8", where)
        else:
            return where, prompt, completion
        return None

    def _encode_prompt_completion(self, good: list[tuple]) -> tuple[list, Encoded]:
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
        rendered, turns = [], []
        chat_long.phase(skips, 0)
        for where, record in batch:
            messages = self._messages(record, where, skips)
            if messages is None:
                continue
            try:
                got = self.template.spans(messages, where, turns=self.role_table is not None)
            except RecordError as e:
                skips.add(e.reason, f"{where}: {e.detail}"[:300])
                continue
            text, spans = got[0], got[1]
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:
                skips.add("invalid_utf8", where)
                continue
            rendered.append((where, text, spans, data))
            if self.role_table is not None:
                turns.append((got[2], [m["role"] for m in messages]))
        if not rendered:
            return self._empty()
        texts = [text for _, text, _, _ in rendered]
        spans = [s for _, _, s, _ in rendered]
        got, roles = None, None
        if self.offsets is not None and self.role_table is None:  # ids only, offsets from the ids (ByteOffsets):
            encoded = self._added_ids(texts) if self.added is not None else \
                self.chat_tok.encode_batch_fast(texts, add_special_tokens=False)
            got = self.offsets.batch_masks(encoded, texts, spans, [d for _, _, _, d in rendered])  # same mask, 1.7x faster
        if got is None:
            encodings = self.chat_tok.encode_batch(texts, add_special_tokens=False)
            got = batch_masks(encodings, [len(t) for t in texts], spans)
            if self.role_table is not None:
                roles = token_roles(encodings, [len(t) for t in texts], turns, self.role_table)
        ids, lengths, mask, bad = got
        for i in np.flatnonzero(bad).tolist():
            chat_long.phase(skips, 1).add("span_inside_token", rendered[i][0])
        wheres = [w for (w, _, _, _), b in zip(rendered, bad.tolist()) if not b]
        if bad.any():
            tokens = np.repeat(~bad, lengths)
            ids, lengths, mask = ids[tokens], lengths[~bad], mask[tokens]
            roles = None if roles is None else roles[tokens]
        return wheres, Encoded(ids.astype(self.info.dtype, copy=False), lengths, mask, roles)

    def _added_ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(flat ids, lengths) of rendered chats as the chat tokenizer gives them: cut at its added
        tokens (leftmost, longest first, as tokenizers matches them), the text between encoded by
        the build's engine (each piece alone, as tokenizers encodes it), the tokens' own ids between.
        Laid out with numpy: a Python step per part cost as much as tiktoken's encode (short turns)."""
        pattern, added_ids = self.added
        encode_added = getattr(self.tok, "encode_added", None)  # the engine cuts and encodes in one call
        if encode_added is not None and (got := encode_added(texts, added_ids, np.int64)) is not None:
            return got
        parts, counts = [], []  # each text split as [piece, added, piece, ..., piece] (pieces may be "")
        for text in texts:
            split = pattern.split(text)
            parts += split
            counts.append(len(split))
        counts = np.array(counts, np.int64)
        firsts = np.cumsum(counts) - counts
        added = ((np.arange(len(parts)) - np.repeat(firsts, counts)) & 1).astype(bool)
        at_added, at_piece = np.flatnonzero(added), np.flatnonzero(~added)
        pieces = [parts[k] for k in at_piece.tolist()]
        sizes = np.ones(len(parts), np.int64)
        if pieces:
            flat, sizes[at_piece] = self.tok.encode_ids(pieces, np.int64)
        else:
            flat = np.zeros(0, np.int64)
        starts = np.cumsum(sizes) - sizes  # where each part's ids go
        out = np.empty(int(sizes.sum()), np.int64)
        out[starts[at_added]] = np.fromiter((added_ids[parts[k]] for k in at_added.tolist()), np.int64, len(at_added))
        piece_sizes = sizes[at_piece]
        out[np.arange(len(flat)) + np.repeat(starts[at_piece] - (np.cumsum(piece_sizes) - piece_sizes), piece_sizes)] = flat
        return out, np.add.reduceat(sizes, firsts) if len(texts) else np.zeros(0, np.int64)

    def _messages(self, record, where, skips):
        messages = record.get(self.config.messages_field)
        if not isinstance(messages, list) or not messages:
            skips.add("missing_field" if messages is None else "empty_messages", where)
            return None
        problem = None if self._plain(messages) else self._message_problem(messages)
        if problem is not None:
            skips.add(problem, where)
            return None
        roles = self.template.roles
        if not self.template.has_generation and not any(m["role"] in roles for m in messages):
            skips.add("no_trained_tokens", where)
            return None
        return messages

    def _plain(self, messages: list) -> bool:
        """Every message a dict with a str role and content and no special token's text in them: the
        common case, in a few C loops (a Python step per message was a tenth of a short-turn stage)."""
        try:
            roles, contents = [m["role"] for m in messages], [m["content"] for m in messages]
        except (TypeError, KeyError):
            return False
        if set(map(type, messages)) != _DICT or set(map(type, roles)) != _STR or set(map(type, contents)) != _STR:
            return False
        if self.specials_re is None:
            return True
        if "\0" in self.specials_re.pattern:  # a special token's text holds "\0": one content at a time
            return not any(map(self.specials_re.search, contents))
        return self.specials_re.search("\0".join(contents)) is None  # no match can span two contents

    def _message_problem(self, messages: list) -> str | None:
        """The skip reason of the first bad message, in order, or None."""
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                return "missing_role"
            content = m.get("content")
            if not isinstance(content, (str, Utf8Text)):
                return "non_string_content"
            if self.specials_re is not None and chat_long.contains(self.specials_re, self.specials_longest, content):
                return "special_token_in_content"
        return None

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
        return np.ones(len(ids), np.uint8)  # ids alone: a pre-tokenized corpus, every token trained (docs/inputs.md)


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


@functools.lru_cache(maxsize=4)
def _added_splitter(path: str):
    """(a pattern of the chat tokenizer's added tokens, longest first: tokenizers' leftmost-longest
    match; content -> id), or None where its matching is not that (single_word, lstrip / rstrip,
    normalized on some tokens only: two passes) and the chat tokenizer encodes instead."""
    added = list(_chat_tokenizer(path).get_added_tokens_decoder().items())
    if not added or any(t.single_word or t.lstrip or t.rstrip for _, t in added) or \
            len({t.normalized for _, t in added}) > 1:
        return None
    contents = sorted((t.content for _, t in added), key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, contents)) + ")"), {t.content: i for i, t in added}  # (): split keeps them


def _chat_tokenizer(path: str):
    """The build's tokenizer with its special tokens read as tokens (the template emits them as text);
    no truncation, no padding, as everywhere."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(load_tokenizer(path).to_str())
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = False
    return tok


def kind_of_fields(names, config) -> str:
    """The kind a record with these field names is read as under --input-kind auto (the file's first
    record in a build, every record online): messages -> chat, ids -> tokens, prompt and completion ->
    prompt-completion, else text."""
    if config.messages_field in names:
        return "chat"
    if config.ids_field in names:
        return "tokens"
    if config.prompt_field in names and config.completion_field in names:
        return "prompt-completion"
    return "text"
