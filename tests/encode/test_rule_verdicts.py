"""The rule's verdicts kept on disk (packer/encode/engines/rule_verdicts.py): a tokenizer checked once is not
checked again, under the file's sha256 (its ranks are made from the file every time: nothing kept
can change an id, tests/encode/test_poisoned_verdicts.py); a changed file, another rule or a lost or
damaged verdict is checked afresh, and the directory never changes a choice."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_engines import _tiny, _write

from packer.encode.engines import byte_level, rule_verdicts

PASSES = [["a", "b"], ["b", "c"], ["ab", "c"]], ["ab", "bc", "abc"]
FAILS_S = [["b", "c"], ["a", "b"], ["ab", "c"]], ["bc", "ab", "abc"]  # (S) breaks: "abc" stays [a, bc]


@pytest.fixture
def verdicts(tmp_path, monkeypatch):
    d = tmp_path / "verdicts"
    monkeypatch.setenv("PACKER_RULE_CACHE", str(d))
    monkeypatch.setattr(byte_level, "_RANKED", {})  # a new process
    checked = []
    real = byte_level._unreachable
    monkeypatch.setattr(byte_level, "_unreachable", lambda *a: checked.append(1) or real(*a))
    return d, checked


def _verdicts(d):
    return [json.loads(f.read_text()) for f in sorted(d.glob("*.json"))]


def _same(a, b):
    return a.ranks == b.ranks and np.array_equal(a.ids, b.ids) and a.pattern == b.pattern and a.nfc == b.nfc


def _fresh(monkeypatch):
    monkeypatch.setattr(byte_level, "_RANKED", {})


def test_a_verdict_is_kept_and_spares_the_next_build_its_check(tmp_path, verdicts, monkeypatch):
    d, checked = verdicts
    path = _write(tmp_path, _tiny(*PASSES))
    first = byte_level.ranked_vocab_at(path)
    assert checked == [1] and _verdicts(d) == [{"refused": ""}] and [f.suffix for f in d.iterdir()] == [".json"]
    _fresh(monkeypatch)
    again = byte_level.ranked_vocab_at(path)
    assert checked == [1]  # (S) not run again; the ranks made from the file again, the same
    assert _same(again, first) and again.ranks is not first.ranks
    _fresh(monkeypatch)
    assert _same(byte_level.ranked_vocab_at(path, check_reach=False), first) and checked == [1]  # a worker too


def test_ranks_made_again_equal_the_first_for_an_nfc_split_tokenizer(tmp_path, verdicts, monkeypatch):
    spec = _tiny(*PASSES)
    spec["normalizer"] = {"type": "NFC"}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": byte_level.SPLIT_REGEXES["qwen2"]}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    path = _write(tmp_path, spec)
    first = byte_level.ranked_vocab_at(path)
    assert first.nfc and first.pattern == byte_level.SPLIT_REGEXES["qwen2"] and len(first.ranks) == 259
    _fresh(monkeypatch)
    assert _same(byte_level.ranked_vocab_at(path), first)


def test_a_refusal_is_kept_with_its_reason(tmp_path, verdicts, monkeypatch):
    d, checked = verdicts
    path = _write(tmp_path, _tiny(*FAILS_S))
    why = byte_level.ranked_vocab_at(path)
    assert isinstance(why, str) and "not what their own merges give" in why and checked == [1]
    _fresh(monkeypatch)
    assert byte_level.ranked_vocab_at(path) == why and checked == [1]


def test_a_changed_file_another_rule_or_tokenizers_release_is_checked_again(tmp_path, verdicts, monkeypatch):
    d, checked = verdicts
    path = _write(tmp_path, _tiny(*PASSES))
    assert not isinstance(byte_level.ranked_vocab_at(path), str)
    changed = _write(tmp_path, _tiny(*FAILS_S), name="changed.json")  # the same names, other merges
    assert isinstance(byte_level.ranked_vocab_at(changed), str) and checked == [1, 1]
    _fresh(monkeypatch)
    monkeypatch.setattr(rule_verdicts, "RULE", rule_verdicts.RULE + 1)
    byte_level.ranked_vocab_at(path)
    assert checked == [1, 1, 1] and len(_verdicts(d)) == 3
    _fresh(monkeypatch)
    import tokenizers

    monkeypatch.setattr(tokenizers, "__version__", "0.0.0-other")
    byte_level.ranked_vocab_at(path)
    assert checked == [1, 1, 1, 1]


def test_a_damaged_verdict_is_checked_again(tmp_path, verdicts, monkeypatch):
    d, checked = verdicts
    path = _write(tmp_path, _tiny(*FAILS_S))
    byte_level.ranked_vocab_at(path)
    (kept,) = d.iterdir()
    for damage in (b"", b"{", b'{"refused": 3}', b"[]", b"\xff\xfe"):
        kept.write_bytes(damage)
        _fresh(monkeypatch)
        assert isinstance(byte_level.ranked_vocab_at(path), str)  # checked again: still refused
    assert checked == [1] * 6 and json.loads(kept.read_text())["refused"]


def test_off_keeps_nothing_and_an_unwritable_directory_is_no_error(tmp_path, verdicts, monkeypatch):
    d, checked = verdicts
    path = _write(tmp_path, _tiny(*PASSES))
    monkeypatch.setenv("PACKER_RULE_CACHE", "off")
    byte_level.ranked_vocab_at(path)
    _fresh(monkeypatch)
    byte_level.ranked_vocab_at(path)
    assert checked == [1, 1] and not d.exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PACKER_RULE_CACHE", str(blocker / "under-a-file"))  # mkdir fails
    _fresh(monkeypatch)
    assert not isinstance(byte_level.ranked_vocab_at(path), str) and checked == [1, 1, 1]


def test_the_default_place_is_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("PACKER_RULE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert rule_verdicts._path(b"{}").parent == tmp_path / "xdg" / "packer" / "engine-rule"
