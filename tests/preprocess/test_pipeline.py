"""End to end on sample_data: conservation, round trip, limits, determinism."""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE_INPUTS, TOKENIZER, build_sample, sample_texts
from tokenizers import Tokenizer

from packer.store.dataset import open_dataset
from packer.store.manifest import read_manifest
from packer.store.verify import verify_dataset


@pytest.fixture(scope="module")
def reference_docs():
    """Each sample document tokenized directly (no packer code), EOS appended."""
    tok = Tokenizer.from_file(TOKENIZER)
    eos = tok.token_to_id("<|endoftext|>")
    return [e.ids + [eos] for e in tok.encode_batch(sample_texts(), add_special_tokens=False)]


def _pieces_by_doc(path):
    ds = open_dataset(path)
    import pyarrow as pa
    import pyarrow.ipc as ipc

    pieces = collections.defaultdict(list)
    for entry in ds.manifest["shards"]:
        table = ipc.open_stream(pa.memory_map(str(path / entry["file"]))).read_all()
        for ids, offs, docs in zip(*(table[c].to_pylist() for c in ("input_ids", "offsets", "doc_ids"))):
            for a, b, d in zip(offs[:-1], offs[1:], docs):
                pieces[d].append(ids[a:b])
    return pieces


def test_build_verifies_and_respects_context(sample_dataset):
    totals = verify_dataset(sample_dataset)
    manifest = read_manifest(sample_dataset)
    assert totals["sequences"] == manifest["totals"]["sequences"] > 0
    assert len(manifest["shards"]) > 1
    ds = open_dataset(sample_dataset)
    n_multi = 0
    for tokens, offsets in ds:
        assert len(tokens) <= 1024
        assert offsets[0] == 0 and offsets[-1] == len(tokens)
        assert np.all(np.diff(offsets) > 0)
        n_multi += len(offsets) > 2
    assert n_multi > 0  # the property was exercised on multi-document rows


def test_every_token_exactly_once(sample_dataset, reference_docs):
    """Each document's tokens (+EOS) appear exactly once: whole in one row, or as its consecutive
    context-sized pieces, each piece contiguous inside one row."""
    pieces = _pieces_by_doc(sample_dataset)
    manifest = read_manifest(sample_dataset)
    assert manifest["totals"]["docs_accepted"] == len(reference_docs)
    assert sorted(pieces) == list(range(len(reference_docs)))
    n_split = 0
    for d, doc in enumerate(reference_docs):
        expected = sorted(tuple(doc[k : k + 1024]) for k in range(0, len(doc), 1024))
        assert sorted(map(tuple, pieces[d])) == expected, f"document {d}"
        n_split += len(expected) > 1
    assert n_split > 0  # some documents really were split
    assert manifest["totals"]["tokens_out"] == sum(map(len, reference_docs))


def test_decoded_pieces_reproduce_source_text(sample_dataset, reference_docs):
    """Decoding a document's stored pieces, in document order, gives back its source text."""
    tok = Tokenizer.from_file(TOKENIZER)
    pieces = _pieces_by_doc(sample_dataset)
    texts = sample_texts()
    checked_split = 0
    for d in range(len(texts)):
        if d % 5 and len(pieces[d]) == 1:
            continue  # every split document, and a fifth of the rest
        # A piece's place in its document: the reference slice it equals.
        slices = [tuple(reference_docs[d][k : k + 1024]) for k in range(0, len(reference_docs[d]), 1024)]
        ordered = sorted(pieces[d], key=lambda p: slices.index(tuple(p)))
        ids = [t for p in ordered for t in p]
        assert tok.decode(ids, skip_special_tokens=True) == texts[d], f"document {d}"
        checked_split += len(ordered) > 1
    assert checked_split > 0


def test_same_seed_same_bytes_any_worker_count(tmp_path, sample_dataset):
    build_sample(tmp_path / "w1", workers=1, shard_size=200_000)
    for entry in read_manifest(sample_dataset)["shards"]:
        a = (tmp_path / "w1" / entry["file"]).read_bytes()
        assert a == (sample_dataset / entry["file"]).read_bytes()
    m1, m2 = read_manifest(tmp_path / "w1"), read_manifest(sample_dataset)
    for key in ("config", "shards", "totals", "tokenizer"):
        assert m1[key] == m2[key]


def test_other_seed_other_order_same_tokens(tmp_path, sample_dataset):
    build_sample(tmp_path / "s1", seed=1, shard_size=200_000)
    a, b = open_dataset(sample_dataset), open_dataset(tmp_path / "s1")
    rows_a = [tuple(t.tolist()) for t, _ in a]
    rows_b = [tuple(t.tolist()) for t, _ in b]
    assert rows_a != rows_b
    assert sorted(rows_a) == sorted(rows_b)  # the same bins, shuffled differently


def test_bins_are_not_length_sorted(sample_dataset):
    fills = np.array([len(t) for t, _ in open_dataset(sample_dataset)])
    # FFD opens bins in decreasing item order, so unshuffled fill would trend; shuffled it does not.
    assert not np.all(np.diff(fills) <= 0)
    assert abs(np.corrcoef(np.arange(len(fills)), fills)[0, 1]) < 0.3


# ---- formats, manifest identity, and what a build does with the directory it finds ----------


def _small_job(tmp_path, out="ds", inputs=None, workers=1, **config):
    from packer.config import BuildConfig, Job

    if inputs is None:
        src = tmp_path / "in.jsonl"
        if not src.exists():
            src.write_text("".join(open(SAMPLE_INPUTS[0], encoding="utf-8").readlines()[:300]), encoding="utf-8")
        inputs = (str(src),)
    return Job(inputs=tuple(inputs), tokenizer=TOKENIZER, output=str(tmp_path / out), workers=workers,
               config=BuildConfig(**{"context_length": 256, "shard_size": 4000, **config}))


def test_memmap_and_arrow_hold_the_same_rows(tmp_path):
    from packer.preprocess.pipeline import build

    a = build(_small_job(tmp_path, "a"))
    m = build(_small_job(tmp_path, "m", format="memmap"))
    assert a["totals"] == m["totals"] and len(a["shards"]) == len(m["shards"]) > 2
    ds_a, ds_m = open_dataset(tmp_path / "a"), open_dataset(tmp_path / "m")
    assert len(ds_a) == len(ds_m) > 0
    for (ta, oa), (tm, om) in zip(ds_a, ds_m):
        assert ta.dtype == tm.dtype == np.uint16 and oa.dtype == om.dtype == np.int32
        assert ta.tolist() == tm.tolist() and oa.tolist() == om.tolist()
    assert verify_dataset(tmp_path / "m") == verify_dataset(tmp_path / "a")


def test_manifest_is_identical_minus_timestamps(tmp_path):
    from packer.preprocess.pipeline import build

    texts = []
    for name, workers in (("w1", 1), ("w2", 2)):
        build(_small_job(tmp_path, name, workers=workers))
        m = read_manifest(tmp_path / name)
        assert m["created_unix"] > 0 and m["build_seconds"] >= 0
        del m["created_unix"], m["build_seconds"]
        texts.append(json.dumps(m, indent=2))
        assert (tmp_path / name / "stats.json").read_bytes() == (tmp_path / "w1" / "stats.json").read_bytes()
    assert texts[0] == texts[1]


def test_changed_config_or_inputs_against_unfinished_work_is_refused(tmp_path):
    from packer.preprocess.pipeline import build

    job = _small_job(tmp_path)
    build(job, keep_work=True)
    (tmp_path / "ds" / "manifest.json").unlink()  # now: unfinished work, every stage done
    with pytest.raises(ValueError, match=r"config\.seed: 0 there, 1 now.*--overwrite"):
        build(_small_job(tmp_path, seed=1))
    src = tmp_path / "in.jsonl"
    src.write_text(src.read_text(encoding="utf-8") + '{"text": "one more"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"inputs\[0\]\.bytes"):
        build(job)
    manifest = build(job, overwrite=True)  # discards the stale work, builds from scratch
    assert manifest["totals"]["docs_read"] == 301 and not (tmp_path / "ds" / "_work").exists()


def test_complete_dataset_is_kept_unless_overwrite(tmp_path):
    from packer.preprocess.pipeline import build

    first = build(_small_job(tmp_path))
    again = build(_small_job(tmp_path))
    assert again["already_complete"] and again["shards"] == first["shards"]
    with pytest.raises(ValueError, match=r"already holds a complete dataset built differently \(config\.format"):
        build(_small_job(tmp_path, format="memmap"))
    assert read_manifest(tmp_path / "ds")["config"]["format"] == "arrow"
    build(_small_job(tmp_path, format="memmap"), overwrite=True)
    names = sorted(p.name for p in (tmp_path / "ds").iterdir())
    assert not any(n.endswith(".arrow") for n in names) and "shard-00000.idx" in names
    assert verify_dataset(tmp_path / "ds")["sequences"] == first["totals"]["sequences"]


def test_keep_work_and_foreign_directories(tmp_path):
    from packer.preprocess.pipeline import build

    build(_small_job(tmp_path, "kept"), keep_work=True)
    work = tmp_path / "kept" / "_work"
    assert (work / "plan.npz").exists() and (work / "fingerprint.json").exists()
    assert not list((tmp_path / "kept").glob("*.tmp*")) and not (tmp_path / "kept" / ".packer.lock").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(ValueError, match="holds files packer did not write \\(notes.txt\\)"):
            build(_small_job(tmp_path, "foreign"), overwrite=overwrite)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_cli_memmap_build_verify_quick_inspect(tmp_path):
    from click.testing import CliRunner

    from packer.cli import main

    job = _small_job(tmp_path)
    runner = CliRunner()
    out = str(tmp_path / "cli")
    args = ["build", *job.inputs, "--tokenizer", TOKENIZER, "--output", out, "--context-length", "256",
            "--workers", "1", "--format", "memmap", "--shard-size", "4000"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "already complete" in runner.invoke(main, args).output
    refused = runner.invoke(main, [*args[:-1], "5000"])
    assert refused.exit_code == 1 and "config.shard_size: 4000 there, 5000 now" in refused.output
    quick = runner.invoke(main, ["verify", out, "--quick"])
    assert quick.exit_code == 0 and quick.output.startswith("ok:")
    raw = runner.invoke(main, ["inspect", out, "--seq", "1", "--raw"])
    tokens, offsets = open_dataset(out)[1]
    assert raw.exit_code == 0 and f"{len(tokens)} tokens, {len(offsets) - 1} documents" in raw.output
    summary = runner.invoke(main, ["inspect", out, "--json"])  # the raw manifest
    assert summary.exit_code == 0 and '"format": "memmap"' in summary.output and "shard-00000.bin" in summary.output


def test_an_arrow_build_opens_with_datasets_load_from_disk_without_a_copy(tmp_path):
    """state.json and dataset_info.json beside the stream shards: datasets maps the shards themselves."""
    datasets = pytest.importorskip("datasets")
    from packer.preprocess.pipeline import build

    out = tmp_path / "ds"
    build(_small_job(tmp_path, shard_size=20_000))
    hf = datasets.load_from_disk(str(out))
    assert sorted(Path(c["filename"]).name for c in hf.cache_files) == sorted(p.name for p in out.glob("shard-*.arrow"))
    ds = open_dataset(out)
    assert len(hf) == len(ds) and len(ds) > 1
    for i in (0, len(ds) // 2, len(ds) - 1):
        assert hf[i]["input_ids"] == ds[i][0].tolist() and hf[i]["offsets"] == ds[i][1].tolist()
    build(_small_job(tmp_path, format="memmap"), overwrite=True)
    assert not (out / "state.json").exists() and not (out / "dataset_info.json").exists()


def test_a_build_that_accepts_nothing_writes_nothing(tmp_path):
    from packer.preprocess.pipeline import BuildRejected, build

    src = tmp_path / "in.jsonl"
    src.write_text('{"body": "x"}\n{"text": ""}\n{"body": "y"}\n', encoding="utf-8")
    with pytest.raises(BuildRejected) as e:
        build(_small_job(tmp_path, inputs=[str(src)]), keep_work=True)
    assert "0 accepted of 3 read (3 skipped: {'missing_field': 2, 'empty_text': 1}); e.g." in str(e.value)
    assert f"missing_field at {src}:1" in str(e.value) and f"empty_text at {src}:2" in str(e.value)
    assert not (tmp_path / "ds").exists()  # no manifest, no _work to trip a fixed rerun, not even the directory
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(BuildRejected, match=r"0 accepted of 0 read \(the inputs hold no records\)"):
        build(_small_job(tmp_path, "e", inputs=[str(empty)]))


def test_max_skip_fraction_fails_before_the_manifest_and_a_higher_limit_resumes(tmp_path):
    from packer.config import BuildConfig
    from packer.preprocess.pipeline import BuildRejected, build

    lines = open(SAMPLE_INPUTS[0], encoding="utf-8").readlines()[:300]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(line if i % 50 else '{"text": " "}\n' for i, line in enumerate(lines)), encoding="utf-8")
    reference = build(_small_job(tmp_path, "ref", inputs=[str(src)], unit_bytes=20_000))  # off by default
    assert reference["totals"]["docs_skipped"] == {"empty_text": 6} and "max_skip_fraction" not in reference["config"]
    job = _small_job(tmp_path, inputs=[str(src)], unit_bytes=20_000, max_skip_fraction=0.01)
    with pytest.raises(BuildRejected, match=r"2\.00% of 300 documents read were skipped \(6\), over "
                                            r"--max-skip-fraction 0\.01: \{'empty_text': 6\}; e\.g\. empty_text at "):
        build(job)
    out = tmp_path / "ds"
    assert not (out / "manifest.json").exists()
    units = sorted((out / "_work" / "units").glob("unit-*.json"))
    stamps = [p.stat().st_mtime_ns for p in units]
    assert len(units) > 3
    again = build(dataclasses.replace(job, config=BuildConfig(**{**job.config.to_dict(), "max_skip_fraction": 0.02})),
                  keep_work=True)
    assert [p.stat().st_mtime_ns for p in units] == stamps  # resumed: no unit tokenized again
    assert again["config"]["max_skip_fraction"] == 0.02
    assert {k: v for k, v in again["config"].items() if k != "max_skip_fraction"} == reference["config"]
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in reference["shards"]]
    with pytest.raises(ValueError, match=r"max_skip_fraction must be a share in \[0, 1\)"):
        BuildConfig(max_skip_fraction=1)


def test_progress_lines_off_and_bar(tmp_path, capsys, monkeypatch):
    from packer.io import progress
    from packer.preprocess.pipeline import build

    monkeypatch.setattr(progress, "INTERVAL", 0.0)
    build(_small_job(tmp_path, "lines", unit_bytes=20_000), progress="lines")
    err = capsys.readouterr().err
    assert "\r" not in err and err.count("tokenize: ") > 3 and err.splitlines()[-1].startswith("write: ")
    build(_small_job(tmp_path, "off", unit_bytes=20_000), progress="off")
    assert capsys.readouterr().err == ""
    build(_small_job(tmp_path, "bar", unit_bytes=20_000), progress="bar")
    assert "\r" in capsys.readouterr().err  # tqdm's redraws, on a terminal only


def test_run_only_settings_do_not_make_a_complete_dataset_different(tmp_path):
    """strict, on_file_error and max_skip_fraction decide only whether a bad input stops the run: a
    complete dataset rerun with other values is already complete, not 'built differently'."""
    from packer.preprocess.pipeline import build

    build(_small_job(tmp_path))
    again = build(_small_job(tmp_path, strict=True, on_file_error="skip", max_skip_fraction=0.5))
    assert again.get("already_complete") is True
    with pytest.raises(ValueError, match="built differently"):
        build(_small_job(tmp_path, seed=7))


def test_a_refused_build_leaves_no_directory_packer_made(tmp_path):
    """Issue 35 item 10: refused before writing, the output and the parents packer made for it are gone;
    a directory that was there before (the user's), or one holding anything, stays."""
    from packer.preprocess.pipeline import BuildRejected, build
    from packer.preprocess.readers import FileError

    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(BuildRejected):
        build(_small_job(tmp_path, "new/deeper/ds", inputs=[str(empty)]))
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    with pytest.raises(BuildRejected):
        build(_small_job(tmp_path, "mine/ds", inputs=[str(empty)]))
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == []  # the user's directory stays, ds is gone
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\x1f\x8b\x08\x00 gzip, named as text")
    with pytest.raises(FileError, match="name it bad.jsonl.gz"):
        build(_small_job(tmp_path, "planned/ds", inputs=[str(bad)]))
    assert not (tmp_path / "planned").exists()
    kept = tmp_path / "kept"
    build(_small_job(tmp_path, "kept"))  # a finished dataset: a refused rebuild into it removes nothing
    files = sorted(p.name for p in kept.iterdir())
    with pytest.raises(ValueError):
        build(_small_job(tmp_path, "kept", seed=7))  # another command into a complete dataset
    assert sorted(p.name for p in kept.iterdir()) == files



def test_a_missing_shard_file_is_repaired_the_way_the_error_says(tmp_path):
    """Issue 35 item 11: after `rm shard-00002.bin` the same command does not answer "already complete": it
    names the file and the command that repairs it (--overwrite), which rebuilds the same bytes; with
    _work/ still holding the build's inputs (--keep-work), the same command rebuilds it itself."""
    from packer.preprocess.pipeline import build

    job = _small_job(tmp_path, format="memmap", context_length=128, shard_size=4000)
    build(job)
    out = tmp_path / "ds"
    before = {p.name: p.read_bytes() for p in out.glob("shard-*")}
    assert len(before) >= 9  # three files a shard, three shards at least
    (out / "shard-00002.bin").unlink()
    with pytest.raises(ValueError, match=r"ds/shard-00002.bin is missing from the complete dataset .* with --overwrite"):
        build(job)
    assert build(job, overwrite=True).get("already_complete") is None
    assert {p.name: p.read_bytes() for p in out.glob("shard-*")} == before
    verify_dataset(out)
    build(job, keep_work=True, overwrite=True)
    for name in ("shard-00002.bin", "shard-00001.idx"):
        (out / name).unlink()
    assert build(job, keep_work=True).get("already_complete") is None  # rebuilt from _work/, no flag needed
    assert {p.name: p.read_bytes() for p in out.glob("shard-*")} == before
    assert build(job).get("already_complete")  # whole again: nothing to do
