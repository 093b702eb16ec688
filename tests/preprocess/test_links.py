"""Directory inputs never follow a symbolic link out of the directory (issue 28): a link to a
private file is not tokenized, a link to / is not walked; links inside the tree are followed."""

from __future__ import annotations

import json
import os

from conftest import SAMPLE_INPUTS, TOKENIZER, run_packer

from packer.preprocess.inputs import OutsideLink, expand_inputs


def _corpus(tmp_path):
    corpus, private = tmp_path / "corpus", tmp_path / "private"
    (corpus / "sub").mkdir(parents=True)
    private.mkdir()
    lines = open(SAMPLE_INPUTS[0], encoding="utf-8").readlines()[:40]
    (corpus / "a.jsonl").write_text("".join(lines), encoding="utf-8")
    (private / "secret.jsonl").write_text(json.dumps({"text": "PRIVATE " * 50}) + "\n", encoding="utf-8")
    os.symlink("../../private/secret.jsonl", corpus / "sub" / "s.jsonl")
    os.symlink("../a.jsonl", corpus / "sub" / "inside.jsonl")  # inside the tree: followed
    os.symlink("/", corpus / "root")
    return corpus


def test_links_out_of_an_input_directory_are_listed_not_followed(tmp_path):
    corpus = _corpus(tmp_path)
    files = expand_inputs([str(corpus)])
    assert files == [str(corpus / n) for n in ("a.jsonl", "root", "sub/inside.jsonl", "sub/s.jsonl")]
    outside = {f for f in files if isinstance(f, OutsideLink)}
    assert outside == {str(corpus / "root"), str(corpus / "sub" / "s.jsonl")}


def test_a_build_refuses_a_link_out_of_its_directory_or_skips_it(tmp_path):
    corpus = _corpus(tmp_path)
    args = ["build", str(corpus), "--tokenizer", TOKENIZER, "--context-length", "256", "--workers", "1"]
    code, output = run_packer([*args, "--output", str(tmp_path / "refused")], timeout=120)
    assert code == 1 and "symbolic link to /, outside the input directory" in output, output
    code, output = run_packer([*args, "--output", str(tmp_path / "ds"), "--on-file-error", "skip"], timeout=120)
    assert code == 0, output
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert str(corpus / "root") in json.dumps(manifest["totals"]["files_skipped"])
    assert str(corpus / "sub" / "s.jsonl") in json.dumps(manifest["totals"]["files_skipped"])
    assert manifest["totals"]["docs_accepted"] == 80  # a.jsonl twice (once through the inside link), no secret


def _globbed(tmp_path):
    """in/a.jsonl, in/link.jsonl -> elsewhere/private.jsonl, in/sub -> elsewhere (a linked directory),
    in/inside.jsonl -> a.jsonl (inside: followed)."""
    corpus, private = tmp_path / "in", tmp_path / "elsewhere"
    corpus.mkdir()
    private.mkdir()
    lines = open(SAMPLE_INPUTS[0], encoding="utf-8").readlines()[:40]
    (corpus / "a.jsonl").write_text("".join(lines), encoding="utf-8")
    (private / "private.jsonl").write_text(json.dumps({"text": "PRIVATE " * 50}) + "\n", encoding="utf-8")
    os.symlink(private / "private.jsonl", corpus / "link.jsonl")
    os.symlink("a.jsonl", corpus / "inside.jsonl")
    os.symlink(private, corpus / "sub")
    return corpus


def test_a_glob_never_leaves_its_directory(tmp_path):
    """Issue 35 item 2: the glob's literal directory is its root, as an input directory is."""
    corpus = _globbed(tmp_path)
    files = expand_inputs([str(corpus / "*.jsonl")])
    assert files == [str(corpus / n) for n in ("a.jsonl", "inside.jsonl", "link.jsonl")]
    assert [f for f in files if isinstance(f, OutsideLink)] == [str(corpus / "link.jsonl")]
    assert files[2].root == str(corpus) and files[2].target == str(tmp_path / "elsewhere" / "private.jsonl")
    through = expand_inputs([str(corpus / "*" / "*.jsonl"), str(corpus / "**")])  # through the linked directory
    outside = sorted({str(f) for f in through if isinstance(f, OutsideLink)})
    assert outside == [str(corpus / n) for n in ("link.jsonl", "sub", "sub/private.jsonl")]
    assert not any("private" in f and not isinstance(f, OutsideLink) for f in through)
    assert expand_inputs([str(tmp_path / "e*")]) == [str(tmp_path / "elsewhere" / "private.jsonl")]  # its own root


def test_a_build_refuses_a_glob_match_out_of_its_directory_or_skips_it(tmp_path):
    corpus = _globbed(tmp_path)
    args = ["build", str(corpus / "*.jsonl"), "--tokenizer", TOKENIZER, "--context-length", "256", "--workers", "1"]
    code, output = run_packer([*args, "--output", str(tmp_path / "refused")], timeout=120)
    assert code == 1 and f"symbolic link to {tmp_path / 'elsewhere' / 'private.jsonl'}, outside the input directory" in output
    assert len([line for line in output.splitlines() if line.strip()]) == 1, output
    code, output = run_packer([*args, "--output", str(tmp_path / "ds"), "--on-file-error", "skip"], timeout=120)
    assert code == 0, output
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert [f["path"] for f in manifest["totals"]["files_skipped"]] == [str(corpus / "link.jsonl")]
    assert manifest["totals"]["docs_accepted"] == 80  # a.jsonl twice (once through the inside link), no secret


def _chains(tmp_path):
    d, chain = tmp_path / "links", tmp_path / "chain"
    d.mkdir()
    chain.mkdir()
    (d / "real.jsonl").write_text(json.dumps({"text": "a document"}) + "\n", encoding="utf-8")
    previous = "../links/real.jsonl"
    for i in range(1500):  # far deeper than the 40 links the kernel follows, and than realpath's recursion
        os.symlink(previous, chain / f"{i}")
        previous = f"{i}"
    os.symlink("../chain/1499", d / "deep.jsonl")
    os.symlink("loop-b.jsonl", d / "loop-a.jsonl")
    os.symlink("loop-a.jsonl", d / "loop-b.jsonl")
    os.symlink("nothere.jsonl", d / "dangling.jsonl")
    return d


def test_a_link_chain_or_loop_is_named_as_one_not_as_input_not_found(tmp_path):
    """Issue 35 item 6: named as an input, in a directory or matched by a glob."""
    import pytest

    from packer.preprocess.readers import FileError, plan_units

    d = _chains(tmp_path)
    for name, said in (("deep.jsonl", "a symbolic link loop, or a chain of links deeper than the system follows"),
                       ("loop-a.jsonl", "a symbolic link loop"), ("dangling.jsonl", "a symbolic link to nothere.jsonl, "
                                                                                    "which does not exist")):
        with pytest.raises(FileNotFoundError) as e:
            expand_inputs([str(d / name)])
        assert said in str(e.value) and "input not found" not in str(e.value)
        for listed in (expand_inputs([str(d / "*.jsonl")]), expand_inputs([str(d)])):  # listed, refused when planned
            assert str(d / name) in listed
            with pytest.raises(FileError, match=said.split(",")[0]):
                plan_units([str(d / name)], 1 << 20)
    skipped = []
    assert len(plan_units(expand_inputs([str(d / "*.jsonl")]), 1 << 20, skipped_files=skipped)) == 1  # real.jsonl
    assert sorted(s["path"] for s in skipped) == [str(d / n) for n in ("dangling.jsonl", "deep.jsonl", "loop-a.jsonl",
                                                                        "loop-b.jsonl")]
