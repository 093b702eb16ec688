"""A poisoned engine-rule cache never changes a token (issue 35 item 1; DESIGN.md "Nothing packer keeps
between runs can change a token"): ranks kept beside a verdict as rule 1 kept them, rewritten with
valid zip CRCs (ids swapped, shifted, ranks swapped, the split regex replaced, the nfc flag flipped),
never reach an engine (ranks are made from the tokenizer.json on every build), and the build encodes
exactly as `--encode-engine hf`; a verdict of "passed" for a file that fails the rule is caught by the
probe, dropped and checked again; a directory or file another user may write is never read."""

from __future__ import annotations

import io
import json
import os
import shutil

import numpy as np
import pytest
from conftest import TOKENIZER, run_packer, sample_heads, sample_texts

from packer.encode import engines
from packer.encode.engines import byte_level, rule_verdicts
from packer.encode.tokenizer import _loaded, checked_engine, load_encoder, load_tokenizer


def _new_process(monkeypatch):
    monkeypatch.setattr(byte_level, "_RANKED", {})
    engines.choose_engine.cache_clear()
    load_encoder.cache_clear()
    _loaded.cache_clear()


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """(a copy of the sample tokenizer, the verdict directory), checked by a first build, with its ranks
    kept beside the verdict as rule 1 kept them (`.ranks.npz`: tokens in rank order, ids, regex, nfc)."""
    d = tmp_path / "verdicts"
    monkeypatch.setenv("PACKER_RULE_CACHE", str(d))
    path = str(tmp_path / "tokenizer.json")
    shutil.copy(TOKENIZER, path)
    _new_process(monkeypatch)
    assert engines.choose_engine(path).name == "tiktoken"
    verdict = rule_verdicts._path(open(path, "rb").read())
    npz = verdict.with_name(verdict.stem + ".ranks.npz")
    vocab = byte_level.ranked_vocab(byte_level.read_spec(path), check_reach=False)
    tokens = sorted(vocab.ranks, key=vocab.ranks.get)
    out = io.BytesIO()
    np.savez(out, tokens=np.frombuffer(b"".join(tokens), np.uint8), ends=np.cumsum([len(t) for t in tokens]),
             ids=vocab.ids, pattern=np.array(vocab.pattern), nfc=np.array(vocab.nfc))
    npz.write_bytes(out.getvalue())
    yield path, d
    _new_process(monkeypatch)


def _rewrite(npz, change):
    """The kept archive with its fields changed by `change(fields)`, written with valid CRCs."""
    with np.load(npz) as z:
        fields = {k: z[k] for k in z.files}
    change(fields)
    out = io.BytesIO()
    np.savez(out, **fields)
    npz.write_bytes(out.getvalue())


def _fields(npz) -> dict:
    with np.load(io.BytesIO(npz if isinstance(npz, bytes) else npz.read_bytes())) as z:
        return {k: z[k].tobytes() for k in z.files}


def _swap_tokens(fields, a, b, ids_too):
    ends = fields["ends"]
    starts = np.concatenate([[0], ends[:-1]])
    blob = fields["tokens"].tobytes()
    tokens = [blob[s:e] for s, e in zip(starts, ends)]
    tokens[a], tokens[b] = tokens[b], tokens[a]
    fields["tokens"] = np.frombuffer(b"".join(tokens), np.uint8)
    fields["ends"] = np.cumsum([len(t) for t in tokens]).astype(np.int64)
    if ids_too:  # every token keeps its own id: only the merge order changes
        fields["ids"][[a, b]] = fields["ids"][[b, a]]


def _swap_ids(f):
    f["ids"][[300, 301]] = f["ids"][[301, 300]]


def _shift_ids(f):
    f["ids"] = f["ids"] + 1


def _other_regex(f):
    f["pattern"] = np.array(byte_level.SPLIT_REGEXES["llama3"])


def _flip_nfc(f):
    f["nfc"] = np.array(not bool(f["nfc"]))


POISONS = {
    "two ids swapped": _swap_ids,
    "all ids + 1": _shift_ids,
    "two ranks swapped": lambda f: _swap_tokens(f, 300, 301, ids_too=False),
    "two ranks swapped, ids with them": lambda f: _swap_tokens(f, 1464, 14982, ids_too=True),  # changes sample ids; the probe misses it
    "split regex replaced": _other_regex,
    "nfc flipped": _flip_nfc,
}


@pytest.mark.parametrize("poison", POISONS)
def test_a_poisoned_kept_rank_file_never_changes_a_token(kept, monkeypatch, poison):
    path, d = kept
    (npz,) = d.glob("*.ranks.npz")
    clean = npz.read_bytes()
    _rewrite(npz, POISONS[poison])
    assert _fields(npz) != _fields(clean)
    _new_process(monkeypatch)
    texts = sample_texts()[:200]
    engine = checked_engine(path)
    got = load_encoder(path, engine.name).encode_ids(texts, np.int64)
    want = engines.hf.encode_batch(load_tokenizer(path), texts, np.int64)
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])
    assert engine.name == "tiktoken"  # the fast engine still runs, on ranks made from the file


def test_a_passed_verdict_for_a_file_the_rule_refuses_is_caught_by_the_probe(tmp_path, monkeypatch):
    """A verdict of "passed" kept for a tokenizer breaking (S) (tiktoken would join a + bc into "abc",
    tokenizers gives [a, bc]): the probe (the tokenizer's own tokens, written out) sees other ids, the
    verdict is dropped, (S) checked again, and the build runs on hf, or a named engine stops in one line."""
    from test_engines import _tiny, _write
    from test_rule_verdicts import FAILS_S

    monkeypatch.setenv("PACKER_RULE_CACHE", str(tmp_path / "verdicts"))
    path = _write(tmp_path, _tiny(*FAILS_S))
    data = open(path, "rb").read()
    rule_verdicts.put(data, "")  # the lie
    _new_process(monkeypatch)
    choice = checked_engine(path)
    assert choice.name == "hf" and "not what their own merges give" in choice.reason
    assert rule_verdicts.get(data).startswith("1 tokens are not")  # checked again, kept again
    rule_verdicts.put(data, "")
    _new_process(monkeypatch)
    with pytest.raises(ValueError, match="--encode-engine tiktoken cannot encode .* exactly"):
        checked_engine(path, "tiktoken")
    rule_verdicts.put(data, "")
    _new_process(monkeypatch)
    with pytest.raises(engines.ProbeError, match="other ids than tokenizers"):  # a worker: the driver chose before
        load_encoder(path, "tiktoken")
    _new_process(monkeypatch)


def test_the_probe_runs_in_every_process_that_encodes(kept, monkeypatch):
    """Not only when the verdict was first made: each encoder made (driver and workers) probes first."""
    path, _ = kept
    seen = []
    real = engines.probe_difference
    monkeypatch.setattr(engines, "probe_difference", lambda *a: seen.append(1) or real(*a))
    for _ in range(2):
        _new_process(monkeypatch)
        load_encoder(path, "tiktoken")
    assert seen == [1, 1]
    assert load_encoder(path, "hf") and seen == [1, 1]  # the reference is not probed against itself


def test_a_build_over_a_poisoned_cache_equals_hf(tmp_path, kept):
    """End to end: the poisoned directory under `packer build`, shards equal to an hf build's."""
    path, d = kept
    (npz,) = d.glob("*.ranks.npz")
    _rewrite(npz, _shift_ids)
    inputs = sample_heads(tmp_path, 60_000)
    args = [*inputs, "--tokenizer", path, "--context-length", "256", "--workers", "1"]
    env = os.environ["PACKER_RULE_CACHE"]
    try:
        os.environ["PACKER_RULE_CACHE"] = str(d)
        code, log = run_packer(["build", *args, "-o", str(tmp_path / "auto")])
        assert code == 0 and "engine:    tiktoken" in log, log
        code, log = run_packer(["build", *args, "-o", str(tmp_path / "hf"), "--encode-engine", "hf"])
        assert code == 0, log
    finally:
        os.environ["PACKER_RULE_CACHE"] = env
    for shard in sorted((tmp_path / "hf").glob("shard-*")):
        assert (tmp_path / "auto" / shard.name).read_bytes() == shard.read_bytes(), shard.name
    manifest = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert manifest["tokenizer"]["encode_engine"]["check"] == engines.CHECKS["tiktoken"]


def test_a_directory_or_file_others_may_write_is_never_read(kept, monkeypatch):
    path, d = kept
    data = open(path, "rb").read()
    assert rule_verdicts.get(data) == ""
    d.chmod(0o777)
    assert rule_verdicts.get(data) is None  # the directory: others may write it
    rule_verdicts.drop(data)
    assert len(list(d.iterdir())) == 2  # nor is anything removed there
    d.chmod(0o700)
    verdict = rule_verdicts._path(data)
    verdict.chmod(0o666)
    assert rule_verdicts.get(data) is None  # the verdict: others may write it
    verdict.chmod(0o600)
    assert rule_verdicts.get(data) == ""
    with monkeypatch.context() as other:
        other.setattr(os, "getuid", lambda: os.stat(d).st_uid + 1)  # as another user sees them
        assert rule_verdicts.get(data) is None
    link = d / "link"
    verdict.rename(link)
    verdict.symlink_to(link)
    assert rule_verdicts.get(data) is None  # a link is not followed
    verdict.unlink()
    os.mkfifo(verdict)
    assert rule_verdicts.get(data) is None  # nor a FIFO waited on


def test_a_new_directory_is_this_users_alone_whatever_the_umask(tmp_path, monkeypatch):
    d = tmp_path / "fresh" / "verdicts"
    monkeypatch.setenv("PACKER_RULE_CACHE", str(d))
    old = os.umask(0o002)
    try:
        rule_verdicts.put(b"{}", "refused for a test")
    finally:
        os.umask(old)
    assert d.stat().st_mode & 0o777 == 0o700
    assert all(f.stat().st_mode & 0o022 == 0 for f in d.iterdir())
    assert rule_verdicts.get(b"{}") == "refused for a test"
