"""Encode engines: every engine gives `tokenizers`' ids exactly where `auto` picks it, refuses
where it could not, and a build with either engine has the same bytes (packer/encode/engines)."""

from __future__ import annotations

import json
import random
import unicodedata

import numpy as np
import pytest
from conftest import TOKENIZER, build_sample, run_packer, sample_heads, sample_texts, undated

from packer import config
from packer.encode import engines
from packer.encode.engines import byte_level, choose_engine, fastokens_bpe, tiktoken_bpe
from packer.encode.engines.tiktoken_bpe import NEVER_ALLOWED as NEVER
from packer.encode.text import encode_parts, encode_texts
from packer.encode.tokenizer import load_encoder, load_tokenizer

QWEN2 = byte_level.SPLIT_REGEXES["qwen2"]
LLAMA3 = byte_level.SPLIT_REGEXES["llama3"]


def _train(path, pre: str, normalizer: bool = False, vocab_size: int = 1500, texts=None):
    """A byte-level BPE trained on the sample corpus: GPT-2 style (ByteLevel with its regex) or a
    Split regex + ByteLevel (Llama 3 / Qwen 2 style), with NFC when `normalizer`."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if pre == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pre), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if normalizer:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts or (sample_texts()[:400] + _adversarial()[:40]), trainer)
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def tokenizers_(tmp_path_factory):
    """name -> tokenizer.json path: the sample's and three trained here (GPT-2, Llama 3 and NFC Qwen 2 style)."""
    d = tmp_path_factory.mktemp("tok")
    return {"sample": TOKENIZER, "gpt2": _train(d / "gpt2.json", "gpt2"),
            "llama3": _train(d / "llama3.json", LLAMA3), "qwen2-nfc": _train(d / "qwen.json", QWEN2, normalizer=True)}


def _categories() -> str:
    """Up to 40 code points of every Unicode general category (planes 0-3 and 14, no surrogates)."""
    seen: dict[str, list[str]] = {}
    for cp in [*range(0x40000), *range(0xE0000, 0xE0200)]:
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        found = seen.setdefault(unicodedata.category(c), [])
        if len(found) < 40 or cp % 997 == 0:
            found.append(c)
    assert len(seen) >= 29  # every category, unassigned (Cn) and private use (Co) included
    return " ".join("".join(v) + " " + " ".join(v[:10]) for v in seen.values())


def _adversarial() -> list[str]:
    rng = random.Random(0)
    texts = [
        _categories(),
        " " * 300 + "x" + "\t" * 50 + "\n" * 40 + " \n \r\n\r\n  \u3000\u3000\xa0\u2009x  \n",
        "0123456789" * 200 + " 1 22 333 4444 55555 ١٢٣٤٥ ０１２３ ⅠⅡⅢ ½ ²³ 𝟘𝟙",
        "I'M you'RE he'S we'VE she'LL they'D 'S 'T 'Re 'vE 'm 'll 'D don'T '' ' s 'ſ 'K 'ß Its' it's",
        "汉字漢字ひらがなカタカナ한국어 조선말，。！？「」 中文 English mixed 日本語の文章です。",
        "👨‍👩‍👧‍👦 👍🏽 🇫🇷🇩🇪 🏳️‍🌈 ❤️‍🔥 🧑🏿‍🦰 #️⃣ 👩‍💻👩‍💻",
        "e\u0301 a\u0308\u0304 A\u030a \u212b \u2126 \ufb01 \u1100\u1161\u11a8 \u0344 o\u0328\u0304 "
        "\u0958 \u1e0b\u0323 q\u0307\u0323 \u00c5\u0301 >\u0338 =\u0338 <\u0338",
        "<|endoftext|>x<|endoftext|><|endoftext|> <|endoftext|> <|im_start|>user\n<|endoftext",
        f"{NEVER}x{NEVER}{NEVER} {NEVER[:-1]} é{NEVER}",  # the special token the tiktoken engine never allows
        "\x00\x01\x7f\x80\x9f \ufeff\u200b\u200c\u200d\u2028\u2029 \U0010fffd \ue000",
        "مرحبا بالعالم עברית Ελληνικά Русский текст हिन्दी தமிழ் ไทย",
        "def f(x):\n\treturn {'a': [1, 2.5e-3]}  # comment\n\n\n    \n",
        "".join(chr(rng.randrange(32, 0x3000)) for _ in range(3000)),
        "".join(rng.choice(" \n\tab1'é漢😀\u0301") for _ in range(5000)),
        "",
        " ",
        "a",
    ]
    return texts + [t for t in sample_texts()[:30]]


def _ids(path, engine, texts, piece_chars=None):
    kwargs = {"piece_chars": piece_chars} if piece_chars else {}
    return encode_texts(load_encoder(path, engine), texts, dtype=np.uint32, **kwargs)


FAST = ["fastokens", "tiktoken"]


@pytest.mark.parametrize("engine", FAST)
@pytest.mark.parametrize("name", ["sample", "gpt2", "llama3", "qwen2-nfc"])
def test_fast_engines_give_the_tokenizers_ids(tokenizers_, name, engine):
    path = tokenizers_[name]
    assert choose_engine(path).name == "tiktoken" and choose_engine(path, engine).name == engine  # the rule accepts it
    texts = _adversarial()
    want_ids, want_lengths = _ids(path, "hf", texts)
    got_ids, got_lengths = _ids(path, engine, texts)
    np.testing.assert_array_equal(got_lengths, want_lengths)
    np.testing.assert_array_equal(got_ids, want_ids)
    if name == "qwen2-nfc":  # NFC changed some text, and the ids still agree
        assert any(unicodedata.normalize("NFC", t) != t for t in texts)


@pytest.mark.parametrize("engine", FAST)
@pytest.mark.parametrize("name", ["gpt2", "qwen2-nfc"])
def test_huge_words_and_pieces(tokenizers_, name, engine):
    """A 1 MB word (one pre-token), and a long text cut into pieces by the text path."""
    path = tokenizers_[name]
    rng = random.Random(1)
    word = "".join(rng.choice("abcdefghij") for _ in range(1_000_000))
    long = " ".join("".join(rng.choice("abcdé漢 ") for _ in range(rng.randrange(1, 30))) for _ in range(20_000))
    for texts, piece_chars in (([word], None), ([long, "tail"], 50_000)):
        want = _ids(path, "hf", texts, piece_chars)
        got = _ids(path, engine, texts, piece_chars)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("engine", FAST)
@pytest.mark.parametrize("name", [pytest.param("gpt2", marks=pytest.mark.slow),
                                  pytest.param("llama3", marks=pytest.mark.slow), "qwen2-nfc"])
def test_every_code_point_splits_the_same(tokenizers_, name, engine):
    """The split regexes read every code point's class (letter, digit, space, other; case folding in
    the contractions) the same in each engine's regex engine as in the tokenizer's own (module
    byte_level docstring): each code point in contexts where its class decides the cut. One
    tokenizer in the quick suite (~6 s each), all with -m slow."""
    path = tokenizers_[name]
    texts, chunk = [], []
    for cp in [*range(0x40000), *range(0xE0000, 0xE0200)]:
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        chunk.append(f"a{c}1 {c}{c}'{c}\n{c} ")
        if len(chunk) == 2000:
            texts.append("".join(chunk))
            chunk = []
    texts.append("".join(chunk))
    np.testing.assert_array_equal(_ids(path, engine, texts)[0], _ids(path, "hf", texts)[0], err_msg=name)


@pytest.mark.parametrize("pattern", sorted(set(byte_level.FAST_FORMS)))
def test_the_fast_forms_of_the_split_regexes_split_alike(pattern):
    """byte_level.FAST_FORMS (the split regexes as the tiktoken engine runs them, argued there) cut every
    text where the tokenizer's regex cuts it: pieces compared in `regex` (a third leftmost-first engine,
    tiktoken's own dependency) over the adversarial texts, odd contractions and every code point after
    an apostrophe, a space and a letter. (Ids alone would miss a wrong cut where the vocabulary has no
    token across it.)"""
    import regex

    fast = byte_level.FAST_FORMS[pattern]
    assert fast != pattern
    contexts = "".join(f"'{c}'{c}{c} {c}a{c}'" for c in map(chr, range(0x30000)) if not 0xD800 <= ord(c) < 0xE000)
    texts = [*_adversarial(), "'s's 'S'T'RE '\u017f ''ll 'Ll 'lL 'llama 're're 'k 'K x's 'dd", "'" * 50 + "s", contexts]
    as_written, rewritten = regex.compile(pattern), regex.compile(fast)
    for text in texts:
        assert rewritten.findall(text) == as_written.findall(text), text[:80]


def test_the_tiktoken_engine_splits_with_the_fast_form(tokenizers_):
    vocab = byte_level.ranked_vocab_at(tokenizers_["gpt2"])
    engine = load_encoder(tokenizers_["gpt2"], "tiktoken")
    assert vocab.pattern == byte_level.GPT2_REGEX and engine._pattern == byte_level.FAST_FORMS[byte_level.GPT2_REGEX]
    assert set(byte_level.FAST_FORMS) == {byte_level.GPT2_REGEX, *byte_level.SPLIT_REGEXES.values()}  # one for each


@pytest.mark.parametrize("engine", ["hf", "tiktoken"])
def test_a_forked_child_encodes_with_the_parents_encoder(tokenizers_, engine, monkeypatch):
    """A DataLoader worker is a fork of a process that may have encoded already: the engine's threads
    are not in the child, and it must make its own (before: the child waited forever)."""
    import os
    import signal
    import time

    monkeypatch.setenv("RAYON_NUM_THREADS", "2")  # tiktoken: threads of its own
    encoder = load_encoder(tokenizers_["gpt2"], engine)
    texts = _adversarial()[:8]
    want = encode_texts(encoder, texts, dtype=np.uint32)[0]
    list(encode_parts(encoder, texts, dtype=np.uint32))  # the pool made and idle in the parent
    pid = os.fork()
    if pid == 0:  # the child: exit 0 when its ids equal the parent's, killed by the alarm if it hangs
        signal.alarm(20)
        got = np.concatenate([ids for ids, _ in encode_parts(encoder, texts, dtype=np.uint32)])
        os._exit(0 if np.array_equal(got, want) else 3)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, done


def test_lone_surrogates_are_refused_by_both(tokenizers_):
    for engine in ("hf", *FAST):
        with pytest.raises(TypeError):
            load_encoder(tokenizers_["gpt2"], engine).encode_ids(["fine", "a\ud800b"], np.uint32)


def _reference_first_tokens(tok) -> str:
    """The probe's first-tokens text as engines._first_tokens made it before 2026-12-05 (get_vocab, a sort of all)."""
    to_bytes = str.maketrans({c: chr(b) for c, b in byte_level.byte_chars().items()})
    vocab = sorted(tok.get_vocab(with_added_tokens=False).items(), key=lambda item: item[1])
    pieces = []
    for token, _ in vocab[256:256 + engines.PROBE_TOKENS]:
        try:
            pieces.append(token.translate(to_bytes).encode("latin-1").decode("utf-8"))
        except (UnicodeEncodeError, UnicodeDecodeError):
            continue
    return "".join(pieces)


@pytest.mark.parametrize("name", ["sample", "gpt2", "llama3", "qwen2-nfc"])
def test_the_probe_text_made_with_the_ranks_is_the_tokenizers_own(tokenizers_, name):
    """RankedVocab.probe_text (from the file's vocab, ids below 256 + PROBE_TOKENS sorted) equals the text
    read from the loaded tokenizer; and with ids that have gaps (the file's ids spread out), still."""
    path, tok = tokenizers_[name], load_tokenizer(tokenizers_[name])
    want = _reference_first_tokens(tok)
    assert len(want) > 1000 and byte_level.ranked_vocab(_spec(path), check_reach=False).probe_text == want
    vocab = tok.get_vocab(with_added_tokens=False)
    spread = {token: 3 * i + (i % 2) for token, i in vocab.items()}  # the same order by id, with gaps
    assert byte_level.first_tokens(spread) == want == engines._first_tokens(tok)


def _spec(path) -> dict:
    return json.loads(open(path, encoding="utf-8").read())


def _write(tmp_path, spec: dict, name="tokenizer.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(spec), encoding="utf-8")
    return str(path)


def _tiny(merges: list[list[str]], extra: list[str]) -> dict:
    """A byte-level BPE over the 256 byte characters, `extra` tokens after them, and `merges`."""
    vocab = {c: i for i, c in enumerate(sorted(byte_level.byte_chars(), key=byte_level.byte_chars().get))}
    for token in extra:
        vocab[token] = len(vocab)
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                                "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": merges}}


def test_merges_out_of_rank_order_are_refused(tmp_path):
    """(b, c) merges before (a, b), so `tokenizers` leaves "abc" as [a, bc] and never uses the merge
    (ab, c); ranking tokens by merge order would let tiktoken join a + bc into "abc". The file is
    refused (S), and the engine without that check would indeed differ."""
    path = _write(tmp_path, _tiny([["b", "c"], ["a", "b"], ["ab", "c"]], ["bc", "ab", "abc"]))
    choice = choose_engine(path)
    assert choice.name == "hf" and "not what their own merges give" in choice.reason and "'abc'" in choice.reason
    with pytest.raises(ValueError, match="cannot encode .* exactly"):
        choose_engine(path, "tiktoken")
    unchecked = byte_level.ranked_vocab(_spec(path), check_reach=False)  # what (S) prevents
    import tiktoken

    enc = tiktoken.Encoding("x", pat_str=unchecked.pattern, mergeable_ranks=unchecked.ranks, special_tokens={})
    hf_ids = load_encoder(path, "hf").encode_ids(["abc"], np.int64)[0].tolist()
    assert [unchecked.ids[r] for r in enc.encode_ordinary("abc")] != hf_ids == [ord("a"), 256]  # a, bc (ids in byte order, then bc)


def test_merges_in_rank_order_are_accepted(tmp_path):
    """The same vocabulary with (a, b) first: "abc" merges to one token in both engines."""
    path = _write(tmp_path, _tiny([["a", "b"], ["b", "c"], ["ab", "c"]], ["ab", "bc", "abc"]))
    assert choose_engine(path).name == "tiktoken" and choose_engine(path, "fastokens").name == "fastokens"
    texts = ["abc", "abcbc", "bcabc ab bc abcabc"]
    want = load_encoder(path, "hf").encode_ids(texts, np.int64)[0].tolist()
    assert all(load_encoder(path, e).encode_ids(texts, np.int64)[0].tolist() == want for e in FAST)


def test_a_token_merged_two_ways_apart_is_refused(tmp_path):
    """"abc" made by (ab, c) and, after another token's merge, by (a, bc): its merges are not
    consecutive, so no one rank orders it as `tokenizers` does (B)."""
    path = _write(tmp_path, _tiny([["a", "b"], ["b", "c"], ["ab", "c"], ["c", "d"], ["a", "bc"]],
                                  ["ab", "bc", "abc", "cd"]))
    assert "not consecutive" in choose_engine(path).reason


@pytest.mark.parametrize("change, why", [
    (lambda s: s.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [  # DeepSeek V3 style: several Splits
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": QWEN2}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}),
     "pre-tokenizer"),
    (lambda s: s.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\w+|\\W"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}), "pre-tokenizer"),
    (lambda s: s.update(pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                       "split": True}), "pre-tokenizer"),
    (lambda s: s["pre_tokenizer"].update(add_prefix_space=True), "pre-tokenizer"),
    (lambda s: s.update(normalizer={"type": "NFKC"}), "normalizer NFKC"),
    (lambda s: s["model"].update(dropout=0.1), "dropout"),
    (lambda s: s["model"].update(byte_fallback=True), "byte_fallback"),
    (lambda s: s["model"].update(unk_token="<|endoftext|>"), "unk_token"),
    (lambda s: s["added_tokens"].append({"id": 5, "content": "hello", "single_word": False, "lstrip": False,
                                         "rstrip": False, "normalized": True, "special": False}), "not special"),
    (lambda s: s.update(decoder={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                 "split": True}), "decoder"),
])
def test_other_structures_run_on_hf(tmp_path, change, why):
    spec = _spec(TOKENIZER)
    change(spec)
    path = _write(tmp_path, spec)
    choice = choose_engine(path)
    assert choice.name == "hf" and why in choice.reason, choice.reason
    texts = ["Hello world, it's 2024!", "  spaced\n\n"]
    assert load_tokenizer(path).encode_batch_fast(texts, add_special_tokens=False)  # a valid tokenizer.json


def test_wordpiece_runs_on_hf(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "[SEP]": 1, "a": 2, "##b": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    assert choose_engine(path) == engines.Choice("hf", "auto: tiktoken: model WordPiece, not BPE")
    with pytest.raises(ValueError, match="--encode-engine fastokens cannot encode .* WordPiece"):
        choose_engine(path, "fastokens")


def test_auto_without_the_fast_engines_falls_back_and_a_forced_engine_says_why(monkeypatch):
    engines.choose_engine.cache_clear()
    monkeypatch.setattr(fastokens_bpe, "missing", lambda: "fastokens is not installed")
    try:
        assert choose_engine(TOKENIZER) == engines.Choice("tiktoken", "auto: a byte-level BPE it encodes exactly")
        with pytest.raises(ValueError, match="--encode-engine fastokens cannot encode .* not installed"):
            choose_engine(TOKENIZER, "fastokens")
        engines.choose_engine.cache_clear()
        monkeypatch.setattr(tiktoken_bpe, "missing", lambda: "tiktoken is not installed (pip install 'packer[fast]')")
        assert choose_engine(TOKENIZER) == engines.Choice("hf", "auto: tiktoken: tiktoken is not installed "
                                                                "(pip install 'packer[fast]')")
        with pytest.raises(ValueError, match="--encode-engine tiktoken cannot encode .* not installed"):
            choose_engine(TOKENIZER, "tiktoken")
    finally:
        engines.choose_engine.cache_clear()
    assert choose_engine(TOKENIZER, "hf") == engines.Choice("hf", "asked for")


def test_the_config_lists_the_engines():
    assert config.choices("encode_engine") == engines.CHOICES


def _without_engine(out) -> dict:
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and not p.name.startswith(".packer")}
    manifest = json.loads(files.pop("manifest.json"))
    for key in ("created_unix", "build_seconds"):
        manifest.pop(key)
    engine = manifest["tokenizer"].pop("encode_engine")
    if "report.html" in files:  # its header names the engine and the date
        files["report.html"] = undated(files["report.html"], engine=True)
    manifest["config"].pop("encode_engine", None)
    return {**files, "manifest.json": manifest, "engine": engine["name"]}


def test_builds_with_either_engine_are_identical(tmp_path):
    built = {e: _without_engine_after(build_sample, tmp_path / e, e) for e in ("hf", *FAST, "auto")}
    assert [built[e].pop("engine") for e in built] == ["hf", *FAST, "tiktoken"]
    assert built["hf"] == built["fastokens"] == built["tiktoken"] == built["auto"]


def _without_engine_after(build, out, engine):
    build(out, encode_engine=engine, shard_size=100_000)
    return _without_engine(out)


def test_a_resume_may_switch_engines(tmp_path):
    """Killed after its first units with hf, resumed with tiktoken: the bytes of one uninterrupted
    run (with auto: tiktoken)."""
    inputs = sample_heads(tmp_path, 150_000)
    args = [*inputs, "--tokenizer", TOKENIZER, "--context-length", "256", "--shard-size", "8000",
            "--workers", "1", "--unit-bytes", "65536"]
    code, log = run_packer(["build", *args, "-o", str(tmp_path / "a"), "--encode-engine", "hf"], failpoints="unit:2=kill")
    assert code != 0 and (tmp_path / "a" / "_work" / "units" / "unit-000000.json").exists(), log
    code, log = run_packer(["build", *args, "-o", str(tmp_path / "a"), "--encode-engine", "tiktoken"])
    assert code == 0 and "engine:    tiktoken (asked for)" in log, log
    code, log = run_packer(["build", *args, "-o", str(tmp_path / "b")])
    assert code == 0, log
    a, b = _without_engine(tmp_path / "a"), _without_engine(tmp_path / "b")
    assert (a.pop("engine"), b.pop("engine")) == ("tiktoken", "tiktoken")  # b: auto
    assert a == b


@pytest.mark.parametrize("name", ["sample", "gpt2", "llama3"])
def test_encode_added_reads_added_tokens_as_the_chat_tokenizer_does(tokenizers_, name):
    """tiktoken's one call per rendered chat (added tokens read as tokens, the text between encoded
    piece by piece) against tokenizers reading the added tokens itself, on texts dense with them."""
    from tokenizers import AddedToken, Tokenizer

    path = tokenizers_[name]
    tok = Tokenizer.from_file(path)
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True), AddedToken("[INST]", special=True)])
    added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
    rng = random.Random(3)
    marks, between = [*added, " ", "\n", "<|im_", "[INST", "end|>"], _adversarial()[3:11]
    texts = ["".join(rng.choice(marks) + rng.choice(between)[:rng.randrange(0, 60)]
                     for _ in range(rng.randrange(1, 12))) for _ in range(300)] + ["", "<|im_end|>", "<|im_end|><|im_end|>"]
    got = load_encoder(path, "tiktoken").encode_added(texts, added, np.int64)
    assert got is not None
    want = tok.encode_batch_fast(texts, add_special_tokens=False)
    np.testing.assert_array_equal(got[1], [len(e.ids) for e in want])
    np.testing.assert_array_equal(got[0], [i for e in want for i in e.ids])
    assert sum(t.count("<|im_end|>") for t in texts) == int(np.isin(got[0], [added["<|im_end|>"]]).sum()) > 100


def test_encode_added_refuses_where_its_reading_could_differ(tokenizers_):
    """tiktoken takes the first added text that matches, tokenizers the longest: with one a prefix of
    another the caller cuts the text itself; an NFC tokenizer normalizes pieces apart."""
    encoder = load_encoder(tokenizers_["gpt2"], "tiktoken")
    assert encoder.encode_added(["<a><ab>"], {"<a>": 1, "<a>b": 2}, np.int64) is None
    assert encoder.encode_added(["<a><ab>"], {"<a>": 1, "<ab>": 2}, np.int64) is not None
    assert load_encoder(tokenizers_["qwen2-nfc"], "tiktoken").encode_added(["x"], {"<a>": 1}, np.int64) is None
