"""Chat builds with store_roles: role ids stored beside the tokens in every format (split pieces keep their
part), listed in the manifest, checked by verify and open_dataset, read back locally and streamed, shown by
`packer inspect` and drawn by `packer show-mask --policy`; without store_roles nothing of it is written."""

from __future__ import annotations

import collections
import json
import uuid

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SAMPLE, TOKENIZER, attest

from packer.binpack import split_documents
from packer.cli import main
from packer.config import BuildConfig, Job, role_table
from packer.encode.records import RecordEncoder
from packer.encode.text import encode_texts
from packer.encode.tokenizer import tokenizer_info
from packer.io import fs
from packer.preprocess.pipeline import build
from packer.store.dataset import open_dataset
from packer.store.verify import verify_dataset

ROLES = role_table()


def _records(n=None) -> list[dict]:
    with open(SAMPLE / "chat.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f][:n]


def _encoder(**config):
    config = BuildConfig(input_kind="chat", store_roles=True, **config)
    return RecordEncoder("chat", tokenizer_info(TOKENIZER, config), config, encode_texts)


class _Skips(collections.Counter):
    def add(self, reason, where):
        self[reason] += 1


def _build(out, fmt="arrow", context_length=128, **config):
    inputs = tmp_input(out)
    build(Job(inputs=(inputs,), tokenizer=TOKENIZER, output=str(out), workers=1,
              config=BuildConfig(context_length=context_length, format=fmt, input_kind="chat", **config)),
          progress="off")
    return out


def tmp_input(out) -> str:
    path = out.parent / f"{out.name}-chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _records(80)), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("fmt", ["arrow", "memmap", "megatron"])
def test_stored_pieces_keep_their_part_of_their_conversation_roles(tmp_path, fmt):
    """Every stored piece's role ids are its slice of its conversation's (split at the context of 128)."""
    out = _build(tmp_path / "ds", fmt, store_roles=True)
    verify_dataset(out)
    encoded = _encoder(context_length=128).encode([(f"r{k}", r) for k, r in enumerate(_records(80))], _Skips())
    starts = np.concatenate([[0], np.cumsum(encoded.lengths)])
    piece_doc, piece_offset, piece_len = split_documents(encoded.lengths, 128)
    want = collections.Counter()
    for d, o, n in zip(piece_doc.tolist(), piece_offset.tolist(), piece_len.tolist()):
        a = starts[d] + o
        want[d, tuple(encoded.ids[a:a + n].tolist()), tuple(encoded.roles[a:a + n].tolist())] += 1
    ds = open_dataset(out)
    assert ds.has_role_ids and ds.roles == ROLES and ds.manifest["config"]["store_roles"] is True
    rows = range(len(ds))
    (tokens, offsets), roles, doc_ids = ds.views(rows), ds.role_views(rows), ds.doc_ids()
    got, segment = collections.Counter(), 0
    for t, o, r in zip(tokens, offsets, roles):
        for a, b in zip(o[:-1].tolist(), o[1:].tolist()):
            got[int(doc_ids[segment]), tuple(t[a:b].tolist()), tuple(r[a:b].tolist())] += 1
            segment += 1
    assert got == want and len(piece_doc) > len(encoded.lengths) + 20  # many conversations were split
    many = ds.get_many([3, 0])
    np.testing.assert_array_equal(many.role_ids, np.concatenate([roles[3], roles[0]]))


def test_without_store_roles_nothing_of_it_is_written(tmp_path):
    plain, roles = _build(tmp_path / "plain", "memmap"), _build(tmp_path / "roles", "memmap", store_roles=True)
    files = {p.name for p in plain.iterdir()}
    assert {p.name for p in roles.iterdir()} - files == {"shard-00000.role_ids.bin"}
    for name in ("shard-00000.bin", "shard-00000.idx", "shard-00000.loss_mask.bin"):
        assert (plain / name).read_bytes() == (roles / name).read_bytes()
    m_plain, m_roles = (json.loads((d / "manifest.json").read_text()) for d in (plain, roles))
    assert "roles" not in m_plain and "store_roles" not in m_plain["config"] and "role_names" not in m_plain["config"]
    assert m_roles["roles"] == ROLES and m_roles["config"]["role_names"] == "system,user,assistant,tool"
    ds = open_dataset(plain)
    assert not ds.has_role_ids and ds.role_views([0]) is None and ds.roles is None


def test_verify_and_open_refuse_bad_role_ids(tmp_path):
    out = _build(tmp_path / "ds", "memmap", store_roles=True)
    role_file = out / "shard-00000.role_ids.bin"
    data = bytearray(role_file.read_bytes())
    data[17] = 200
    role_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="role id 200, but the manifest's role table has 6 roles"):
        verify_dataset(out, checksums=False)
    with pytest.raises(ValueError, match=r"role_ids\.bin bytes 0-\d+: checksum mismatch"):  # before its values
        open_dataset(out)[0]
    attest(out)  # as a writer that wrote the bad role id, checksums and all: the value check still refuses it
    with pytest.raises(ValueError, match="role id 200"):
        open_dataset(out)[0]
    role_file.write_bytes(bytes(data[:-1]))
    with pytest.raises(ValueError, match=rf"role_ids\.bin: {len(data) - 1} bytes, its checksums file says {len(data)}"):
        open_dataset(out)
    with pytest.raises(ValueError, match="one role byte per token"):  # the length check behind the checksums
        verify_dataset(out, checksums=False)
    manifest = json.loads((out / "manifest.json").read_text())
    for roles, message in (({"system": 0, "user": 2}, "not a table of role names"),
                           (None, "has role ids but the manifest no \"roles\" table")):
        role_file.write_bytes(bytes(data[:17]) + b"\x01" + bytes(data[18:]))
        edited = {**manifest, "roles": roles} if roles else {k: v for k, v in manifest.items() if k != "roles"}
        (out / "manifest.json").write_text(json.dumps(edited))
        with pytest.raises(ValueError, match=message):
            verify_dataset(out, checksums=False)


@pytest.mark.parametrize("fmt", ["arrow", "memmap"])
def test_streamed_role_ids_equal_the_local_ones(tmp_path, fmt):
    out = _build(tmp_path / "ds", fmt, store_roles=True)
    uri = f"memory://packer-roles-{uuid.uuid4().hex}/{fmt}"
    for file in sorted(out.iterdir()):
        fs.upload(file, fs.location(uri) / file.name)
    local, remote = open_dataset(out), open_dataset(uri, block_bytes=4096)
    rows = [5, 0, 9, 5]
    assert remote.has_role_ids and remote.roles == ROLES
    for a, b in zip(local.role_views(rows), remote.role_views(rows)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(local.get_many(rows).role_ids, remote.get_many(rows).role_ids)


def test_cli_builds_inspects_and_draws_roles(tmp_path):
    runner = CliRunner()
    out = tmp_path / "ds"
    args = ["build", tmp_input(out), "--tokenizer", TOKENIZER, "--output", str(out), "--context-length", "256", "-q"]
    refused = runner.invoke(main, args + ["--store-roles"])
    assert refused.exit_code == 1 and "store_roles keeps the roles of chat messages" in refused.output
    assert runner.invoke(main, args + ["--input-kind", "chat", "--store-roles"]).exit_code == 0
    summary = runner.invoke(main, ["inspect", str(out), "--json"])  # the raw manifest
    assert '"roles": {' in summary.output
    shown = runner.invoke(main, ["inspect", str(out), "--seq", "0", "--raw"])
    assert shown.exit_code == 0 and "<system>" in shown.output and "<assistant>" in shown.output
    png = tmp_path / "mask.png"
    drawn = runner.invoke(main, ["show-mask", str(out), "--seq", "0", "--out", str(png), "--policy",
                                 "system=global,user=16,*=none"])
    assert drawn.exit_code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for policy, message in (("usr=16", "'usr', which the role table lacks"), ("user:16", "not ROLE=global")):
        bad = runner.invoke(main, ["show-mask", str(out), "--out", str(png), "--policy", policy])
        assert bad.exit_code != 0 and message in bad.output
