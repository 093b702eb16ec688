"""Tokenizers as HF ships them: a directory (or a hub-cache snapshot) whose tokenizer_config.json /
special_tokens_map.json name eos, bos and pad and say add_bos_token; flags beat those files, the
files beat the guesses; documents get exactly the chosen bos/eos whatever tokenizer.json's template."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import TOKENIZER, sample_texts
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from packer.config import BuildConfig
from packer.encode.text import encode_texts
from packer.encode.tokenizer import (
    declared_specials,
    describe_specials,
    resolve_tokenizer,
    resolved_config,
    specials_manifest,
    tokenizer_info,
)

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"  # DeepSeek's: in no guess list
ADDED = {"__type": "AddedToken", "content": EOS, "lstrip": False, "normalized": False, "rstrip": False,
         "single_word": False, "special": True}
DEEPSEEK = {"tokenizer_config.json": {"add_bos_token": True, "add_eos_token": False, "model_max_length": 16384,
                                      "bos_token": {**ADDED, "content": BOS}, "eos_token": ADDED,
                                      "pad_token": {**ADDED}, "tokenizer_class": "LlamaTokenizerFast"}}


def _tokenizer_dir(d, files=None, *, added=(BOS, EOS), template=None, name="tokenizer.json"):
    """The sample tokenizer with `added` special tokens (and a post-processor `template`), saved as
    d/`name`, and `files` ({file name: JSON}) beside it."""
    tok = Tokenizer.from_file(TOKENIZER)
    tok.add_special_tokens(list(added))
    if template:
        tok.post_processor = TemplateProcessing(single=template, special_tokens=[(t, tok.token_to_id(t)) for t in added])
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / name))
    for file, content in (files or {}).items():
        (d / file).write_text(json.dumps(content, ensure_ascii=False), encoding="utf-8")
    return d


def _ids(d, *tokens):
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    return [tok.token_to_id(t) for t in tokens]


TEXTS = [t[:300] for t in sample_texts()[:60]]


def _reference(d, bos=None, eos=None):
    """Each of TEXTS tokenized by the tokenizer itself (no packer code), bos/eos around it."""
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    return [[bos] * (bos is not None) + e.ids + [eos] * (eos is not None)
            for e in tok.encode_batch(TEXTS, add_special_tokens=False)]


def _built_docs(tmp_path, tokenizer, **config):
    """Build TEXTS with `tokenizer` and `config`; (every stored document, sorted; the manifest)."""
    from packer.config import Job
    from packer.preprocess.pipeline import build
    from packer.store.dataset import open_dataset

    inputs = tmp_path / "docs.jsonl"
    inputs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    job = Job(inputs=(str(inputs),), tokenizer=str(tokenizer), output=str(tmp_path / "out"), workers=1,
              config=BuildConfig(**{"context_length": 512, **config}))
    manifest = build(job)
    docs = [tokens[a:b].tolist() for tokens, offsets in open_dataset(tmp_path / "out") for a, b in zip(offsets[:-1], offsets[1:])]
    return sorted(docs), manifest


def test_config_eos_outside_the_guess_list_builds_without_flags(tmp_path):
    d = _tokenizer_dir(tmp_path / "deepseek", DEEPSEEK)
    bos, eos = _ids(d, BOS, EOS)
    docs, manifest = _built_docs(tmp_path, d)  # no flags: BuildConfig's defaults
    assert docs == sorted(_reference(d, bos if BuildConfig().bos is None else None, eos))
    assert manifest["config"]["eos_id"] == eos != 0  # not the sample's "<|endoftext|>" (id 0), a guess
    info = tokenizer_info(str(d), BuildConfig())
    assert (info.eos_token, info.eos_id, info.eos_source) == (EOS, eos, "tokenizer_config.json")
    assert (info.pad_token, info.pad_id, info.pad_source) == (EOS, eos, "tokenizer_config.json")


def test_add_bos_token_prepends_bos(tmp_path):
    d = _tokenizer_dir(tmp_path / "deepseek", DEEPSEEK)
    bos, eos = _ids(d, BOS, EOS)
    info = tokenizer_info(str(d), BuildConfig(bos=None))  # None: as the tokenizer says
    assert (info.bos_token, info.bos_id, info.bos_source, info.bos_added_by) == (
        BOS, bos, "tokenizer_config.json", "tokenizer_config.json")
    docs, manifest = _built_docs(tmp_path, d, bos=None)
    assert docs == sorted(_reference(d, bos, eos))
    assert all(doc.count(bos) == 1 for doc in docs) and manifest["config"]["bos_id"] == bos
    off = _tokenizer_dir(tmp_path / "off", {"tokenizer_config.json": {**DEEPSEEK["tokenizer_config.json"], "add_bos_token": False}})
    assert tokenizer_info(str(off), BuildConfig(bos=None)).bos_id is None


@pytest.mark.skipif(BuildConfig().bos is not None, reason="needs BuildConfig.bos = None by default (proposed in packer/config.py)")
def test_default_config_follows_add_bos_token(tmp_path):
    d = _tokenizer_dir(tmp_path / "deepseek", DEEPSEEK)
    assert tokenizer_info(str(d), BuildConfig()).bos_id == _ids(d, BOS)[0]
    assert tokenizer_info(TOKENIZER, BuildConfig()).bos_id is None  # no config files: off, as before


@pytest.mark.parametrize("file,value", [
    ("tokenizer_config.json", ADDED),                                  # AddedToken dict, as transformers saves it
    ("tokenizer_config.json", EOS),                                    # a plain string
    ("special_tokens_map.json", {"content": EOS, "lstrip": False}),    # the map alone (an older save)
    ("special_tokens_map.json", EOS),
])
def test_each_file_and_form_names_the_eos(tmp_path, file, value):
    d = _tokenizer_dir(tmp_path / "t", {file: {"eos_token": value, "bos_token": None}})
    info = tokenizer_info(str(d), BuildConfig())
    assert (info.eos_token, info.eos_id, info.eos_source) == (EOS, _ids(d, EOS)[0], file)
    assert declared_specials(str(d / "tokenizer.json")) == {"eos_token": (EOS, file)}  # null names nothing


def test_flags_override_the_config_files(tmp_path):
    d = _tokenizer_dir(tmp_path / "deepseek", DEEPSEEK)
    bos, eos = _ids(d, BOS, EOS)
    info = tokenizer_info(str(d), BuildConfig(eos_token="<|endoftext|>", bos=None))
    assert (info.eos_token, info.eos_id, info.eos_source) == ("<|endoftext|>", 0, "flag")
    assert (info.bos_id, info.bos_source) == (bos, "tokenizer_config.json")  # the file still decides what the flag left
    info = tokenizer_info(str(d), BuildConfig(bos=None, bos_token="<|endoftext|>"))
    assert (info.bos_id, info.bos_source, info.bos_added_by, info.eos_id) == (0, "flag", "tokenizer_config.json", eos)
    info = tokenizer_info(str(d), BuildConfig(bos=False, eos=False))  # --no-bos beats add_bos_token: true
    assert (info.bos_id, info.eos_id, info.pad_id, info.pad_source) == (None, None, eos, "tokenizer_config.json")
    assert tokenizer_info(str(d), BuildConfig(bos=True)).bos_added_by == "flag"


def test_a_named_token_the_tokenizer_lacks_is_one_clear_error(tmp_path):
    from click.testing import CliRunner

    from packer.cli import main

    d = _tokenizer_dir(tmp_path / "t", {"tokenizer_config.json": {"eos_token": "<｜missing｜>"}})
    with pytest.raises(ValueError, match=r"t/tokenizer_config.json names eos_token '<｜missing｜>', which "
                                         r".*t/tokenizer.json does not have; fix the file, name one it has with "
                                         r"--eos-token, or turn it off with --no-eos"):
        tokenizer_info(str(d), BuildConfig())
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    result = CliRunner().invoke(main, ["build", str(tmp_path / "a.jsonl"), "--tokenizer", str(d), "-o", str(tmp_path / "o")])
    (error,) = [line for line in result.output.splitlines() if not line.startswith("config: ")]  # one line, no traceback
    assert result.exit_code == 1 and error.startswith("Error: ") and "names eos_token '<｜missing｜>'" in error
    assert tokenizer_info(str(d), BuildConfig(eos=False)).eos_id is None  # an unused name is never looked up
    bad = _tokenizer_dir(tmp_path / "b", {"tokenizer_config.json": {"eos_token": ["</s>"]}})
    with pytest.raises(ValueError, match=r"b/tokenizer_config.json: eos_token must be a token string"):
        tokenizer_info(str(bad), BuildConfig())
    (bad / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"b/tokenizer_config.json: not JSON \(line 1, column 2"):
        tokenizer_info(str(bad), BuildConfig())


def test_add_bos_token_without_a_bos_says_why_bos_is_on(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    _trained([EOS]).save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "bos_token": None, "add_bos_token": True}))
    with pytest.raises(ValueError, match=r"cannot find the begin-of-text token .*; name one it has with --bos-token, "
                                         r"or turn it off with --no-bos \(it is on because tokenizer_config.json sets add_bos_token\)"):
        tokenizer_info(str(d), BuildConfig(bos=None))
    assert tokenizer_info(str(d), BuildConfig(bos=False)).eos_id == 0


def test_config_files_beside_a_remote_tokenizer(tmp_path):
    import uuid

    from packer.io import fs

    src = _tokenizer_dir(tmp_path / "deepseek", DEEPSEEK)
    remote = fs.location(f"memory://packer-test-{uuid.uuid4().hex}/tok")
    remote.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (remote / name).write_bytes((src / name).read_bytes())
    info = tokenizer_info(str(remote), BuildConfig(bos=None))
    assert (info.eos_id, info.eos_source, info.bos_id) == (*_ids(src, EOS), "tokenizer_config.json", *_ids(src, BOS))


def test_a_missing_pad_token_warns_and_pads_with_eos(tmp_path):
    d = _tokenizer_dir(tmp_path / "t", {"special_tokens_map.json": {"eos_token": EOS, "pad_token": "<pad>"}})
    with pytest.warns(UserWarning, match=r"names pad_token '<pad>', which .* does not have; padding uses the eos id"):
        info = tokenizer_info(str(d), BuildConfig())
    assert (info.pad_id, info.pad_source) == (_ids(d, EOS)[0], "eos")


def test_a_template_post_processor_adds_nothing_to_documents(tmp_path):
    d = _tokenizer_dir(tmp_path / "bert", {"tokenizer_config.json": {"bos_token": "[CLS]", "eos_token": "[SEP]", "add_bos_token": True}},
                       added=("[CLS]", "[SEP]"), template="[CLS] $A [SEP]")
    cls, sep = _ids(d, "[CLS]", "[SEP]")
    plain = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert plain.encode("hi there").ids == [cls, *plain.encode("hi there", add_special_tokens=False).ids, sep]  # it would add them
    docs, _ = _built_docs(tmp_path, d, bos=None)
    assert docs == sorted(_reference(d, cls, sep))  # once each, from the config, none from the template
    d2 = _tokenizer_dir(tmp_path / "template-only", added=("[CLS]", "[SEP]"), template="[CLS] $A [SEP]")
    info = tokenizer_info(str(d2), BuildConfig())
    flat, lengths = encode_texts(Tokenizer.from_file(str(d2 / "tokenizer.json")), TEXTS, dtype=np.uint32,
                                 eos_id=info.eos_id, bos_id=info.bos_id)
    assert np.split(flat, np.cumsum(lengths)[:-1])[0].tolist() == _reference(d2, None, 0)[0]  # the guess, no CLS


def _snapshot(cache, repo, rev, files):
    """An HF hub-cache repo as huggingface_hub writes it: snapshot files are links into blobs/."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "blobs").mkdir(parents=True)
    (root / "snapshots" / rev).mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(rev)
    for name, data in files.items():
        blob = root / "blobs" / f"blob-{name}"
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, root / "snapshots" / rev), root / "snapshots" / rev / name)
    return root / "snapshots" / rev


def _trained(special_tokens, model="bpe"):
    """A tiny tokenizer trained on TEXTS whose only special tokens are `special_tokens`."""
    from tokenizers import models, pre_tokenizers, trainers

    if model == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special_tokens,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=special_tokens)
    tok.train_from_iterator(TEXTS, trainer)
    return tok


def test_a_hub_cache_snapshot_resolves_by_name_with_its_config(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    _trained([BOS, EOS]).save(str(src / "tokenizer.json"))  # DeepSeek-like: none of the guesses
    (src / "tokenizer_config.json").write_text(json.dumps(DEEPSEEK["tokenizer_config.json"]))
    snap = _snapshot(tmp_path / "hub", "deepseek-ai/tiny", "0123abc",
                     {name: (src / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_tokenizer("deepseek-ai/tiny") == str(snap / "tokenizer.json")
    info = tokenizer_info("deepseek-ai/tiny", BuildConfig(bos=None))
    assert (info.bos_id, info.eos_id) == (0, 1) == tuple(_ids(src, BOS, EOS))
    assert (info.eos_source, info.bos_added_by) == ("tokenizer_config.json", "tokenizer_config.json")
    docs, manifest = _built_docs(tmp_path, "deepseek-ai/tiny")  # by name, no flags
    assert docs == sorted(_reference(src, 0 if BuildConfig().bos is None else None, 1))
    assert manifest["tokenizer"]["path"] == str(snap / "tokenizer.json")


def test_wordpiece_without_eos_uses_the_sep_guess_and_its_config_pad(tmp_path):
    d = tmp_path / "bert"
    d.mkdir()
    _trained(["[PAD]", "[UNK]", "[CLS]", "[SEP]"], "wordpiece").save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]"}))
    info = tokenizer_info(str(d), BuildConfig())
    assert (info.eos_token, info.eos_source, info.pad_id, info.pad_source) == ("[SEP]", "guess", 0, "tokenizer_config.json")
    d = tmp_path / "no-sep"
    d.mkdir()
    _trained(["[UNK]"], "wordpiece").save(str(d / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"cannot find the end-of-text token in .*no-sep/tokenizer.json \(no eos_token in "
                                         r"tokenizer_config.json or special_tokens_map.json beside it, none of .*\[SEP\]\); "
                                         r"name one it has with --eos-token, or turn it off with --no-eos"):
        tokenizer_info(str(d), BuildConfig())
    assert tokenizer_info(str(d), BuildConfig(eos=False)).eos_id is None


def test_config_files_are_read_only_beside_a_tokenizer_json(tmp_path):
    d = _tokenizer_dir(tmp_path / "t", {"tokenizer_config.json": {"eos_token": "<｜missing｜>"}}, name="other.json")
    info = tokenizer_info(str(d / "other.json"), BuildConfig())
    assert (info.eos_id, info.eos_source) == (0, "guess")


def test_what_the_manifest_and_summary_record(tmp_path):
    sample = tokenizer_info(TOKENIZER, BuildConfig())
    assert specials_manifest(sample) == {} and resolved_config(BuildConfig(), sample) == BuildConfig(eos=True, bos=False)
    assert (sample.eos_token, sample.eos_source, sample.pad_source) == ("<|endoftext|>", "guess", "eos")
    d = _tokenizer_dir(tmp_path / "deepseek", DEEPSEEK)
    bos, eos = _ids(d, BOS, EOS)
    info = tokenizer_info(str(d), BuildConfig(bos=None))
    src = "tokenizer_config.json"
    assert specials_manifest(info) == {"specials": {
        "eos": {"token": EOS, "id": eos, "source": src},
        "bos": {"token": BOS, "id": bos, "source": src, "added_by": src},
        "pad": {"token": EOS, "id": eos, "source": src}}}
    assert resolved_config(BuildConfig(bos=None), info) == BuildConfig(bos=True, eos_token=EOS, bos_token=BOS)
    assert describe_specials(specials_manifest(info)["specials"]) == (
        f"eos {EOS} (id {eos}, from {src}); bos {BOS} (id {bos}, from {src}; on: its add_bos_token); pad {EOS} (id {eos}, from {src})")
    no_pad = _tokenizer_dir(tmp_path / "no-pad", {"tokenizer_config.json": {"eos_token": EOS}})
    info = tokenizer_info(str(no_pad), BuildConfig(bos=True, bos_token="<|endoftext|>"))
    assert describe_specials(specials_manifest(info)["specials"]) == (
        f"eos {EOS} (id {eos}, from {src}); bos <|endoftext|> (id 0, from flag; on: --bos); pad = eos")
    flagged = tokenizer_info(TOKENIZER, BuildConfig(eos_token="<|endoftext|>"))
    assert specials_manifest(flagged) == {} and resolved_config(BuildConfig(eos_token="<|endoftext|>"), flagged).eos_token == "<|endoftext|>"


@pytest.mark.parametrize("modern", [False, True])
def test_the_two_files_in_transformers_order(tmp_path, modern):
    """When both files name a token, the one transformers' AutoTokenizer uses wins: special_tokens_map.json
    over an older tokenizer_config.json, a newer one (with added_tokens_decoder) over the map."""
    transformers = pytest.importorskip("transformers")
    config = {"eos_token": EOS, "bos_token": BOS, "pad_token": "<|endoftext|>"}
    if modern:
        config["added_tokens_decoder"] = {"0": {"content": "<|endoftext|>", "special": True}}
    d = _tokenizer_dir(tmp_path / "t", {"tokenizer_config.json": config,
                                        "special_tokens_map.json": {"eos_token": {"content": BOS}, "pad_token": EOS}})
    info = tokenizer_info(str(d), BuildConfig(bos=True))
    hf = transformers.AutoTokenizer.from_pretrained(str(d))
    assert (info.eos_token, info.bos_token, info.pad_token) == (hf.eos_token, hf.bos_token, hf.pad_token)
    assert (info.eos_id, info.bos_id, info.pad_id) == (hf.eos_token_id, hf.bos_token_id, hf.pad_token_id)
    assert info.eos_source == ("tokenizer_config.json" if modern else "special_tokens_map.json")


def test_online_packing_adds_the_builds_eos_and_bos(tmp_path):
    """OnlinePackedDataset over a tokenizer path takes the eos and bos the build takes (the config
    file's, add_bos_token), not the guesses: the same documents as `packer build` stores."""
    from packer.train.online import OnlinePackedDataset

    d = _tokenizer_dir(tmp_path / "deepseek", DEEPSEEK)
    bos, eos = _ids(d, BOS, EOS)
    built, _ = _built_docs(tmp_path, d, bos=None)
    items = OnlinePackedDataset(TEXTS, tokenizer=str(d), config=BuildConfig(context_length=512), buffer_docs=len(TEXTS))
    online = sorted(item["input_ids"][a:b].tolist() for item in items
                    for a, b in zip(item["cu_seqlens"][:-1].tolist(), item["cu_seqlens"][1:].tolist()))
    assert online == built and all(doc[0] == bos and doc[-1] == eos for doc in online)
    off = OnlinePackedDataset(TEXTS, tokenizer=str(d), config=BuildConfig(context_length=512, bos=False), eos_id=7)
    assert (off.eos_id, off.bos_id) == (7, None)
    obj = OnlinePackedDataset(TEXTS, tokenizer=Tokenizer.from_file(str(d / "tokenizer.json")),
                              config=BuildConfig(context_length=512))
    assert obj.bos_id is None  # an object carries no add_bos_token


def _tokenizer_error(tmp_path, text: str, config: str | None = None) -> str:
    import shutil

    from packer.encode.tokenizer import _loaded, tokenizer_info

    d = tmp_path / "tok"
    d.mkdir(parents=True)
    if text is None:
        shutil.copy(TOKENIZER, d / "tokenizer.json")
    else:
        (d / "tokenizer.json").write_text(text, encoding="utf-8")
    if config is not None:
        (d / "tokenizer_config.json").write_text(config, encoding="utf-8")
    _loaded.cache_clear()
    with pytest.raises(ValueError) as e:
        tokenizer_info(str(d / "tokenizer.json"), BuildConfig())
    return str(e.value)


@pytest.mark.parametrize("text, said", [
    ("{x", "not JSON (line 1, column 2: Expecting property name enclosed in double quotes)"),
    ('{"a": 1}\n\n  oops', "not JSON (line 3, column 3: Extra data)"),
    ('{"a": [1, 2]}', 'valid JSON, but not a tokenizer: an object (keys: a) without the "model" object'),
    ("[1, 2, 3]", 'valid JSON, but not a tokenizer: a JSON list without the "model" object'),
    ("[" * 100_000 + "]" * 100_000, "JSON nested 100,000 levels deep"),
], ids=["broken", "extra-data", "object", "list", "deep"])
def test_a_tokenizer_json_that_is_no_tokenizer_says_what_it_is(tmp_path, text, said):
    """Issue 35 item 9: where the JSON breaks, or that valid JSON is no tokenizer, not the parser's words."""
    message = _tokenizer_error(tmp_path, text)
    assert said in message and "expected" not in message and "\n" not in message, message


def test_a_deep_tokenizer_config_is_one_line_not_a_recursion_error(tmp_path):
    """Issue 35 item 6: a 100,000-deep tokenizer_config.json is refused by its depth before it is parsed."""
    message = _tokenizer_error(tmp_path, None, "[" * 100_000 + "]" * 100_000)
    assert "tokenizer_config.json: JSON nested 100,000 levels deep" in message, message
    message = _tokenizer_error(tmp_path / "b", None, '{"eos_token": "<|endoftext|>",}')
    assert "tokenizer_config.json: not JSON (line 1, column 31" in message, message


def test_a_build_reads_its_tokenizer_json_once_per_process(tmp_path, monkeypatch):
    """tokenizer_info (its sha256, the tokenizer, the rule's ranks, the probe) and a worker's load_encoder
    each read tokenizer.json once a process (issue 38; three reads before), and the ranks are made from
    those bytes: the sha256 names them and the probe passes."""
    import builtins
    import hashlib
    import io
    import shutil

    from packer.encode import engines
    from packer.encode.engines import byte_level
    from packer.encode.tokenizer import _loaded, load_encoder

    path = str(tmp_path / "tokenizer.json")
    shutil.copy(TOKENIZER, path)
    reads = []
    real_open, real_io_open = builtins.open, io.open

    def counted(opener):
        def open_(file, *args, **kwargs):
            if os.fspath(file) == path if isinstance(file, (str, os.PathLike)) else False:
                reads.append(1)
            return opener(file, *args, **kwargs)
        return open_

    def new_process():
        monkeypatch.setattr(byte_level, "_RANKED", {})
        engines.choose_engine.cache_clear()
        load_encoder.cache_clear()
        _loaded.cache_clear()

    new_process()
    monkeypatch.setattr(builtins, "open", counted(real_open))
    monkeypatch.setattr(io, "open", counted(real_io_open))
    info = tokenizer_info(path, BuildConfig())
    assert info.engine == "tiktoken" and reads == [1]
    assert info.sha256 == hashlib.sha256(open(path, "rb").read()).hexdigest()
    new_process()
    reads.clear()
    load_encoder(path, "tiktoken")  # a worker: the tokenizer, its ranks and the probe from one read
    assert reads == [1]
    new_process()
