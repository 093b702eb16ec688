"""The optional fields (packer/store/rows.py EXTRAS): per-token loss masks and per-segment source ids,
written by every format only when present, gathered by the writer from the unit files exactly as the
tokens are, read back by open_dataset and checked by it and by verify."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from packer.config import BuildConfig, Job
from packer.preprocess.plan import Plan
from packer.preprocess.plan_groups import INDEX, PLAN_DIR, PlanIndex
from packer.preprocess.writer import write_rows, write_shard
from packer.store import formats
from packer.store.dataset import open_dataset
from packer.store.formats import FORMATS
from packer.store.rows import ROWS_PER_BATCH, Layout
from packer.store.verify import verify_dataset

SAMPLE = "sample_data"


def _random_layout(rng, n_rows: int):
    n_segments = rng.integers(1, 5, n_rows)
    lengths = rng.integers(1, 10, int(n_segments.sum()))
    offsets, token_starts, s = [], [0], 0
    for n in n_segments.tolist():
        row = lengths[s : s + n]
        offsets += [0, *np.cumsum(row).tolist()]
        token_starts.append(token_starts[-1] + int(row.sum()))
        s += n
    offset_starts = np.concatenate([[0], np.cumsum(n_segments + 1)]).astype(np.int64)
    doc_ids = np.arange(len(lengths), dtype=np.int64)
    sources = rng.integers(0, 3, len(lengths)).astype(np.uint16)
    layout = Layout(np.array(token_starts, np.int64), np.array(offsets, np.int32), offset_starts, doc_ids, sources)
    tokens = (np.arange(token_starts[-1]) % 30000).astype(np.uint16)
    mask = rng.integers(0, 2, len(tokens)).astype(np.uint8)
    return layout, tokens, mask


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n_rows", [0, 3, ROWS_PER_BATCH + 5])
def test_every_format_round_trips_masks_and_sources(tmp_path, fmt, n_rows):
    layout, tokens, mask = _random_layout(np.random.default_rng(n_rows), n_rows)
    ts = layout.token_starts
    entry = write_rows(layout, lambda r0, r1: (tokens[ts[r0] : ts[r1]].copy(), mask[ts[r0] : ts[r1]].copy()),
                       tmp_path, 2, fmt, loss_mask=True)
    names = [name for name, _ in formats.entry_files(fmt, entry)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    if FORMATS[fmt].EXTRA_FILES:  # sidecars, named in the entry (arrow, nemo: columns)
        assert {"loss_mask_file", "source_ids_file"} <= set(entry)
        assert "shard-00002.loss_mask.bin" in names and "shard-00002.source_ids.npy" in names
    got_mask, got_sources, got_tokens = [], [], []
    for rows, doc_ids in formats.shard_blocks(tmp_path, entry, fmt):
        got_tokens += rows.tokens[rows.token_starts[0] : rows.token_starts[-1]].tolist()
        got_mask += rows.loss_mask[rows.token_starts[0] : rows.token_starts[-1]].tolist()
        got_sources += rows.source_ids.tolist()
        assert len(rows.source_ids) == len(doc_ids)
    assert got_tokens == tokens.tolist() and got_mask == mask.tolist() and got_sources == layout.source_ids.tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_without_extras_a_shard_has_neither(tmp_path, fmt):
    layout, tokens, _ = _random_layout(np.random.default_rng(0), 5)
    layout = Layout(*layout[:4])  # no source_ids
    ts = layout.token_starts
    entry = write_rows(layout, lambda r0, r1: tokens[ts[r0] : ts[r1]].copy(), tmp_path, 0, fmt)
    assert list(entry) == [k for n, s, _ in [*formats.file_names(fmt, 0), formats.CHECKSUMS] for k in (n, s)]
    for rows, _ in formats.shard_blocks(tmp_path, entry, fmt):
        assert rows.loss_mask is None and rows.source_ids is None


def _build(tmp_path, fmt):
    import packer

    job = Job(inputs=(f"{SAMPLE}/prose.jsonl", f"{SAMPLE}/code.jsonl"), tokenizer=f"{SAMPLE}/tokenizer.json",
              output=str(tmp_path / fmt), config=BuildConfig(context_length=256, format=fmt, shard_size=20000,
                                                              unit_bytes=200_000), workers=1)
    packer.build(job, keep_work=True, progress="off")
    return tmp_path / fmt


def _plan_path(work, k: int):
    """Shard k's own plan file (packer/preprocess/plan_groups.py)."""
    return PlanIndex.load(work / INDEX).shard_path(work / PLAN_DIR, k)


def _whole_plan(work):
    """The shards' plans laid end to end: row s's pieces are seq_starts[s]:seq_starts[s+1]."""
    parts = [Plan.load(_plan_path(work, k)) for k in range(PlanIndex.load(work / INDEX).n_shards)]
    seq_starts = np.concatenate([[0]] + [p.seq_starts[1:] + base for p, base in
                                         zip(parts, np.cumsum([0] + [len(p.piece_len) for p in parts]))])
    cat = {k: np.concatenate([getattr(p, k) for p in parts]) for k in ("piece_unit", "piece_start", "piece_len")}
    return types.SimpleNamespace(seq_starts=seq_starts.astype(np.int64), **cat)


def _rewrite_with_extras(out, fmt, rng):
    """Give every unit a random loss mask (unit 0 none: all trained), every unit a source, and write
    the shards again with them, as a build with masks and sources would; returns (masks, unit_sources)."""
    manifest = json.loads((out / "manifest.json").read_text())
    units = out / "_work" / "units"
    n_units = len(list(units.glob("unit-*.tokens.npy")))
    masks = {}
    for u in range(n_units):
        n = len(np.load(units / f"unit-{u:06d}.tokens.npy"))
        masks[u] = np.ones(n, np.uint8) if u == 0 else rng.integers(0, 2, n).astype(np.uint8)
        if u:
            np.save(units / f"unit-{u:06d}.loss_mask.npy", masks[u])
    unit_sources = tuple(int(x) for x in rng.integers(0, 2, n_units))
    for p in (out / "_work" / "shards").glob("*.json"):
        p.unlink()
    for p in out.glob("shard-*"):
        p.unlink()
    entries = [write_shard(_plan_path(out / "_work", k), k, out / "_work", out,
                           manifest["config"]["token_dtype"], fmt, loss_mask=True, unit_sources=unit_sources)
               for k in range(len(manifest["shards"]))]
    for old, new in zip(manifest["shards"], entries):
        assert {k: old[k] for k in ("sequences", "tokens", "documents")} == {k: new[k] for k in ("sequences", "tokens", "documents")}
    manifest["shards"] = entries
    manifest["sources"] = [{"name": "prose"}, {"name": "code"}]
    for name, data in formats.derived_files(fmt, entries).items():  # arrow's name the shards' sha256
        (out / name).write_bytes(data)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return masks, unit_sources


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_writer_gathers_masks_and_sources_and_the_reader_returns_them(tmp_path, fmt):
    out = _build(tmp_path, fmt)
    masks, unit_sources = _rewrite_with_extras(out, fmt, np.random.default_rng(1))
    plan = _whole_plan(out / "_work")
    ds = open_dataset(out)
    assert ds.has_loss_mask and ds.has_source_ids and ds.source_names == ["prose", "code"]
    rows = np.arange(len(ds))[::-1]
    got_masks, got_sources = ds.mask_views(rows), ds.source_views(rows)
    for k, s in enumerate(rows.tolist()):  # reference: the plan's pieces of row s, cut from the unit masks
        p0, p1 = plan.seq_starts[s], plan.seq_starts[s + 1]
        want = np.concatenate([masks[u][a : a + n] for u, a, n in
                               zip(plan.piece_unit[p0:p1], plan.piece_start[p0:p1], plan.piece_len[p0:p1])])
        assert got_masks[k].tolist() == want.tolist()
        assert got_sources[k].tolist() == [unit_sources[u] for u in plan.piece_unit[p0:p1]]
    batch = ds.get_many(rows[:7])
    assert batch.loss_mask.tolist() == np.concatenate(got_masks[:7]).tolist()
    assert batch.source_ids.tolist() == np.concatenate(got_sources[:7]).tolist()
    verify_dataset(out)


def test_reading_refuses_a_bad_mask_value_and_a_source_outside_the_manifest(tmp_path):
    out = _build(tmp_path, "memmap")
    _rewrite_with_extras(out, "memmap", np.random.default_rng(2))
    mask_file = out / "shard-00000.loss_mask.bin"
    data = bytearray(mask_file.read_bytes())
    data[3] = 2
    mask_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256 does not match"):
        verify_dataset(out)
    with pytest.raises(ValueError, match=r"loss_mask\.bin bytes 0-\d+: checksum mismatch"):  # before its values
        open_dataset(out).mask_views([0])
    with pytest.raises(ValueError, match="loss mask value 2"):
        verify_dataset(out, checksums=False)
    data[3] = 1
    mask_file.write_bytes(bytes(data))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["sources"] = manifest["sources"][:1]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="source id 1, but the manifest names 1 sources"):
        verify_dataset(out, checksums=False)


def test_shards_with_and_without_masks_do_not_mix(tmp_path):
    out = _build(tmp_path, "memmap")
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["shards"]) > 1
    first = dict(manifest["shards"][0])
    _rewrite_with_extras(out, "memmap", np.random.default_rng(3))
    manifest = json.loads((out / "manifest.json").read_text())
    plain = write_shard(_plan_path(out / "_work", 0), 0, out / "_work", tmp_path, manifest["config"]["token_dtype"],
                        "memmap")  # shard 0 again, without extras, beside the dataset
    for key in ("file", "index_file", "checksums_file"):
        (out / plain[key]).write_bytes((tmp_path / plain[key]).read_bytes())
    manifest["shards"][0] = {**first, **plain}
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="lacks loss_mask, unlike the dataset's first shard|has loss_mask, unlike"):
        open_dataset(out)
