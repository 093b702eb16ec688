"""The rule's verdicts kept on disk (packer/encode/engines/rule_verdicts.py): a tokenizer checked once is not
checked again, under the file's sha256; a changed file, another rule or a lost verdict is checked afresh,
and the directory never changes a choice."""

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


def _fresh(monkeypatch):
    monkeypatch.setattr(byte_level, "_RANKED", {})


def test_a_verdict_is_kept_and_spares_the_next_build_its_check(tmp_path, verdicts, monkeypatch):
    d, checked = verdicts
    path = _write(tmp_path, _tiny(*PASSES))
    first = byte_level.ranked_vocab_at(path)
    assert checked == [1] and [json.loads(f.read_text()) for f in d.iterdir()] == [{"refused": ""}]
    _fresh(monkeypatch)
    again = byte_level.ranked_vocab_at(path)
    assert checked == [1]  # (S) not run again
    assert again.ranks == first.ranks and np.array_equal(again.ids, first.ids) and again.pattern == first.pattern


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
    assert checked == [1, 1, 1] and len(list(d.iterdir())) == 3
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
    for damage in (b"", b"{", b'{"refused": 3}', b"[]"):
        kept.write_bytes(damage)
        _fresh(monkeypatch)
        assert isinstance(byte_level.ranked_vocab_at(path), str)  # checked again: still refused
    assert checked == [1] * 5 and json.loads(kept.read_text())["refused"]


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
