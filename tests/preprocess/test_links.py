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
