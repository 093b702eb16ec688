"""Online packing of chat records with ItemFields(role_ids=True): every emitted piece's role ids equal what a build with
--store-roles stores for it, carried pieces keep theirs through state_dict / load_state_dict, padding has
masks.PAD_ROLE."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import SAMPLE, TOKENIZER  # noqa: E402

from packer.config import BuildConfig, Job, role_table  # noqa: E402
from packer.data import ItemFields  # noqa: E402
from packer.masks import PAD_ROLE  # noqa: E402
from packer.preprocess.pipeline import build  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.train.online import OnlinePackedDataset  # noqa: E402


def _records(n: int) -> list[dict]:
    with open(SAMPLE / "chat.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f][:n]


def _segments(items) -> collections.Counter:
    """(ids, role ids) of every segment of the items, the padding segment left out."""
    out = collections.Counter()
    for item in items:
        cu, ids, roles = item["cu_seqlens"].tolist(), item["input_ids"].tolist(), item["role_ids"].tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            if set(roles[a:b]) != {PAD_ROLE}:
                out[tuple(ids[a:b]), tuple(roles[a:b])] += 1
    return out


def test_every_piece_has_the_role_ids_the_build_stores(tmp_path):
    records = _records(60)
    source = tmp_path / "chat.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "ds"
    build(Job(inputs=(str(source),), tokenizer=TOKENIZER, output=str(out), workers=1,
              config=BuildConfig(context_length=128, input_kind="chat", store_roles=True)), progress="off")
    ds = open_dataset(out)
    rows = range(len(ds))
    (tokens, offsets), roles = ds.views(rows), ds.role_views(rows)
    stored = collections.Counter((tuple(t[a:b].tolist()), tuple(r[a:b].tolist()))
                                 for t, o, r in zip(tokens, offsets, roles) for a, b in zip(o[:-1], o[1:]))
    online = OnlinePackedDataset(records, tokenizer=TOKENIZER, config=BuildConfig(context_length=128, input_kind="chat"),
                                 fields=ItemFields(pad_to=128, role_ids=True), buffer_docs=16)
    assert online.roles == role_table()
    items = list(online)
    assert _segments(items) == stored and sum(stored.values()) > len(records)  # split pieces among them
    assert any((item["role_ids"] == PAD_ROLE).any() for item in items)


def test_resume_keeps_the_carried_pieces_roles():
    records = _records(50)
    config = BuildConfig(context_length=256, input_kind="chat", seed=1)
    make = lambda: OnlinePackedDataset(records, tokenizer=TOKENIZER, config=config, buffer_docs=7,  # noqa: E731
                                       fields=ItemFields(role_ids=True))
    full = [(i["input_ids"].tolist(), i["role_ids"].tolist()) for i in make()]
    carried = 0
    for stop in (1, 3, len(full) // 2, len(full) - 1):
        first = make()
        it = iter(first)
        head = [(i["input_ids"].tolist(), i["role_ids"].tolist()) for i in (next(it) for _ in range(stop))]
        state = json.loads(json.dumps(first.state_dict()))
        assert len(state["carry_roles"]) == len(state["carry"])
        carried += bool(state["carry"])
        second = make()
        second.load_state_dict(state)
        assert head + [(i["input_ids"].tolist(), i["role_ids"].tolist()) for i in second] == full, stop
    assert carried
    with pytest.raises(ValueError, match="store_roles"):
        OnlinePackedDataset(records, tokenizer=TOKENIZER, config=config, buffer_docs=7).load_state_dict(state)
    with pytest.raises(ValueError, match=r"ItemFields\(role_ids=True\) gives the roles of chat messages"):
        OnlinePackedDataset(records, tokenizer=TOKENIZER, config=BuildConfig(context_length=256),
                            fields=ItemFields(role_ids=True))
    assert np.array_equal(np.unique(np.concatenate([np.array(r) for _, r in full])), [0, 1, 2])
