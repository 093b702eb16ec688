"""packer/encode/nfc.py: NFC checked, and normalized only where needed, equals the tokenizer's own NFC of the whole text.

The reference is `tokenizers`' normalizers.NFC().normalize_str (what an NFC tokenizer runs), of the
whole text, on: every code point below 0x30000 (alone, and run together so marks follow other
characters), every combining mark after every base that composes, pairs of marks, Hangul jamo
sequences and syllables, the engine tests' adversarial texts, and long texts cut into spans.
"""

from __future__ import annotations

import random
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engines import QWEN2, _adversarial, _train
from tokenizers import normalizers

from packer.encode import nfc
from packer.encode.nfc import nfc_text

REFERENCE = normalizers.NFC().normalize_str
MARKS = [chr(cp) for cp in range(0x30000) if unicodedata.combining(chr(cp))]
# every character whose canonical decomposition is two characters, and its two parts
PAIRS = [(chr(cp), *unicodedata.decomposition(chr(cp)).split()) for cp in range(0x30000)
         if unicodedata.decomposition(chr(cp)) and not unicodedata.decomposition(chr(cp)).startswith("<")
         and len(unicodedata.decomposition(chr(cp)).split()) == 2]
BASES = sorted({chr(int(first, 16)) for _, first, _ in PAIRS})


class Counted:
    """REFERENCE, counting the characters it is given: how much text was normalized."""

    def __init__(self):
        self.chars = 0

    def __call__(self, text: str) -> str:
        self.chars += len(text)
        return REFERENCE(text)


def _check(texts: list[str]) -> Counted:
    normalize = Counted()
    for text in texts:
        got = nfc_text(text, normalize)
        assert got == REFERENCE(text), (text[:40], got[:40])
    return normalize


def test_every_code_point_alone_and_run_together():
    cps = [cp for cp in range(0x30000) if not 0xD800 <= cp < 0xE000]
    alone = _check([chr(cp) for cp in cps])
    together = _check(["".join(map(chr, cps[i:i + 512])) for i in range(0, len(cps), 512)])
    assert 0 < alone.chars < len(cps) / 10  # some code points normalized (Å, Ω, CJK compatibility), most not
    assert together.chars > 0


def test_marks_after_bases_and_after_each_other():
    assert len(MARKS) > 800 and len(BASES) > 300
    rng = random.Random(0)
    texts = ["".join(b + m + " " for b in BASES) for m in MARKS]  # every mark after every base that composes
    texts += ["".join(rng.choice(BASES) + rng.choice(MARKS) + rng.choice(MARKS) + rng.choice("x é") for _ in range(300))
              for _ in range(300)]  # two marks: reordered by combining class, composed when not blocked
    texts += ["".join(first + second for _, first, second in PAIRS)]  # decomposed forms, side by side
    normalize = _check(texts)
    assert normalize.chars > 0


def test_decomposed_and_composed_forms_of_every_character():
    texts = [unicodedata.normalize(form, chr(cp)) + "a" for cp in range(0x30000) if not 0xD800 <= cp < 0xE000
             and unicodedata.decomposition(chr(cp)) for form in ("NFD", "NFC")]
    _check(texts)


def test_hangul():
    """L V (T) jamo compose to a syllable, an LV syllable and a T jamo too; old jamo outside those ranges do not."""
    lead, vowel, tail = range(0x1100, 0x1113), range(0x1161, 0x1176), range(0x11A8, 0x11C3)
    jamo = ["".join(map(chr, (a, v, *t))) for a in lead for v in vowel for t in [(), *[(t,) for t in tail]]]
    assert len(jamo) == 19 * 21 * 28
    syllables = [chr(s) + chr(t) for s in range(0xAC00, 0xD7A4, 28) for t in tail]  # LV syllable + T
    old = ["\u1113\u1161", "\u1100\u1176", "\u1100\u1161\u11c3", "\ua960\ud7b0\ud7cb", "\u3131\u314f"]
    normalize = _check([" ".join(jamo[i:i + 300]) for i in range(0, len(jamo), 300)]
                       + [" ".join(syllables[i:i + 300]) for i in range(0, len(syllables), 300)]
                       + old + jamo[:2000] + syllables[:2000] + ["".join(chr(s) for s in range(0xAC00, 0xD7A4))])
    assert normalize.chars > 0


def test_the_engine_tests_adversarial_texts():
    _check(_adversarial())


def test_nfc_text_is_not_normalized_again():
    """An NFC text, ASCII or not, is handed back as it is: the normalizer never runs."""
    normalize = Counted()
    for text in ["plain ASCII", "café naïve Ångström 日本語 한국어 \U0001f600", "x" * 100_000 + "é"]:
        assert nfc_text(text, normalize) is text
    assert normalize.chars == 0


def test_a_long_text_is_normalized_only_around_what_needs_it():
    rng = random.Random(1)
    words = ["word", "café", "naïve", "日本語", "e\u0301", "A\u030a", "\u1100\u1161", "한", "x\u0323\u0307"]
    text = " ".join("plain" if rng.random() < 0.9999 else rng.choice(words[4:]) for _ in range(200_000))
    normalize = _check([text])
    assert 0 < normalize.chars < len(text) / 4


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", " ", "\n", "e", "\u0301", "\u0308", "\u0323", "\u0327", "é", "\u1100",
                                 "\u1161", "\u11a8", "\uac00", "한", "\u212b", "\u0958", "\u0f73", "日", "x", ".",
                                 "\u0b47", "\u0b3e", "\u0cc6", "\u0cd5", "\u0345", "\u05b8", "\u05b7"]),
                max_size=200), st.integers(1, 12))
def test_spans_cut_anywhere_give_the_whole_texts_nfc(pieces, span):
    """With tiny spans every ASCII character can be a cut: NFC of the spans joined is the whole text's."""
    text = "".join(pieces)
    old, nfc.SPAN_CHARS = nfc.SPAN_CHARS, span
    try:
        assert nfc_text(text, REFERENCE) == REFERENCE(text)
    finally:
        nfc.SPAN_CHARS = old


@pytest.fixture(scope="module")
def qwen_nfc(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("nfc") / "qwen.json", QWEN2, normalizer=True)


def test_the_tiktoken_engine_on_an_nfc_tokenizer_equals_tokenizers(qwen_nfc):
    from packer.encode.engines import hf
    from packer.encode.tokenizer import load_encoder, load_tokenizer

    rng = random.Random(2)
    bits = ["the ", "café ", "cafe\u0301 ", "A\u030angstro\u0308m ", "\u1100\u1161\u11a8 ", "日本語 ", "\n", "é\u0323 "]
    texts = [*_adversarial(), "".join(rng.choice(bits) for _ in range(30_000)), "plain " * 5000 + "e\u0301"]
    encoder = load_encoder(qwen_nfc, "tiktoken")
    assert encoder.name == "tiktoken"
    got = encoder.encode_ids(texts, np.int64)
    want = hf.encode_batch(load_tokenizer(qwen_nfc), texts, np.int64)
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])


def test_a_lone_surrogate_is_refused_whether_or_not_the_text_is_nfc(qwen_nfc):
    """Skipping the normalizer must not let a lone surrogate through: tiktoken refuses it as the normalizer did."""
    from packer.encode.tokenizer import load_encoder

    encoder = load_encoder(qwen_nfc, "tiktoken")
    for text in ["a\ud800b", "caf\u00e9 \ud800", "cafe\u0301 \udfff", "x" * 20_000 + "e\u0301 \ud800" + "y" * 9000]:
        with pytest.raises(TypeError, match="lone surrogate"):
            encoder.encode_ids(["fine", text], np.uint32)
