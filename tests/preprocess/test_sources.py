"""Named sources through a build: every segment tagged with the source its document came from, rows of
a source contiguous, per-source totals, and builds without sources unchanged."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_INPUTS, TOKENIZER
from tokenizers import Tokenizer

from packer.cli import main
from packer.config import BuildConfig, Job, Source, load_job, sources_from_options
from packer.preprocess.pipeline import build
from packer.store.dataset import open_dataset
from packer.store.manifest import read_manifest
from packer.store.verify import verify_dataset

CONTEXT = 256


def _lines(path, a, b):
    with open(path, encoding="utf-8") as f:
        return f.readlines()[a:b]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three sources: prose (two files), code (some of it: its documents are long), and books (prose
    under another field name)."""
    d = tmp_path_factory.mktemp("corpus")
    (d / "prose-a.jsonl").write_text("".join(_lines(SAMPLE_INPUTS[0], 0, 200)), encoding="utf-8")
    (d / "prose-b.jsonl").write_text("".join(_lines(SAMPLE_INPUTS[0], 200, 350)), encoding="utf-8")
    (d / "code.jsonl").write_text("".join(_lines(SAMPLE_INPUTS[1], 0, 15)), encoding="utf-8")
    books = [json.dumps({"content": json.loads(line)["text"]}) + "\n" for line in _lines(SAMPLE_INPUTS[0], 350, 600)]
    (d / "books.jsonl").write_text("".join(books), encoding="utf-8")
    return {"prose": (str(d / "prose-a.jsonl"), str(d / "prose-b.jsonl")), "code": (str(d / "code.jsonl"),),
            "books": (str(d / "books.jsonl"),)}


def _sources(corpus):
    return (Source(name="prose", inputs=corpus["prose"]), Source(name="code", inputs=corpus["code"]),
            Source(name="books", inputs=corpus["books"], text_field="content"))


def _job(out, sources=(), inputs=(), **config):
    return Job(inputs=tuple(inputs), sources=tuple(sources), tokenizer=TOKENIZER, output=str(out), workers=1,
               config=BuildConfig(**{"context_length": CONTEXT, "shard_size": 4000, **config}))


@pytest.fixture(scope="module", params=["arrow", "memmap"])
def built(request, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("sources") / request.param
    build(_job(out, _sources(corpus), format=request.param))
    return out


def _reference(corpus):
    """(source index, token ids + eos) of every document, read and tokenized here, in input order."""
    tok = Tokenizer.from_file(TOKENIZER)
    eos = tok.token_to_id("<|endoftext|>")
    docs = []
    for i, (name, field) in enumerate((("prose", "text"), ("code", "text"), ("books", "content"))):
        for path in corpus[name]:
            with open(path, encoding="utf-8") as f:
                texts = [json.loads(line)[field] for line in f]
            docs += [(i, e.ids + [eos]) for e in tok.encode_batch(texts, add_special_tokens=False)]
    return docs


def _segments(path):
    """(row, source id, doc id, tokens) of every stored segment, through the reader."""
    ds = open_dataset(path)
    rows = np.arange(len(ds))
    tokens, offsets = ds.views(rows)
    sources, doc_ids = ds.source_views(rows), ds.doc_ids()
    out, k = [], 0
    for r, (t, o, s) in enumerate(zip(tokens, offsets, sources)):
        assert len(s) == len(o) - 1
        for j in range(len(o) - 1):
            out.append((r, int(s[j]), int(doc_ids[k]), tuple(t[o[j]:o[j + 1]].tolist())))
            k += 1
    return out


def test_every_segment_carries_the_source_of_its_document(built, corpus):
    reference = _reference(corpus)
    pieces, source_of = collections.defaultdict(list), {}
    for _, source, doc, tokens in _segments(built):
        pieces[doc].append(tokens)
        assert source_of.setdefault(doc, source) == source
    assert sorted(pieces) == list(range(len(reference)))
    n_split = 0
    for doc, (source, ids) in enumerate(reference):
        expected = sorted(tuple(ids[k:k + CONTEXT]) for k in range(0, len(ids), CONTEXT))
        assert sorted(pieces[doc]) == expected, f"document {doc}"
        assert source_of[doc] == source, f"document {doc}"
        n_split += len(expected) > 1
    assert n_split > 0 and {s for s, _ in reference} == {0, 1, 2}


def test_rows_of_a_source_are_contiguous_and_the_manifest_ranges_are_right(built):
    manifest = read_manifest(built)
    row_source = {}
    for row, source, _, _ in _segments(built):
        assert row_source.setdefault(row, source) == source, f"row {row} mixes sources"
    order = [row_source[r] for r in range(len(row_source))]
    assert order == sorted(order)  # source 0's rows, then source 1's, ...
    names = [s["name"] for s in manifest["sources"]]
    assert names == ["prose", "code", "books"]
    shard_rows = np.cumsum([0] + [e["sequences"] for e in manifest["shards"]])
    for i, s in enumerate(manifest["sources"]):
        first, end = s["sequences"]
        assert [r for r, src in row_source.items() if src == i] == list(range(first, end))
        k0, k1 = s["shards"]
        assert (shard_rows[k0], shard_rows[k1]) == (first, end)  # no shard holds two sources
        assert k1 - k0 >= 1
    assert manifest["sources"][-1]["sequences"][1] == manifest["totals"]["sequences"]
    verify_dataset(built)


def test_per_source_totals_add_up_to_the_totals(built):
    manifest = read_manifest(built)
    t, named = manifest["totals"], manifest["sources"]
    for key in ("docs_read", "docs_accepted", "tokens_in"):
        assert sum(s[key] for s in named) == t[key]
    assert sum(s["tokens"] for s in named) == t["tokens_out"]
    assert sum(s["documents"] for s in named) == t["docs_accepted"] - t["docs_dropped_long"]
    assert sum(s["sequences"][1] - s["sequences"][0] for s in named) == t["sequences"]
    skipped = collections.Counter()
    for s in named:
        skipped.update(s["docs_skipped"])
    assert dict(skipped) == t["docs_skipped"]
    for s in named:
        rows = s["sequences"][1] - s["sequences"][0]
        assert s["padding"] == rows * CONTEXT - s["tokens"]
        assert s["fill_rate"] == pytest.approx(s["tokens"] / (rows * CONTEXT))
    # the books source reads its own field: nothing skipped as missing_field
    assert named[2]["docs_accepted"] == 250 and named[2]["docs_skipped"] == {}
    assert named[0]["inputs"] == [p for p in named[0]["inputs"] if "prose-" in p] and len(named[0]["inputs"]) == 2


def test_stats_json_and_packer_stats_report_each_source(built):
    from conftest import schema_errors

    from packer.preprocess.corpus import measure

    stored = json.loads((built / "stats.json").read_text(encoding="utf-8"))
    measured = measure([str(built)])
    assert not schema_errors(stored) and not schema_errors(measured)
    manifest = read_manifest(built)
    for figures in (stored, measured):
        assert [s["name"] for s in figures["sources"]] == ["prose", "code", "books"]
        for s, m in zip(figures["sources"], manifest["sources"]):
            assert (s["documents"], s["tokens"], s["sequences"]) == (m["documents"], m["tokens"],
                                                                    m["sequences"][1] - m["sequences"][0])
            assert s["padding_share"] == pytest.approx(m["padding"] / (s["sequences"] * CONTEXT))
            assert s["docs_skipped"] == m["docs_skipped"]
    result = CliRunner().invoke(main, ["stats", str(built)])
    assert result.exit_code == 0, result.output
    assert "source" in result.output and "books" in result.output
    assert "<h2>Sources</h2>" in (built / "report.html").read_text(encoding="utf-8")


def test_a_wrong_text_field_is_counted_against_its_source_only(corpus, tmp_path):
    sources = _sources(corpus)[:2] + (Source(name="books", inputs=corpus["books"]),)  # books read as "text"
    m = build(_job(tmp_path / "o", sources))
    books = m["sources"][2]
    assert books["docs_skipped"] == {"missing_field": 250} and books["sequences"][0] == books["sequences"][1]
    assert m["sources"][0]["docs_skipped"] == {} and m["totals"]["docs_skipped"] == {"missing_field": 250}
    assert books["shards"][0] == books["shards"][1] == len(m["shards"])  # no rows, no shard


def test_one_named_source_stores_the_same_rows_as_no_sources(corpus, tmp_path):
    """The same files, unnamed and as one source: .bin/.idx bytes equal, the named build adds only
    its source ids (all 0) and manifest["sources"]; the unnamed one stores none."""
    plain = build(_job(tmp_path / "plain", inputs=corpus["prose"], format="memmap"))
    named = build(_job(tmp_path / "named", [Source(name="prose", inputs=corpus["prose"])], format="memmap"))
    assert "sources" not in plain and not open_dataset(tmp_path / "plain").has_source_ids
    for a, b in zip(plain["shards"], named["shards"]):
        for key in ("file", "index_file"):
            assert (tmp_path / "plain" / a[key]).read_bytes() == (tmp_path / "named" / b[key]).read_bytes()
    for key in ("config", "inputs", "totals"):
        assert plain[key] == named[key]
    ds = open_dataset(tmp_path / "named")
    assert all(not v.any() for v in ds.source_views(np.arange(len(ds))))
    assert not list((tmp_path / "plain").glob("*source_ids*"))


def test_cli_sources_and_the_toml_form_give_the_same_build(corpus, tmp_path):
    cli = ["build", "--tokenizer", TOKENIZER, "--context-length", str(CONTEXT), "--workers", "1", "-q",
           "--output", str(tmp_path / "cli"), "--source-field", "books=content"]
    for name in ("prose", "code", "books"):
        cli += [arg for path in corpus[name] for arg in ("--source", f"{name}={path}")]
    result = CliRunner().invoke(main, cli)
    assert result.exit_code == 0, result.output
    toml = [f'tokenizer = "{TOKENIZER}"', f'output = "{tmp_path / "toml"}"', "workers = 1", "",
            "[[sources]]", 'name = "prose"', f"inputs = {json.dumps(list(corpus['prose']))}", "",
            "[[sources]]", 'name = "code"', f"inputs = {json.dumps(list(corpus['code']))}", "",
            "[[sources]]", 'name = "books"', f"inputs = {json.dumps(list(corpus['books']))}", 'text_field = "content"',
            "", "[config]", f"context_length = {CONTEXT}"]
    (tmp_path / "job.toml").write_text("\n".join(toml) + "\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["run", str(tmp_path / "job.toml"), "-q"])
    assert result.exit_code == 0, result.output
    a, b = read_manifest(tmp_path / "cli"), read_manifest(tmp_path / "toml")
    for key in ("config", "inputs", "shards", "totals", "sources"):
        assert a[key] == b[key], key
    for entry in a["shards"]:
        assert (tmp_path / "cli" / entry["file"]).read_bytes() == (tmp_path / "toml" / entry["file"]).read_bytes()


def test_the_table_form_keeps_file_order_and_takes_per_source_settings(tmp_path):
    (tmp_path / "j.toml").write_text('tokenizer = "t"\noutput = "o"\n[sources.web]\ninputs = "a.jsonl"\n'
                                     '[sources.books]\ninputs = ["b/"]\ntext_split = "blank-line"\n', encoding="utf-8")
    job = load_job(tmp_path / "j.toml")
    assert job.inputs == () and [s.name for s in job.sources] == ["web", "books"]
    assert job.sources[0].inputs == ("a.jsonl",) and job.sources[1].text_split == "blank-line"
    assert sources_from_options(["web=a", "code=c", "web=b"], ["code=content"]) == (
        Source(name="web", inputs=("a", "b")), Source(name="code", inputs=("c",), text_field="content"))


@pytest.mark.parametrize("make, message", [
    (lambda: Job(inputs=("a",), sources=(Source(name="w", inputs=("b",)),), tokenizer="t", output="o"), "not both"),
    (lambda: Job(inputs=(), sources=(Source(name="w", inputs=("a",)), Source(name="w", inputs=("b",))),
                 tokenizer="t", output="o"), "more than once"),
    (lambda: Source(name="web/x", inputs=("a",)), "letters, digits"),
    (lambda: Source(name="web", inputs=()), "needs a list of inputs"),
    (lambda: Source(name="web", inputs=("a",), text_split="lines"), "text_split must be one of"),
    (lambda: sources_from_options(["web=a"], ["code=content"]), "no --source code=PATH"),
    (lambda: sources_from_options(["web"]), "not NAME=VALUE"),
])
def test_bad_sources_are_refused_with_the_fix(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_complete_dataset_is_complete_only_for_the_same_sources(corpus, tmp_path):
    sources = (Source(name="prose", inputs=corpus["prose"]), Source(name="code", inputs=corpus["code"]))
    build(_job(tmp_path / "o", sources))
    assert build(_job(tmp_path / "o", sources))["already_complete"]
    renamed = (Source(name="web", inputs=corpus["prose"]), sources[1])
    with pytest.raises(ValueError, match="other sources"):
        build(_job(tmp_path / "o", renamed))
    with pytest.raises(ValueError, match="other sources"):
        build(_job(tmp_path / "o", inputs=corpus["prose"] + corpus["code"]))


# ---- planning source after source ----------------------------------------------------------


def test_per_source_text_split(tmp_path):
    (tmp_path / "paras.txt").write_text("one paragraph.\n\nanother one.\n\na third.\n", encoding="utf-8")
    (tmp_path / "whole.txt").write_text("a file.\n\nstill the same document.\n", encoding="utf-8")
    m = build(_job(tmp_path / "o", [Source(name="paras", inputs=(str(tmp_path / "paras.txt"),), text_split="blank-line"),
                                    Source(name="whole", inputs=(str(tmp_path / "whole.txt"),))]))
    assert [s["docs_accepted"] for s in m["sources"]] == [3, 1]
    assert m["sources"][0]["text_split"] == "blank-line" and "text_split" not in m["sources"][1]


def _cli_build(corpus, out, workers, kill_at=None):
    """`packer build --source ...` in its own process group (killed whole afterwards, like a scheduler would)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from packer.io import failpoints

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop(failpoints.ENV, None)
    if kill_at:
        env[failpoints.ENV] = f"{kill_at}=kill"
    cmd = [sys.executable, "-m", "packer", "build", "--tokenizer", TOKENIZER, "--output", str(out), "-q",
           "--context-length", str(CONTEXT), "--shard-size", "4000", "--workers", str(workers),
           "--source-field", "books=content"]
    cmd += [arg for name in ("prose", "code", "books") for path in corpus[name] for arg in ("--source", f"{name}={path}")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, output.decode()


@pytest.mark.slow
def test_a_killed_build_with_sources_resumes_to_the_same_bytes(corpus, tmp_path):
    code, output = _cli_build(corpus, tmp_path / "ref", workers=1)
    assert code == 0, output
    code, _ = _cli_build(corpus, tmp_path / "cut", workers=2, kill_at="write:3")
    assert code != 0 and not (tmp_path / "cut" / "manifest.json").exists()
    code, output = _cli_build(corpus, tmp_path / "cut", workers=2)
    assert code == 0, output
    a, b = read_manifest(tmp_path / "ref"), read_manifest(tmp_path / "cut")
    for key in ("config", "inputs", "shards", "totals", "sources"):
        assert a[key] == b[key], key
    for entry in a["shards"]:
        assert (tmp_path / "ref" / entry["file"]).read_bytes() == (tmp_path / "cut" / entry["file"]).read_bytes()
