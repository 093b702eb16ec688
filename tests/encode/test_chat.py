"""Chat records: templates of several families render as transformers renders them, exactly the
trained turns' tokens are trained (against the test's own rendering), a template that breaks the
prefix property is refused naming the record, malformed conversations are counted by reason."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest

from packer.config import BuildConfig
from packer.encode.chat import ChatTemplate, RecordError, TemplateRefused
from packer.encode.chat_source import chat_template_of
from packer.encode.records import RecordEncoder, spans_to_mask
from packer.encode.text import encode_texts
from packer.encode.tokenizer import tokenizer_info
from packer.preprocess.readers import SkipLog

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"

# Modelled on the public templates (ChatML / Qwen, Llama 3, Gemma), as tokenizer_config.json ships them.
CHATML = (r"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
          r" + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3 = (r"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>'"
          r" + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0"
          r" == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt"
          r" %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GEMMA = (r"{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         r"{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         r"{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         r"{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
         r"{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
# ChatML with generation blocks (as TRL's assistant-only-loss templates): the "\n" after <|im_end|> is not trained.
CHATML_GENERATION = (r"{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
                     r"{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}{% else %}"
                     r"{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
                     r"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Breaks the prefix property (as Qwen3's reasoning blocks do): the last assistant turn gets an empty <think>
# block that the same turn, once a user turn follows, no longer has.
LAST_DIFFERENT = (r"{% for message in messages %}{% if message['role'] == 'assistant' and loop.last %}"
                  r"{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' + message['content'] + '<|im_end|>\n' }}"
                  r"{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
                  r"{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

FAMILIES = {
    "chatml": (["<|im_start|>", "<|im_end|>"], CHATML, {"eos_token": "<|im_end|>"}),
    "llama3": (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], LLAMA3,
               {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "gemma": (["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], GEMMA, {"bos_token": "<bos>", "eos_token": "<eos>"}),
    "chatml-generation": (["<|im_start|>", "<|im_end|>"], CHATML_GENERATION, {"eos_token": "<|im_end|>"}),
}


def _reference(family: str, messages: list[dict]) -> list[tuple[str, bool]]:
    """The test's own rendering: (text, trained) pieces, written from each family's format by hand."""
    out = []
    for i, m in enumerate(messages):
        trained = m["role"] == "assistant"
        if family == "chatml":
            out += [(f"<|im_start|>{m['role']}\n", False), (m["content"] + "<|im_end|>\n", trained)]
        elif family == "chatml-generation":
            out += [(f"<|im_start|>{m['role']}\n", False), (m["content"] + "<|im_end|>", trained), ("\n", False)]
        elif family == "llama3":
            bos = "<|begin_of_text|>" if i == 0 else ""
            out += [(f"{bos}<|start_header_id|>{m['role']}<|end_header_id|>\n\n", False),
                    (m["content"].strip() + "<|eot_id|>", trained)]
        elif family == "gemma":
            role = "model" if m["role"] == "assistant" else m["role"]
            out += [(("<bos>" if i == 0 else "") + f"<start_of_turn>{role}\n", False),
                    (m["content"].strip() + "<end_of_turn>\n", trained)]
    return out


def make_tokenizer(tmp_path: Path, family: str, template: str | None = None) -> Path:
    """The sample tokenizer with the family's special tokens added, and its tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer

    specials, default_template, config = FAMILIES[family]
    tok = Tokenizer.from_file(str(SAMPLE / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    d = tmp_path / family
    d.mkdir(exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template or default_template, **config}),
                                             encoding="utf-8")
    return d / "tokenizer.json"


def _conversations(n: int, seed: int, system: bool = True) -> list[list[dict]]:
    """Seeded conversations with contents cut from the sample prose (stripped, so no header/content
    boundary falls inside a pre-token), 1-4 user/assistant exchanges, some with a system turn."""
    rng = random.Random(seed)
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "prose.jsonl", encoding="utf-8")][:400]

    def content():
        t = rng.choice(texts)
        a = rng.randrange(len(t))
        return t[a: a + rng.randrange(1, 300)].strip() or "ok"

    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": content()}] if system and rng.random() < 0.5 else []
        for _ in range(rng.randrange(1, 5)):
            messages += [{"role": "user", "content": content()}, {"role": "assistant", "content": content()}]
        out.append(messages)
    return out


def _encode(tokenizer: Path, records, **config):
    cfg = BuildConfig(input_kind="chat", **config)
    info = tokenizer_info(str(tokenizer), cfg)
    skips = SkipLog.empty()
    encoded = RecordEncoder("chat", info, cfg, encode_texts).encode([(f"chat.jsonl:{i + 1}", r) for i, r in enumerate(records)], skips)
    return encoded, skips, info


def _split(encoded):
    ends = np.cumsum(encoded.lengths)
    return [(encoded.ids[e - n: e], encoded.mask[e - n: e]) for e, n in zip(ends, encoded.lengths)]


def _chat_tokenizer(path: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.encode_special_tokens = False
    return tok


@pytest.mark.parametrize("family", ["chatml", "llama3", "gemma", "chatml-generation"])
def test_trained_tokens_are_exactly_the_assistant_turns(tmp_path, family):
    path = make_tokenizer(tmp_path, family)
    conversations = _conversations(60, seed=len(family), system=family != "gemma")
    encoded, skips, _ = _encode(path, [{"messages": m} for m in conversations])
    assert not skips.counts, skips.examples
    tok = _chat_tokenizer(path)
    examples = _split(encoded)
    assert len(examples) == len(conversations)
    for messages, (ids, mask) in zip(conversations, examples):
        pieces = _reference(family, messages)
        text = "".join(t for t, _ in pieces)
        enc = tok.encode(text, add_special_tokens=False)
        assert ids.tolist() == enc.ids  # one encode of the whole rendering: no bos/eos added by packer
        trained, at = [], 0
        for t, is_trained in pieces:
            if is_trained:
                trained.append((at, at + len(t)))
            at += len(t)
        expected = [int(any(a <= s and e <= b for a, b in trained)) for s, e in enc.offsets]
        assert mask.tolist() == expected
        assert tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False) == "".join(t for t, tr in pieces if tr)
    assert int(encoded.mask.sum()) > 0 and int((encoded.mask == 0).sum()) > 0


@pytest.mark.parametrize("family", ["chatml", "llama3", "gemma", "chatml-generation"])
def test_rendering_matches_transformers(tmp_path, family):
    """Our sandboxed environment renders what transformers' apply_chat_template renders, and with
    {% generation %} blocks our mask equals its assistant_masks."""
    transformers = pytest.importorskip("transformers")
    path = make_tokenizer(tmp_path, family)
    _, _, config = FAMILIES[family]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path), **config)
    conversations = _conversations(20, seed=7, system=family != "gemma")
    encoded, skips, info = _encode(path, [{"messages": m} for m in conversations])
    source, _ = chat_template_of(str(path))
    for messages, (ids, mask) in zip(conversations, _split(encoded)):
        text = hf.apply_chat_template(messages, chat_template=source, tokenize=False)
        assert text == _chat_tokenizer(path).decode(ids.tolist(), skip_special_tokens=False)
        if family == "chatml-generation":
            out = hf.apply_chat_template(messages, chat_template=source, tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)
            assert out["input_ids"] == ids.tolist()
            assert out["assistant_masks"] == mask.tolist()


def test_train_roles_choose_the_trained_turns(tmp_path):
    path = make_tokenizer(tmp_path, "chatml")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"},
                {"role": "tool", "content": "T"}, {"role": "assistant", "content": "B"}]
    encoded, _, _ = _encode(path, [{"messages": messages}], train_roles="assistant,tool")
    tok = _chat_tokenizer(path)
    ids, mask = _split(encoded)[0]
    trained = tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
    # a non-assistant turn has no generation prompt: its header is part of its trained text
    assert trained == "A<|im_end|>\n<|im_start|>tool\nT<|im_end|>\nB<|im_end|>\n"


def test_a_template_that_breaks_the_prefix_property_is_refused_naming_the_record(tmp_path):
    path = make_tokenizer(tmp_path, "chatml", template=LAST_DIFFERENT)
    good = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with pytest.raises(TemplateRefused, match=r"chat.jsonl:2: the chat template breaks the prefix property at turn 1"):
        _encode(path, [{"messages": good}, {"messages": good + [{"role": "user", "content": "more"}]}])


def test_malformed_conversations_are_counted_by_reason(tmp_path):
    path = make_tokenizer(tmp_path, "gemma")
    ok = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    records = [
        {"messages": ok},
        {"other": 1},                                                            # missing_field
        {"messages": []},                                                        # empty_messages
        {"messages": [{"content": "no role"}, ok[1]]},                           # missing_role
        {"messages": [ok[0], {"role": "assistant", "content": ["a", "list"]}]},  # non_string_content
        {"messages": [ok[0], {"role": "assistant", "content": "say <end_of_turn> now"}]},  # special_token_in_content
        {"messages": [{"role": "system", "content": "S"}, *ok]},                 # template_error (raise_exception)
        {"messages": [ok[0]]},                                                   # no_trained_tokens
        {"messages": ok},
    ]
    encoded, skips, _ = _encode(path, records)
    assert len(encoded.lengths) == 2
    assert dict(skips.counts) == {"missing_field": 1, "empty_messages": 1, "missing_role": 1, "non_string_content": 1,
                                  "special_token_in_content": 1, "template_error": 1, "no_trained_tokens": 1}
    _, skips, _ = _encode(path, [records[6]])  # the example names the record and the template's own message
    assert skips.examples == [{"where": "chat.jsonl:1: TemplateError: System role not supported", "reason": "template_error"}]


def test_a_span_boundary_inside_a_token_skips_the_record(tmp_path):
    # a template without a separator after the role: "assistant" + "ed" encodes as ass|ist|anted
    glued = (r"{% for m in messages %}{{ '<|im_start|>' + m['role'] + m['content'] + '<|im_end|>' }}{% endfor %}"
             r"{% if add_generation_prompt %}{{ '<|im_start|>assistant' }}{% endif %}")
    path = make_tokenizer(tmp_path, "chatml", template=glued)
    records = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ed"}]}]
    encoded, skips, _ = _encode(path, records)
    assert dict(skips.counts) == {"span_inside_token": 1} and not len(encoded.lengths)


def test_spans_to_mask():
    offsets = [(0, 3), (3, 5), (5, 9)]
    assert spans_to_mask(offsets, [(3, 9)]).tolist() == [0, 1, 1]
    assert spans_to_mask(offsets, [(0, 3), (5, 9)]).tolist() == [1, 0, 1]
    assert spans_to_mask(offsets, [(4, 9)]) is None
    assert spans_to_mask(offsets, [(3, 8)]) is None


def test_template_sources(tmp_path):
    path = make_tokenizer(tmp_path, "chatml")
    assert chat_template_of(str(path)) == (CHATML, "tokenizer_config.json")
    (path.parent / "chat_template.jinja").write_text(GEMMA, encoding="utf-8")  # transformers >= 4.43 writes this file
    assert chat_template_of(str(path)) == (GEMMA, "chat_template.jinja")
    raw = tmp_path / "t.jinja"
    raw.write_text(LLAMA3, encoding="utf-8")
    assert chat_template_of(str(path), str(raw))[0] == LLAMA3
    listed = tmp_path / "tokenizer_config.json"
    listed.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "x"},
                                                    {"name": "default", "template": CHATML}]}))
    assert chat_template_of(str(path), str(listed))[0] == CHATML
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((SAMPLE / "tokenizer.json").read_bytes())
    with pytest.raises(ValueError, match="no chat template .* give one with --chat-template FILE"):
        chat_template_of(str(bare / "tokenizer.json"))


def test_invalid_jinja_is_one_line():
    with pytest.raises(ValueError, match=r"not valid Jinja \(line 1"):
        ChatTemplate("{% for m in messages %}", {}, ("assistant",))


def test_the_sandbox_blocks_attribute_escapes():
    import jinja2

    t = ChatTemplate("{{ messages.__class__.__mro__ }}", {}, ("assistant",))
    with pytest.raises(jinja2.exceptions.SecurityError):
        t.render([{"role": "user", "content": "x"}])


def test_spans_to_mask_equals_a_slow_reference():
    def slow(offsets, spans):
        if any(s < x < e for a, b in spans for x in (a, b) for s, e in offsets):
            return None
        return [int(e > s and any(a <= s and e <= b for a, b in spans)) for s, e in offsets]

    rng = random.Random(0)
    n_masks = 0
    for _ in range(2000):
        points = [0, *sorted(set(rng.sample(range(1, 60), rng.randrange(1, 20)))), 60]
        offsets = list(zip(points[:-1], points[1:]))
        pool = points if rng.random() < 0.8 else range(61)  # mostly edges on token bounds, some inside
        edges = sorted(rng.sample(list(pool), 2 * rng.randrange(0, min(4, len(pool) // 2) + 1)))
        spans = list(zip(edges[0::2], edges[1::2]))
        got, expected = spans_to_mask(offsets, spans), slow(offsets, spans)
        assert (got is None and expected is None) or got.tolist() == expected
        n_masks += expected is not None and len(spans) > 1
    assert n_masks > 500  # multi-span masks were exercised


def test_batch_masks_equal_one_text_at_a_time():
    from packer.encode.records import batch_masks

    class Encoding:  # what batch_masks reads of a tokenizers.Encoding
        def __init__(self, ids, offsets):
            self.ids, self.offsets = ids, offsets

        def __len__(self):
            return len(self.ids)

    rng = random.Random(1)
    encodings, lengths, spans, n_bad = [], [], [], 0
    for k in range(300):
        size = rng.randrange(1, 40)
        points = [0, *sorted(set(rng.sample(range(1, size + 1), rng.randrange(0, size)))), size]
        points = sorted(set(points))
        offsets = list(zip(points[:-1], points[1:]))
        pool = points if rng.random() < 0.9 else range(size + 1)
        edges = sorted(rng.sample(list(pool), 2 * rng.randrange(0, min(3, len(pool) // 2) + 1)))
        encodings.append(Encoding(list(range(k, k + len(offsets))), offsets))
        lengths.append(size)
        spans.append(list(zip(edges[0::2], edges[1::2])))
    ids, n_tokens, mask, bad = batch_masks(encodings, lengths, spans)
    at = 0
    for e, s, n, b in zip(encodings, spans, n_tokens.tolist(), bad.tolist()):
        one = spans_to_mask(e.offsets, s)
        assert b == (one is None) and ids[at:at + n].tolist() == e.ids
        if one is not None:
            assert mask[at:at + n].tolist() == one.tolist()
        n_bad += b
        at += n
    assert 0 < n_bad < 300


def _tokenizer_variant(tmp_path: Path, variant: str):
    """The sample tokenizer (+ ChatML specials) as shipped, Llama-3-style (a Split regex before
    ByteLevel, a ByteLevel + TemplateProcessing post-processor), or with ByteLevel offset trimming."""
    from tokenizers import AddedToken, Tokenizer

    spec = json.loads((SAMPLE / "tokenizer.json").read_text(encoding="utf-8"))
    if variant == "llama3":
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "behavior": "Isolated", "invert": False, "pattern": {"Regex": (
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")}},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
        spec["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {}}]}
    elif variant.startswith("trim"):
        spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": variant == "trim-prefix-space",
                                  "trim_offsets": True, "use_regex": True}
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<|im_start|>", "<|im_end|>"]])
    return tok


def _hostile_texts(n: int, seed: int) -> list[str]:
    """Runs of spaces, tabs, newlines, accents (composed and combining), CJK, emoji (4 bytes), the
    byte-level alphabet's own letters, Unicode spaces, special tokens, empty texts."""
    rng = random.Random(seed)
    atoms = ["a", "the", " ", "  ", "   ", "\t", "\n", "\n\n", " \n", "é", "日本語", "😀", "e\u0301", "<|im_start|>",
             "<|im_end|>", "Hello", " world", "12345", "!!", " x", "\u00a0", "\u3000", "\u0120\u0120", "\x85", "\u2028"]
    return ["".join(rng.choice(atoms) for _ in range(rng.randrange(0, 30))) for _ in range(n)]


@pytest.mark.parametrize("variant", ["sample", "llama3", "trim", "trim-prefix-space"])
def test_byte_offsets_equal_the_tokenizers_offsets(tmp_path, variant):
    """ByteOffsets (ids from encode_batch_fast, offsets computed) gives encode_batch's ids and
    offsets exactly, trimming included, on texts chosen to break it."""
    from packer.encode.records import ByteOffsets

    tok = _tokenizer_variant(tmp_path, variant)
    offsets = ByteOffsets.of(tok)
    assert offsets is not None and offsets.trim == variant.startswith("trim")
    texts = _hostile_texts(2000, seed=3)
    for at in range(0, len(texts), 256):
        batch = texts[at:at + 256]
        ids, lengths, starts, ends, bases = offsets.offsets(tok.encode_batch_fast(batch, add_special_tokens=False), batch)
        expected = tok.encode_batch(batch, add_special_tokens=False)
        assert lengths.tolist() == [len(e) for e in expected]
        assert ids.tolist() == [i for e in expected for i in e.ids]
        shift = np.repeat(bases, lengths)
        assert list(zip((starts - shift).tolist(), (ends - shift).tolist())) == [o for e in expected for o in e.offsets]


def test_byte_offsets_decline_what_they_do_not_model(tmp_path):
    """A normalizer, another model, added tokens that strip spaces: no ByteOffsets (the tokenizer's
    offsets are used); ids that do not lay out a text's bytes: None for the batch."""
    from tokenizers import AddedToken, Tokenizer, normalizers

    from packer.encode.records import ByteOffsets

    tok = _tokenizer_variant(tmp_path, "sample")
    tok.normalizer = normalizers.NFC()
    assert ByteOffsets.of(tok) is None
    stripping = _tokenizer_variant(tmp_path, "sample")
    stripping.add_special_tokens([AddedToken("<x>", special=True, lstrip=True)])
    assert ByteOffsets.of(stripping) is None
    from tokenizers.models import WordLevel
    assert ByteOffsets.of(Tokenizer(WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))) is None
    tok = _tokenizer_variant(tmp_path, "sample")
    offsets = ByteOffsets.of(tok)
    encodings = tok.encode_batch_fast(["hello", "world"], add_special_tokens=False)
    assert offsets.offsets(encodings, ["hello", "worlds"]) is None  # 5 bytes of ids for a 6-byte text


@pytest.mark.parametrize("family", ["chatml", "llama3", "chatml-generation"])
def test_the_fast_path_builds_what_the_tokenizers_offsets_build(tmp_path, family):
    """Old path against new: the same records through the tokenizer's offsets (encode_batch) and
    through ByteOffsets give the same ids, lengths and masks, hostile contents and bad records included."""
    path = make_tokenizer(tmp_path, family)
    rng = random.Random(5)
    records = [{"messages": m} for m in _conversations(150, seed=9)]
    hostile = _hostile_texts(300, seed=4)
    for r in records[::3]:
        for m in r["messages"]:
            m["content"] = rng.choice(hostile) + m["content"] + rng.choice(hostile)
    cfg = BuildConfig(input_kind="chat", train_roles="assistant,user")
    info = tokenizer_info(str(path), cfg)
    batch = [(f"chat.jsonl:{i + 1}", r) for i, r in enumerate(records)]
    fast = RecordEncoder("chat", info, cfg, encode_texts)
    assert fast.offsets is not None and info.engine != "hf" and fast.added is not None  # a fast engine's path
    slow = RecordEncoder("chat", info, cfg, encode_texts)
    slow.offsets = None
    hf = RecordEncoder("chat", dataclasses.replace(info, engine="hf"), cfg, encode_texts)  # ids from the chat tokenizer
    assert hf.added is None
    got, want = fast.encode(batch, fast_skips := SkipLog.empty()), slow.encode(batch, skips := SkipLog.empty())
    assert got.ids.tolist() == want.ids.tolist() and got.lengths.tolist() == want.lengths.tolist()
    assert got.mask.tolist() == want.mask.tolist() and fast_skips.counts == skips.counts
    by_hf = hf.encode(batch, SkipLog.empty())
    assert by_hf.ids.tolist() == want.ids.tolist() and by_hf.mask.tolist() == want.mask.tolist()
    other = RecordEncoder("chat", dataclasses.replace(info, engine="tiktoken"), cfg, encode_texts).encode(batch, SkipLog.empty())
    assert other.ids.tolist() == want.ids.tolist() and other.mask.tolist() == want.mask.tolist()
    assert 50 < len(want.lengths) <= len(records) and 0 < int(want.mask.sum()) < len(want.mask)


@pytest.mark.parametrize("variant", ["sample", "llama3", "trim", "trim-prefix-space"])
def test_byte_offsets_masks_equal_the_tokenizers_offsets_masks(tmp_path, variant):
    """ByteOffsets.batch_masks (in bytes, the spans' edges moved there) against batch_masks over
    encode_batch's character offsets: the same ids, mask and bad texts for spans that start and end
    anywhere (inside multi-byte characters' tokens, on spaces trimming moves past), added tokens
    holding multi-byte spaces included."""
    from tokenizers import AddedToken

    from packer.encode.records import ByteOffsets, batch_masks

    tok = _tokenizer_variant(tmp_path, variant)
    tok.add_special_tokens([AddedToken("\u3000<x>\u2003 ", special=True, normalized=False)])
    offsets = ByteOffsets.of(tok)
    assert offsets is not None
    rng = random.Random(11)
    texts = [t + rng.choice(["", "\u3000<x>\u2003 ", " \u3000<x>\u2003 é"]) for t in _hostile_texts(1500, seed=12)]
    n_bad = n_trained = 0
    for at in range(0, len(texts), 256):
        batch = texts[at:at + 256]
        spans = []
        for t in batch:
            edges = sorted(rng.sample(range(len(t) + 1), min(len(t) + 1, 2 * rng.randrange(0, 4))))
            spans.append(list(zip(edges[0::2], edges[1::2])))
        got = offsets.batch_masks(tok.encode_batch_fast(batch, add_special_tokens=False), batch, spans,
                                  [t.encode("utf-8") for t in batch] if at % 512 else None)
        want = batch_masks(tok.encode_batch(batch, add_special_tokens=False), [len(t) for t in batch], spans)
        for g, w in zip(got, want):
            assert g.tolist() == w.tolist()
        n_bad += int(want[3].sum())
        n_trained += int(want[2].sum())
    assert 100 < n_bad < len(texts) - 100 and n_trained > 1000  # both outcomes exercised


def test_prefix_spans_equal_jinjas_own_renderings_of_each_prefix():
    """ChatTemplate.spans (its own contexts, renderings shared between turns) against the rule written
    plainly with jinja2's Template.render: for each trained turn k, the text of turns < k (+ the
    generation prompt for an assistant turn) to the text of turns <= k; templates that print something
    for no turns, read messages[0], or trim; every role trained or not, first turns included."""
    templates = [
        CHATML,
        "{% if not messages %}DEFAULT{% endif %}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>"
        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
        "{{ messages[0]['content'] }}|{% for m in messages[1:] %}<{{ m['role'] }}>{{ m['content'] | trim }}{% endfor %}"
        "{% if add_generation_prompt %}<a>{% endif %}",
    ]
    rng = random.Random(2)
    n_spans = 0
    for source in templates:
        for roles in [("assistant",), ("assistant", "user"), ("user", "system", "tool")]:
            template = ChatTemplate(source, {}, roles)
            plain = template.template  # compile_template's jinja2 Template
            for _ in range(150):
                messages = [{"role": rng.choice(["user", "assistant", "system", "tool"]),
                             "content": rng.choice(["a", " bb ", "", "ccc"])} for _ in range(rng.randrange(1, 7))]

                def prefix(n: int, generation_prompt: bool) -> str:
                    try:
                        return plain.render(messages=messages[:n], add_generation_prompt=generation_prompt)
                    except Exception:
                        return "" if n == 0 and not generation_prompt else None

                text = plain.render(messages=messages, add_generation_prompt=False)
                expected = []
                for k, m in enumerate(messages):
                    if m["role"] in roles:
                        head, turn = prefix(k, m["role"] == "assistant"), prefix(k + 1, False)
                        if head is None or not turn.startswith(head) or not text.startswith(turn):
                            expected = None
                            break
                        expected += [(len(head), len(turn))] if len(turn) > len(head) else []
                if expected is None:
                    with pytest.raises(TemplateRefused):
                        template.spans(messages, "chat.jsonl:1")
                    continue
                assert template.spans(messages, "chat.jsonl:1") == (text, expected)
                n_spans += len(expected)
    assert n_spans > 1000


# Templates of the shape packer/encode/chat_turns.py cuts prefix renderings for, and some that are not.
TURN_BY_TURN = {
    "chatml": CHATML,
    "llama3": LLAMA3,
    "bos-first": "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}",
    "alternate": "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
                 "'roles must alternate') }}{% endif %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
                 "{% if loop.first %}{% set role = role | upper %}{% endif %}[{{ role }}]{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}[model]{% endif %}",
    "ending": "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}"
              "<assistant>{% else %}<end>{% endif %}",  # the ending breaks the prefix property: refused
    "prompt": CHATML.replace("'<|im_start|>assistant\\n'", "'<|im_start|>ASSISTANT\\n'"),  # refused too
}
NOT_TURN_BY_TURN = [
    LAST_DIFFERENT, GEMMA, CHATML_GENERATION,
    "{% for m in messages %}{{ m.content }}{% if not loop.last %}|{% endif %}{% endfor %}",
    "{% for m in messages %}{{ m.content }}{{ messages | length }}{% endfor %}",
    "{% for m in messages %}{{ m.content }}{{ loop.previtem }}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{{ m.content }}{% endfor %}",
    "{% for m in messages %}{% if m.role == 'user' %}{% set x = m.content %}{% endif %}{{ x }}{% endfor %}",
    "{% for m in messages %}{{ x }}{% set x = m.content %}{% endfor %}",
    "{% for m in messages %}{{ m.content }}{% if add_generation_prompt %}!{% endif %}{% endfor %}",
    "{% for m in messages %}{{ strftime_now('%Y') }}{{ m.content }}{% endfor %}",
    "{% for m in messages %}{% for c in m.content %}{{ c }}{% endfor %}{% endfor %}",
    "{% for m in messages if m.role != 'system' %}{{ m.content }}{% endfor %}",
    "{{ messages[0].content }}{% for m in messages %}{{ m.content }}{% endfor %}",
    "{% for m in messages %}{{ m.content }}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}",
    "{% for m in messages %}{{ m.content.upper() }}{% endfor %}",
    "{% for m in messages %}{{ m.content }}{% endfor %}{{ messages | length }}",
]


def test_which_templates_render_turn_by_turn():
    from packer.encode.chat_turns import renders_turn_by_turn

    specials = {"bos_token", "eos_token"}
    for name, source in TURN_BY_TURN.items():
        assert renders_turn_by_turn(ChatTemplate(source, {}, ()).template.environment, source, specials), name
    for source in NOT_TURN_BY_TURN:
        assert not renders_turn_by_turn(ChatTemplate(source, {}, ()).template.environment, source, specials), source


@pytest.mark.parametrize("family", list(TURN_BY_TURN))
def test_prefixes_cut_from_one_rendering_equal_the_rendered_prefixes(family):
    """The spans from one marked rendering (chat_turns) against those from rendering every prefix:
    the same text and spans, or the same refusal or record error, word for word."""
    specials = {"bos_token": "<s>", "eos_token": "</s>"}
    rng = random.Random(3)
    outcomes = set()
    for roles in [("assistant",), ("assistant", "user"), ("user", "system")]:
        cut, rendered = ChatTemplate(TURN_BY_TURN[family], specials, roles), ChatTemplate(TURN_BY_TURN[family], specials, roles)
        assert cut._turn_by_turn
        rendered._turn_by_turn = False
        for _ in range(200):
            messages = [{"role": rng.choice(["user", "assistant", "system"]), "content": rng.choice(["a", " b ", "", "cc\n"])}
                        for _ in range(rng.randrange(1, 7))]

            def spans(template):
                try:
                    return template.spans(messages, "chat.jsonl:1")
                except (RecordError, TemplateRefused) as e:
                    return type(e).__name__, str(e)

            got = spans(cut)
            assert got == spans(rendered)
            outcomes.add(got[0] if isinstance(got[0], str) and got[0] in ("RecordError", "TemplateRefused") else "spans")
    expected = {"ending": {"TemplateRefused", "spans"}, "prompt": {"TemplateRefused", "spans"},
                "alternate": {"RecordError", "spans"}}.get(family, {"spans"})
    assert expected <= outcomes


def test_the_one_pass_message_check_agrees_with_the_message_loop(tmp_path):
    """RecordEncoder._plain (joined contents, C loops) accepts exactly the conversations the per-message
    loop finds no problem in: bad shapes, special tokens inside a content, and a special token's
    text split across two contents (which must not count)."""
    path = make_tokenizer(tmp_path, "chatml")
    cfg = BuildConfig(input_kind="chat")
    enc = RecordEncoder("chat", tokenizer_info(str(path), cfg), cfg, encode_texts)
    rng = random.Random(2)
    pieces = ["hi", "", "<|im_", "end|>", "<|im_end|>", "a<|im_start|>b", "\0", "é\n"]
    values = [None, 3, ["x"], {"x": 1}, "user", "assistant"]
    seen = {True: 0, False: 0}
    for _ in range(3000):
        messages = []
        for _ in range(rng.randrange(1, 5)):
            m = {"role": rng.choice(["user", "assistant"]), "content": "".join(rng.choices(pieces, k=2))}
            if rng.random() < 0.08:
                m[rng.choice(["role", "content"])] = rng.choice(values)
            if rng.random() < 0.04:
                del m[rng.choice(["role", "content"])]
            messages.append(m if rng.random() > 0.03 else rng.choice(values[1:]))
        plain = enc._plain(messages)
        assert plain == (enc._message_problem(messages) is None), messages
        seen[plain] += 1
    assert min(seen.values()) > 300
