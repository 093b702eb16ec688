"""Inputs that are not what their name says (issue 35 item 9): compressed data under a plain name is
refused by its magic bytes with the name to give it; a build that accepts nothing says why in the
words that fit (the fields the records do have, an empty input); ids without labels train every token."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma

import numpy as np
import pyarrow as pa
import pytest
from conftest import TOKENIZER, run_packer

from packer.config import BuildConfig, Job
from packer.preprocess.pipeline import BuildRejected, build
from packer.preprocess.readers import FileError, plan_units

RECORDS = "".join(json.dumps({"text": f"document {i} of a corpus"}) + "\n" for i in range(40)).encode()
CODECS = {"gzip": (gzip.compress, ".gz"), "zstd": (lambda d: pa.compress(d, codec="zstd", asbytes=True), ".zst"),
          "bzip2": (bz2.compress, None), "xz": (lzma.compress, None)}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("name", ["a.jsonl", "a.txt", "a.json"])
def test_compressed_data_under_a_plain_name_is_refused_by_its_magic(tmp_path, codec, name):
    compress, suffix = CODECS[codec]
    path = tmp_path / name
    path.write_bytes(compress(RECORDS))
    with pytest.raises(FileError) as e:
        plan_units([str(path)], 1 << 20)
    fix = f"name it {name}{suffix}" if suffix else "decompress it"
    assert e.value.cause.startswith(f"{codec} data (its name says no compression): {fix}"), e.value.cause
    if suffix:  # named as it is, it reads
        path.rename(tmp_path / (name + suffix))
        assert plan_units([str(tmp_path / (name + suffix))], 1 << 20)


def test_text_that_only_looks_like_a_magic_is_read(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("BZh9 is how a bzip2 stream begins, but this is text\n", encoding="utf-8")
    assert plan_units([str(path)], 1 << 20)


def test_a_misnamed_gzip_input_is_one_error_line_or_skipped(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(gzip.compress(RECORDS))
    (tmp_path / "in" / "b.jsonl").write_bytes(RECORDS)
    args = ["build", str(tmp_path / "in"), "--tokenizer", TOKENIZER, "--context-length", "64", "--workers", "1"]
    code, output = run_packer([*args, "-o", str(tmp_path / "o")])
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "a.jsonl: gzip data (its name says no compression): name it a.jsonl.gz" in lines[0]
    code, output = run_packer([*args, "-o", str(tmp_path / "s"), "--on-file-error", "skip"])
    assert code == 0, output
    totals = json.loads((tmp_path / "s" / "manifest.json").read_text())["totals"]
    assert totals["docs_accepted"] == 40 and [f["path"] for f in totals["files_skipped"]] == [str(tmp_path / "in" / "a.jsonl")]


def _job(tmp_path, inputs, name="ds", **config):
    return Job(inputs=[str(i) for i in inputs], tokenizer=TOKENIZER, output=str(tmp_path / name), workers=1,
               config=BuildConfig(**{"context_length": 64, **config}))


def test_a_missing_text_field_names_the_fields_the_records_have(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "body": "x"}) + "\n" for i in range(5)), encoding="utf-8")
    with pytest.raises(BuildRejected) as e:
        build(_job(tmp_path, [src]))
    assert f"no record has the field 'text'; the first record of {src} has 'body', 'id': name the text's field " \
           "with --text-field" in str(e.value)
    ids = tmp_path / "ids.jsonl"
    ids.write_text(json.dumps({"input_ids": [1, 2]}) + "\n", encoding="utf-8")
    with pytest.raises(BuildRejected, match="has 'input_ids': .* or read them as tokens records with --input-kind tokens"):
        build(_job(tmp_path, [ids], "ids"))


def test_an_empty_input_is_not_told_to_check_the_text_field(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(BuildRejected) as e:
        build(_job(tmp_path, [empty]))
    assert "the inputs are empty" in str(e.value) and "text-field" not in str(e.value) and "\n" not in str(e.value)


def test_ids_without_labels_or_a_loss_mask_train_every_token(tmp_path):
    """A pretraining corpus already tokenized: every token trained, as a text build trains every token."""
    from packer.store.dataset import open_dataset

    src = tmp_path / "ids.jsonl"
    docs = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    src.write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in docs), encoding="utf-8")
    manifest = build(_job(tmp_path, [src], input_kind="tokens", context_length=16))
    totals = manifest["totals"]
    assert totals["docs_accepted"] == 3 and not totals["docs_skipped"] and totals["trained_tokens"] == 9
    dataset = open_dataset(tmp_path / "ds")
    stored = sorted(int(t) for i in range(len(dataset)) for t in np.asarray(dataset[i][0]))  # (tokens, offsets)
    assert stored == sorted(t for d in docs for t in d)
