"""Chats with a long content (packer/encode/chat_long.py) against the whole-text path: the same ids, lengths,
mask and skips, streamed in parts; and the cases that must go the whole way, going it.

PIECE_CHARS is 400 here, so contents of a few thousand characters are long and cut many times."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
from test_chat import FAMILIES, SAMPLE, _tokenizer_variant, make_tokenizer

from packer.config import BuildConfig
from packer.encode import chat_long
from packer.encode.records import RecordEncoder
from packer.encode.text import encode_texts
from packer.encode.tokenizer import tokenizer_info
from packer.io.utf8 import HugeRecord, Utf8Text
from packer.preprocess.readers import SkipLog

PIECE = 400


@pytest.fixture(autouse=True)
def short_pieces(monkeypatch):
    monkeypatch.setattr(chat_long, "PIECE_CHARS", PIECE)


def _prose(rng, n: int) -> str:
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "prose.jsonl", encoding="utf-8")]
    out = ""
    while len(out) < n:
        out += rng.choice(texts) + rng.choice([" ", "\n\n", "  ", "\t"])
    return out[:n]


def _encoders(tokenizer, **config):
    cfg = BuildConfig(input_kind="chat", **config)
    info = tokenizer_info(str(tokenizer), cfg)
    engines = [info.engine] + (["hf"] if info.engine != "hf" else [])
    return [RecordEncoder("chat", dataclasses.replace(info, engine=e), cfg, encode_texts) for e in engines]


def _both(enc, records):
    """(the parts' concatenation, its skips, how many parts) and (the whole path's result, its skips)."""
    batch = [(f"chat.jsonl:{i + 1}", HugeRecord(r) if chat_long.has_long(r["messages"]) else r)  # as huge_json reads
             for i, r in enumerate(records)]
    parts = list(enc.encode_parts(batch, got_skips := SkipLog.empty()))
    got = {k: np.concatenate([getattr(p, k) for p in parts]).tolist() for k in ("ids", "lengths", "mask")}
    whole = enc._keep(*enc._chat([(w, chat_long.as_str(r)) for w, r in batch], want_skips := SkipLog.empty()),
                      want_skips)
    want = {k: getattr(whole, k).tolist() for k in ("ids", "lengths", "mask")}
    return (got, (got_skips.counts, got_skips.examples), len(parts)), (want, (want_skips.counts, want_skips.examples))


def _check(enc, records, streamed: bool = True):
    (got, got_skips, n_parts), (want, want_skips) = _both(enc, records)
    assert got == want and got_skips == want_skips  # the skips' counts and first examples, in order
    if streamed:
        assert n_parts > len(records)  # long chats came in parts of their own
    return want, want_skips[0]


def _long(rng, n: int, as_bytes: bool):
    text = _prose(rng, n)
    return Utf8Text(bytearray(text.encode("utf-8"))) if as_bytes else text


@pytest.mark.parametrize("family", ["chatml", "chatml-plain-eos"])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_long_contents_give_the_whole_paths_ids_and_mask(tmp_path, family, as_bytes):
    template = None
    if family == "chatml-plain-eos":  # the sample's own template: content joined by + to eos_token
        family, template = "chatml", json.load(open(SAMPLE / "tokenizer_config.json"))["chat_template"]
    path = make_tokenizer(tmp_path, family, template)
    rng = random.Random(7)
    for enc in _encoders(path):
        assert enc.long_chats, enc.info.engine
        for round_ in range(6):
            records = []
            for _ in range(4):
                messages = []
                for _ in range(rng.randrange(1, 4)):
                    for role in ("user", "assistant"):
                        long = rng.random() < 0.5
                        content = _long(rng, rng.randrange(PIECE + 1, 6 * PIECE), as_bytes) if long else \
                            _prose(rng, rng.randrange(1, 80)).strip() or "ok"
                        messages.append({"role": role, "content": content})
                records.append({"messages": messages})
            records.append({"messages": [{"role": "user", "content": "short"}, {"role": "assistant", "content": "one"}]})
            want, _ = _check(enc, records)
            assert sum(want["mask"]) and 0 in want["mask"]


@pytest.mark.parametrize("variant", ["sample", "trim", "trim-prefix-space", "llama3"])
def test_edges_at_odd_content_boundaries(tmp_path, variant):
    """Contents that start or end with spaces and newlines (a span edge inside a token in the whole path:
    span_inside_token, the same here), with no cut point at all (one long word), or of one piece; on the
    sample tokenizer, with ByteLevel offset trimming (a span edge on spaces trimming moves past), and
    Llama-3 style (a Split regex)."""
    path = make_tokenizer(tmp_path, "chatml")
    if variant != "sample":
        _tokenizer_variant(tmp_path, variant).save(str(path))
    rng = random.Random(3)
    body = _prose(rng, 3 * PIECE)
    contents = ["\n\n" + body, body + "  \n", " " + body, body + " ", "x" * (3 * PIECE), "a" * (PIECE + 1),
                body.replace(" ", "\n"), "é" * (2 * PIECE) + " " + body]
    for enc in _encoders(path):
        for content in contents:
            for role in ("user", "assistant"):
                messages = [{"role": "system", "content": "Be brief."}, {"role": role, "content": content},
                            {"role": "assistant", "content": "Done."}]
                _check(enc, [{"messages": messages}])


def test_the_examples_fate_is_decided_before_a_part_is_given(tmp_path):
    """No trained token, a prompt that fills the context (long_prompts=drop) and a special token inside a long
    content: skipped as the whole path skips them, nothing given."""
    path = make_tokenizer(tmp_path, "chatml")
    rng = random.Random(5)
    long = _prose(rng, 5 * PIECE)
    untrained = {"messages": [{"role": "user", "content": long}]}
    filled = {"messages": [{"role": "user", "content": long}, {"role": "assistant", "content": "ok"}]}
    special = {"messages": [{"role": "user", "content": long[:PIECE] + "<|im_end|>" + long}, {"role": "assistant",
                                                                                              "content": "ok"}]}
    for enc in _encoders(path, long_prompts="drop", context_length=64):
        want, skips = _check(enc, [untrained, filled, special], streamed=False)
        assert want["lengths"] == [] and skips == {"no_trained_tokens": 1, "prompt_too_long": 1,
                                                   "special_token_in_content": 1}
    for enc in _encoders(path, context_length=64):  # split (the default): the long prompt stays
        want, skips = _check(enc, [filled])
        assert len(want["lengths"]) == 1 and skips == {}


@pytest.mark.parametrize("why", ["trim", "store_roles", "twice"])
def test_what_goes_the_whole_way(tmp_path, monkeypatch, why):
    """A template that reads the content otherwise (trim, or twice), --store-roles: the whole path, the contents
    made str first (a Utf8Text content is not skipped as non_string_content)."""
    template = {"trim": FAMILIES["chatml"][1].replace("message['content']", "message['content'] | trim"),
                "twice": FAMILIES["chatml"][1].replace("message['content']", "message['content'] + message['content']"),
                "store_roles": None}[why]
    path = make_tokenizer(tmp_path, "chatml", template)
    long = Utf8Text(bytearray(_prose(random.Random(1), 4 * PIECE).encode()))
    record = {"messages": [{"role": "user", "content": "Write."}, {"role": "assistant", "content": long}]}
    config = {"store_roles": True} if why == "store_roles" else {}
    for enc in _encoders(path, **config):
        if why == "twice":
            assert enc.long_chats  # the template passes the content as itself; it is just there twice
        else:
            assert not enc.long_chats
        monkeypatch.setattr(chat_long.LongChat, "_parts", lambda *a: pytest.fail("streamed"))
        want, skips = _check(enc, [record], streamed=False)
        assert len(want["lengths"]) == 1 and skips == {}


def test_a_content_holding_an_added_tokens_text_goes_the_whole_way(tmp_path, monkeypatch):
    """A non-special added token inside a long content is read as that token by the chat tokenizer: whole way."""
    from tokenizers import AddedToken, Tokenizer

    path = make_tokenizer(tmp_path, "chatml")
    tok = Tokenizer.from_file(str(path))
    tok.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    tok.save(str(path))
    long = _prose(random.Random(2), 4 * PIECE)
    record = {"messages": [{"role": "user", "content": "Go."}, {"role": "assistant", "content": long + "<tool>" + long}]}
    for enc in _encoders(path):
        monkeypatch.setattr(chat_long.LongChat, "_parts", lambda *a: pytest.fail("streamed"))
        want, _ = _check(enc, [record], streamed=False)
        assert len(want["lengths"]) == 1


def test_contains_finds_a_match_across_windows(monkeypatch):
    import re

    monkeypatch.setattr(Utf8Text, "WINDOW_BYTES", 8)
    pattern = re.compile(re.escape("<|im_end|>"))
    for at in range(0, 40):
        text = "é" * at + "<|im_end|>" + "x" * 30
        assert chat_long.contains(pattern, 10, Utf8Text(bytearray(text.encode())))
    assert not chat_long.contains(pattern, 10, Utf8Text(bytearray(("<|im_end" + "x" * 30).encode())))


def test_a_huge_lines_other_long_strings_reach_the_template_as_str(tmp_path):
    """A record from a huge line whose long string is not a content (a tool call's arguments, read by a
    template through tojson): made str before the whole path renders it, as if the line had been short."""
    template = FAMILIES["chatml"][1].replace("message['content']", "message['content'] + (message['args'] | tojson)")
    path = make_tokenizer(tmp_path, "chatml", template)
    args = _prose(random.Random(4), 3 * PIECE)
    plain = {"messages": [{"role": "user", "content": "hi", "args": args}, {"role": "assistant", "content": "ok",
                                                                            "args": "x"}]}
    huge = HugeRecord({"messages": [{**plain["messages"][0], "args": Utf8Text(bytearray(args.encode()))},
                                    plain["messages"][1]]})
    for enc in _encoders(path):
        want = enc.encode([("a:1", plain)], SkipLog.empty())
        got = enc.encode([("a:1", huge)], skips := SkipLog.empty())
        assert got.ids.tolist() == want.ids.tolist() and got.mask.tolist() == want.mask.tolist() and not skips.counts
        assert len(want.lengths) == 1
