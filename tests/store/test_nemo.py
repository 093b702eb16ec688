"""--format nemo: Megatron-Bridge's packed fine-tuning collate, applied to the Parquet files packer wrote,
trains the (context, target) pairs, positions and boundaries of packer's own items; packer reads the
files back (open_dataset, verify, streamed) and refuses them edited; builds count the documents holding
EOS inside them, and a nemo build says what NeMo does with those."""

from __future__ import annotations

import json
import random
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLE, TOKENIZER

from packer.config import BuildConfig, Job
from packer.preprocess.pipeline import build
from packer.store import checksums, formats
from packer.store.dataset import open_dataset
from packer.store.verify import verify_dataset

CONTEXT = 128
EOS_TEXT = "<|endoftext|>"


# -- Megatron-Bridge's packed dataset, written from its documented behaviour --------------------------------
#
# Megatron-Bridge v0.6.0 (2026-08-19): src/megatron/bridge/data/packing/parquet.py GPTSFTPackedParquetDataset
# (a directory spec reads every *.parquet / *.pq in it, sorted by name; columns input_ids, seq_start_id,
# loss_mask; __getitem__ gives seq_boundaries = seq_start_id + [len(input_ids)]) and packing/gpt_sft.py
# GPTSFTPackedDataset.collate_fn with its defaults (return_cu_seqlen=True, pad_to_max_length=False,
# pad_seq_to_mult=1, pad_cu_seqlens=False; pad_seq_length_to_mult=16 from GPTSFTDataset).


def mb_items(directory) -> list[dict]:
    files = sorted([*directory.glob("*.parquet"), *directory.glob("*.pq")])
    out = []
    for file in files:
        table = pq.read_table(file, columns=["input_ids", "seq_start_id", "loss_mask"]).to_pylist()
        out += [{"input_ids": r["input_ids"], "seq_boundaries": r["seq_start_id"] + [len(r["input_ids"])],
                 "loss_mask": r["loss_mask"]} for r in table]
    return out


def mb_collate(batch: list[dict], eos_id: int, max_seq_length: int, *, answer_only_loss: bool = True,
               pad_seq_length_to_mult: int = 16) -> dict:
    """Each segment [b, e) of a row gives inputs ids[b:e-1], labels ids[b+1:e], positions 0..e-b-2 and
    loss_mask[b:e-1] (answer_only_loss; else 0 where the input is EOS, 1 elsewhere); rows padded with
    EOS (labels EOS, loss 0, positions 0) to the longest row rounded up to pad_seq_length_to_mult; the
    loss mask then 0 wherever the input token is EOS; cu_seqlens per row, the padded length appended
    when the row is shorter, every row's extended by repeating its last entry to the longest."""
    def segments(item):
        b = item["seq_boundaries"]
        return list(zip(b[:-1], b[1:]))

    inputs = [np.concatenate([item["input_ids"][b:e - 1] for b, e in segments(item)]) for item in batch]
    labels = [np.concatenate([item["input_ids"][b + 1:e] for b, e in segments(item)]) for item in batch]
    if answer_only_loss:
        masks = [np.concatenate([item["loss_mask"][b:e - 1] for b, e in segments(item)]) for item in batch]
    else:
        masks = [np.concatenate([[0 if x == eos_id else 1 for x in item["input_ids"][b:e - 1]]
                                 for b, e in segments(item)]) for item in batch]
    longest = max(len(x) for x in inputs)
    max_length = min(max_seq_length, -(-longest // pad_seq_length_to_mult) * pad_seq_length_to_mult)
    positions, cu_seqlens = [], []
    for item in batch:
        lengths = [e - b for b, e in segments(item)]
        positions.append(np.concatenate([np.arange(n - 1) for n in lengths]))
        cu = [0] + np.cumsum([n - 1 for n in lengths]).tolist()
        cu_seqlens.append(cu + [max_length] * (cu[-1] != max_length))
    width = max(len(c) for c in cu_seqlens)
    cu_seqlens = [c + [c[-1]] * (width - len(c)) for c in cu_seqlens]

    def pad(rows, value):
        return np.stack([np.concatenate([r, np.full(max_length - len(r), value, np.int64)]).astype(np.int64)
                         for r in rows])

    tokens, loss_mask = pad(inputs, eos_id), pad(masks, 0)
    loss_mask[tokens == eos_id] = 0
    cu = np.asarray(cu_seqlens, np.int32)
    return {"tokens": tokens, "labels": pad(labels, eos_id), "loss_mask": loss_mask,
            "position_ids": pad(positions, 0), "cu_seqlens_q": cu, "max_seqlen_q": np.diff(cu, axis=1).max(axis=1)}


def megatron_bridge_sft(monkeypatch):
    """Megatron-Bridge's own sft module (GPTSFTPackedDataset), loaded alone: the package's __init__ imports
    Transformer Engine (a GPU build), so its parent packages are bare namespaces here. Releases from 0.4 need
    Python >= 3.12; 0.3.1 installs on 3.11 (`pip install --no-deps megatron-bridge==0.3.1`)."""
    import importlib
    import importlib.util
    import sys
    import types

    try:
        spec = importlib.util.find_spec("megatron.bridge")
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-bridge is not installed (from 0.4 it needs Python >= 3.12; 0.3.1 installs with --no-deps)")
    root = list(spec.submodule_search_locations)[0]
    for name in ("", ".data", ".data.datasets", ".training", ".training.tokenizers"):
        module = types.ModuleType("megatron.bridge" + name)
        module.__path__ = [root + name.replace(".", "/")]
        monkeypatch.setitem(sys.modules, "megatron.bridge" + name, module)
    try:
        return importlib.import_module("megatron.bridge.data.datasets.sft")
    except ImportError as e:
        pytest.skip(f"Megatron-Bridge's sft module does not import here: {e}")


# -- builds --------------------------------------------------------------------------------------------------


def _build(out, source, **config):
    build(Job(inputs=(str(source),), tokenizer=TOKENIZER, output=str(out), workers=1,
              config=BuildConfig(context_length=CONTEXT, format="nemo", **config)), progress="off")
    return out


@pytest.fixture(scope="module")
def text_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("nemo-text")
    with open(SAMPLE / "prose.jsonl", encoding="utf-8") as f:
        (root / "prose.jsonl").write_text("".join(next(f) for _ in range(12)), encoding="utf-8")
    return _build(root / "ds", root / "prose.jsonl", shard_size=1_000)


@pytest.fixture(scope="module")
def chat_build(tmp_path_factory):
    from packer.store.formats import nemo

    with pytest.warns(UserWarning, match="documents hold the EOS id 0 inside them") as said, pytest.MonkeyPatch.context() as mp:
        mp.setattr(nemo, "ROW_GROUP_ROWS", 64)  # several row groups: several blocks
        out = _build(tmp_path_factory.mktemp("nemo-chat") / "ds", SAMPLE / "chat.jsonl", input_kind="chat",
                     store_roles=True)
    assert len([w for w in said if "EOS id" in str(w.message)]) == 1  # one line
    return out


def _pairs_and_checks(out, eos_id: int, **collate):
    """Apply mb_collate to the build's files in batches of 4 rows; check tokens, positions and boundaries
    against packer's items; return (NeMo's trained pairs, packer's trained pairs, packer's pairs whose
    context token is EOS), a pair being (row, segment start, position in segment, target)."""
    from packer.data import PackedDataset

    ours = list(PackedDataset(out, shuffle=False))
    theirs = mb_items(out)
    assert len(theirs) == len(ours) > 8
    nemo_pairs, packer_pairs, eos_context = set(), set(), set()
    for r0 in range(0, len(ours), 4):
        batch = mb_collate(theirs[r0:r0 + 4], eos_id, CONTEXT, **collate)
        for i, item in enumerate(ours[r0:r0 + 4]):
            r, row, labels = r0 + i, item["input_ids"].numpy(), item["labels"].numpy()
            cu = item["cu_seqlens"].numpy().astype(np.int64)
            n_segments, n_real = len(cu) - 1, len(row) - (len(cu) - 1)
            keep = np.concatenate([np.arange(a, b - 1) for a, b in zip(cu[:-1], cu[1:])])  # every token but a last
            assert batch["tokens"][i, :n_real].tolist() == row[keep].tolist()
            assert (batch["tokens"][i, n_real:] == eos_id).all()
            assert batch["position_ids"][i, :n_real].tolist() == item["position_ids"].numpy()[keep].tolist()
            theirs_cu = batch["cu_seqlens_q"][i]
            assert theirs_cu[:n_segments + 1].tolist() == (cu - np.arange(n_segments + 1)).tolist()
            assert (theirs_cu[n_segments + 1:] == batch["tokens"].shape[1]).all()  # padding: its own segment
            segment_of = np.repeat(np.arange(n_segments), np.diff(cu) - 1)
            for p in np.flatnonzero(batch["loss_mask"][i, :n_real]).tolist():
                s = int(segment_of[p])
                k = p - int(theirs_cu[s])
                nemo_pairs.add((r, int(cu[s]), k, int(batch["labels"][i, p])))
            for s in range(n_segments):
                for j in range(int(cu[s]) + 1, int(cu[s + 1])):
                    if labels[j] != -100:
                        pair = (r, int(cu[s]), j - 1 - int(cu[s]), int(labels[j]))
                        packer_pairs.add(pair)
                        if row[j - 1] == eos_id:
                            eos_context.add(pair)
    return nemo_pairs, packer_pairs, eos_context


def test_megatron_bridge_collate_trains_packers_pairs_on_a_text_build(text_build):
    manifest = json.loads((text_build / "manifest.json").read_text())
    eos_id = manifest["config"]["eos_id"]
    assert len(manifest["shards"]) > 1 and manifest["totals"]["docs_inner_eos"] == 0
    for answer_only_loss in (True, False):
        nemo, ours, eos_context = _pairs_and_checks(text_build, eos_id, answer_only_loss=answer_only_loss)
        assert nemo == ours and not eos_context and len(ours) == manifest["totals"]["tokens_out"] - \
            manifest["totals"]["pieces"]  # a text build trains every pair inside a piece


def test_megatron_bridge_collate_trains_packers_pairs_on_a_chat_build_but_after_an_inner_eos(chat_build):
    """Exact but where NeMo's collate zeroes the loss of a pair whose input token is EOS: the
    sample template ends every message with EOS then a newline, which packer trains and NeMo does not."""
    manifest = json.loads((chat_build / "manifest.json").read_text())
    totals = manifest["totals"]
    nemo, ours, eos_context = _pairs_and_checks(chat_build, manifest["config"]["eos_id"])
    assert pq.ParquetFile(chat_build / manifest["shards"][0]["file"]).metadata.num_row_groups > 2
    assert nemo == ours - eos_context and eos_context and len(ours) < totals["trained_tokens"]
    assert totals["docs_inner_eos"] == totals["docs_accepted"]  # every conversation: messages end "<eos>\n"


@pytest.mark.parametrize("which", ["text_build", "chat_build"])
def test_nemo_columns_are_packers_items(which, request):
    """The columns as written, against packer's items: input_ids the row, seq_start_id its documents' starts, and
    loss_mask[j] = 1 exactly where the pair (input_ids[j] -> input_ids[j + 1]) trains, i.e. packer's label at j + 1
    is set: 0 at each document's last token and the row's end (a reader without cu_seqlens, which treats the row as
    one sequence, trains no pair across a boundary)."""
    from packer.data import PackedDataset

    out = request.getfixturevalue(which)
    items = list(PackedDataset(out, shuffle=False))
    rows = [r for file in sorted(out.glob("*.idx.parquet")) for r in pq.read_table(file).to_pylist()]
    assert len(rows) == len(items)
    n_ends = 0
    for row, item in zip(rows, items):
        labels = item["labels"].tolist()
        assert row["input_ids"] == item["input_ids"].tolist()
        assert row["seq_start_id"] == item["cu_seqlens"][:-1].tolist()
        assert row["loss_mask"] == [int(j + 1 < len(labels) and labels[j + 1] != -100) for j in range(len(labels))]
        n_ends += len(row["seq_start_id"]) > 1
    assert n_ends >= 3  # rows of several documents: boundaries inside rows exercised


def test_the_reference_collate_is_megatron_bridges_own(chat_build, tmp_path, monkeypatch):
    """Where Megatron-Bridge imports (0.3.1: GPTSFTPackedDataset over the legacy .npy of the same row dicts,
    the collate v0.6.0 keeps for pad_seq_to_mult=1 but for padding cu_seqlens with -1 instead of repeats),
    its own __getitem__ and collate_fn give what mb_collate gives on the files packer wrote."""
    sft = megatron_bridge_sft(monkeypatch)
    rows = []
    for file in sorted(chat_build.glob("*.parquet")):
        rows += pq.read_table(file, columns=["input_ids", "seq_start_id", "loss_mask"]).to_pylist()
    np.save(tmp_path / "packed.npy", np.array(rows, dtype=object), allow_pickle=True)
    eos_id = json.loads((chat_build / "manifest.json").read_text())["config"]["eos_id"]
    tokenizer = types.SimpleNamespace(eos_id=eos_id)
    theirs = sft.GPTSFTPackedDataset(str(tmp_path / "packed.npy"), tokenizer, max_seq_length=CONTEXT,
                                     prompt_template="{input} {output}", label_key="output", truncation_field="input")
    ours = mb_items(chat_build)
    assert len(theirs) == len(ours)
    for r0 in range(0, len(ours), 7):
        got = theirs.collate_fn([theirs[i] for i in range(r0, min(r0 + 7, len(ours)))])
        want = mb_collate(ours[r0:r0 + 7], eos_id, CONTEXT)
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert got[key].numpy().tolist() == want[key].tolist(), key
        for cu, ref in zip(got["cu_seqlens"].numpy(), want["cu_seqlens_q"]):
            n = int(np.argmin(cu))  # its first -1
            assert cu[:n].tolist() == ref[:n].tolist() and (ref[n:] == ref[n - 1]).all()


def test_nemo_files_read_back_as_packers_rows(chat_build, tmp_path):
    """open_dataset and verify read the Parquet files; the rows (masks, roles, doc ids) equal a memmap
    build's of the same inputs."""
    reference = build(Job(inputs=(str(SAMPLE / "chat.jsonl"),), tokenizer=TOKENIZER, output=str(tmp_path / "mm"),
                          workers=1, config=BuildConfig(context_length=CONTEXT, format="memmap", input_kind="chat",
                                                        store_roles=True)), progress="off")
    got, want = open_dataset(chat_build), open_dataset(tmp_path / "mm")
    assert verify_dataset(chat_build)["sequences"] == reference["totals"]["sequences"] == len(got) == len(want)
    rows = range(len(want))
    assert all(np.array_equal(a, b) for x, y in zip(got.views(rows), want.views(rows)) for a, b in zip(x, y))
    assert all(np.array_equal(a, b) for a, b in zip(got.mask_views(rows), want.mask_views(rows)))
    assert got.has_role_ids and all(np.array_equal(a, b) for a, b in zip(got.role_views(rows), want.role_views(rows)))
    assert np.array_equal(got.doc_ids(), want.doc_ids())


def test_nemo_shards_are_the_same_bytes_at_any_worker_count(tmp_path):
    def shards(workers):
        out = tmp_path / f"w{workers}"
        with pytest.warns(UserWarning, match="hold the EOS id"):
            build(Job(inputs=(str(SAMPLE / "chat.jsonl"),), tokenizer=TOKENIZER, output=str(out), workers=workers,
                      config=BuildConfig(context_length=CONTEXT, format="nemo", input_kind="chat", unit_bytes=20_000,
                                         shard_size=10_000)), progress="off")
        return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}

    one = shards(1)
    assert len(one) > 4 and one == shards(2)


def _rewrite(path, column: str, change):
    """The shard rewritten by pyarrow with `column`'s values changed (a valid Parquet file, other bytes)."""
    table = pq.read_table(path)
    values = table.column(column).combine_chunks()
    flat = change(values.values.to_numpy(zero_copy_only=False).copy())
    table = table.set_column(table.column_names.index(column), column,
                             pa.ListArray.from_arrays(values.offsets, pa.array(flat, values.type.value_type)))
    pq.write_table(table, path, row_group_size=512, write_statistics=False)


def test_an_edited_shard_is_refused(chat_build, tmp_path):
    import shutil

    out = tmp_path / "ds"
    shutil.copytree(chat_build, out)
    shard = out / json.loads((out / "manifest.json").read_text())["shards"][0]["file"]
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 1  # inside row group 0
    shard.write_bytes(bytes(raw))
    with pytest.raises(checksums.ChecksumError):
        open_dataset(out)
    _rewrite(shard, "loss_mask", lambda m: 1 - m)  # NeMo's mask no longer packer's moved left by one
    with pytest.raises(ValueError, match="column loss_mask is not packer's loss mask moved left by one"):
        verify_dataset(out, checksums=False)


def test_nemo_shards_stream_by_row_group(chat_build, s3_uri):
    from packer.io import fs

    uri = s3_uri("nemo/chat")
    for file in sorted(chat_build.iterdir()):
        fs.upload(file, fs.location(uri) / file.name)
    got, want = open_dataset(uri, memory_bytes=1 << 20), open_dataset(chat_build)
    rows = list(range(len(want)))[::-1]
    assert type(got).__name__ == "StreamDataset" and len(got) == len(want)
    assert all(np.array_equal(a, b) for x, y in zip(got.views(rows), want.views(rows)) for a, b in zip(x, y))
    assert all(np.array_equal(a, b) for a, b in zip(got.mask_views(rows), want.mask_views(rows)))


# -- documents holding EOS inside them, counted by every build --------------------------------------------


def test_every_build_counts_documents_holding_eos_inside_them(tmp_path):
    """Pre-tokenized records with EOS planted inside some, at the end of others: the count is the
    reference's, at 1 and 2 workers, in any format; `packer inspect` shows it."""
    from click.testing import CliRunner

    from packer.cli import main

    rng, eos = random.Random(5), 0
    records, inner = [], 0
    for _ in range(300):
        ids = [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 40))]
        for _ in range(rng.choice([0, 0, 1, 2])):
            ids[rng.randrange(len(ids))] = eos
        if rng.random() < 0.3:
            ids.append(eos)  # at the end: not inside
        inner += eos in ids[:-1]
        records.append({"input_ids": ids, "loss_mask": [1] * len(ids)})
    source = tmp_path / "t.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert 0 < inner < len(records)
    counts = []
    for fmt, workers in (("arrow", 1), ("memmap", 2)):
        out = tmp_path / f"{fmt}-{workers}"
        manifest = build(Job(inputs=(str(source),), tokenizer=TOKENIZER, output=str(out), workers=workers,
                             config=BuildConfig(context_length=32, format=fmt, input_kind="tokens",
                                                unit_bytes=4096)), progress="off")
        counts.append(manifest["totals"]["docs_inner_eos"])
    assert counts == [inner, inner]
    shown = CliRunner().invoke(main, ["inspect", str(tmp_path / "arrow-1")])
    assert shown.exit_code == 0 and f"eos:       {inner:,} documents hold the EOS id {eos} inside them" in shown.output


def test_inner_eos_counts_documents_spread_over_parts():
    """The tokenize stage's parts (whole documents in batches, a long one over several parts with its length
    on its last) against the count over whole documents."""
    from packer.preprocess.inner_eos import InnerEos

    rng = np.random.default_rng(0)
    exercised = 0
    for _ in range(500):
        docs = [rng.integers(0, 3, int(n)) for n in rng.integers(0, 7, rng.integers(1, 8))]
        counter, d = InnerEos(0), 0
        while d < len(docs):
            if rng.random() < 0.5:  # a batch of whole documents
                e = d + int(rng.integers(1, 3))
                counter.add(np.concatenate([np.zeros(0, np.int64), *docs[d:e]]), np.array([len(x) for x in docs[d:e]]))
                d = e
                continue
            parts = np.split(docs[d], np.sort(rng.integers(0, len(docs[d]) + 1, int(rng.integers(1, 3)))))
            for part in parts[:-1]:
                counter.add(part, np.zeros(0, np.int64))
            counter.add(parts[-1], np.array([len(docs[d])]))
            exercised += len(parts) > 1 and (docs[d][:-1] == 0).any()
            d += 1
        assert counter.docs == sum(bool((x[:-1] == 0).any()) for x in docs)
    assert exercised > 50


def test_a_text_with_the_eos_string_keeps_it_as_text(tmp_path):
    """Special-token strings in text are text (the exact-tokens invariant): a text build's documents hold
    EOS only as their last token, whatever they say."""
    source = tmp_path / "t.jsonl"
    source.write_text("".join(json.dumps({"text": f"doc {i} says {EOS_TEXT} twice {EOS_TEXT}."}) + "\n"
                              for i in range(20)), encoding="utf-8")
    manifest = build(Job(inputs=(str(source),), tokenizer=TOKENIZER, output=str(tmp_path / "out"), workers=1,
                         config=BuildConfig(context_length=64)), progress="off")
    assert manifest["totals"]["docs_inner_eos"] == 0 and manifest["totals"]["docs_accepted"] == 20
    assert formats.build_notes("nemo", manifest) == [] and formats.build_notes("arrow", manifest) == []
