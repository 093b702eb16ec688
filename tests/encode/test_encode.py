"""One encode path: `packer build`, `packer stats INPUT` (corpus_lengths), OnlinePackedDataset and encode_texts
give the same ids for the same documents, and the tokenizer is configured once on load and never mutated.

The corpus holds what used to make them disagree: "<|endoftext|>" inside texts (text, not the eos id),
a .txt file split at blank lines, a Parquet file, a record over max_doc_bytes (skipped), documents
longer than a small piece size, and tokenizer files that ship truncation at 8 tokens and padding on.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TOKENIZER, sample_texts
from tokenizers import Tokenizer

from packer.config import BuildConfig, Job
from packer.encode.text import encode_texts
from packer.encode.tokenizer import load_tokenizer, tokenizer_info
from packer.preprocess.corpus import corpus_lengths
from packer.preprocess.pipeline import build
from packer.store.dataset import open_dataset

EOS = "<|endoftext|>"
CONFIG = BuildConfig(context_length=8192, text_split="blank-line", max_doc_bytes=6000)  # no document is split


def _tokenizer_state(tok) -> tuple:
    return tok.encode_special_tokens, tok.truncation, tok.padding, tok.to_str()


def _joined(texts, n_chars: int) -> str:
    """Texts joined with spaces, a little over n_chars long (a document of many pieces)."""
    out = ""
    for text in texts:
        if len(out) > n_chars:
            return out
        out = f"{out} {text}" if out else text
    raise AssertionError("not enough text")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(input paths, the texts a build accepts from them, in input order). Every text is distinct."""
    root = tmp_path_factory.mktemp("corpus")
    texts = [t for t in sample_texts() if 20 < len(t) < 1000]
    jsonl = [f"{texts[0]} {EOS} {texts[1]}", f"{EOS}{texts[2]}{EOS}", f"hello {EOS} world",
             _joined(texts[100:], 3000), _joined(texts[200:], 4000) + f" {EOS}", *texts[13:60]]
    too_large = "y " * 4000  # 8000 bytes > max_doc_bytes: skipped by every path
    lines = [json.dumps({"text": t}) for t in jsonl[:3]] + [json.dumps({"text": too_large}), "not json"]
    lines += [json.dumps({"text": t}) for t in jsonl[3:]]
    (root / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    paragraphs = [f"first paragraph {EOS} of the text file", texts[60], f"{texts[61]}\nsecond line {EOS}",
                  *texts[62:70]]
    paragraphs = [p.replace("\n\n", "\n") for p in paragraphs]
    (root / "b.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    table_texts = [f"parquet {EOS} row", *texts[70:90]]
    pq.write_table(pa.table({"text": table_texts}), root / "c.parquet")
    accepted = jsonl + paragraphs + table_texts
    assert len(set(accepted)) == len(accepted) and sum(len(t) > 3000 for t in accepted) >= 2
    return [str(root / "a.jsonl"), str(root / "b.txt"), str(root / "c.parquet")], accepted


def _stored_documents(path) -> list[list[int]]:
    """Each document's ids as the build stored them, by global document index (none is split here)."""
    ds = open_dataset(path)
    doc_ids = ds.doc_ids().tolist()
    segments = [tokens[a:b].tolist() for tokens, offsets in ds for a, b in zip(offsets[:-1], offsets[1:])]
    assert len(doc_ids) == len(segments) == len(set(doc_ids))  # one piece per document
    by_doc = dict(zip(doc_ids, segments))
    return [by_doc[d] for d in range(len(by_doc))]


@pytest.fixture(scope="module")
def stored(corpus, tmp_path_factory):
    inputs, _ = corpus
    out = tmp_path_factory.mktemp("built") / "ds"
    manifest = build(Job(inputs=tuple(inputs), tokenizer=TOKENIZER, output=str(out), workers=1, config=CONFIG))
    assert manifest["totals"]["docs_skipped"] == {"malformed_json": 1, "too_large": 1}
    docs = _stored_documents(out)
    eos = load_tokenizer(TOKENIZER).token_to_id(EOS)  # the corpus is what it says (the build was right before):
    assert all(doc.count(eos) == 1 and doc[-1] == eos for doc in docs)  # "<|endoftext|>" strings are text
    assert len(docs[2]) == 10  # "hello <|endoftext|> world": 9 tokens of text, then eos
    return docs


def _fresh_copy(tmp_path) -> str:
    """The sample tokenizer at a path no earlier test loaded (so no cached object is shared)."""
    (tmp_path / "fresh").mkdir()
    path = tmp_path / "fresh" / "tokenizer.json"
    path.write_bytes(open(TOKENIZER, "rb").read())
    return str(path)


def test_corpus_lengths_count_what_the_build_stores(corpus, stored):
    inputs, _ = corpus
    lengths, sampled = corpus_lengths(inputs, TOKENIZER, CONFIG)
    assert sampled is None
    assert lengths.tolist() == [len(doc) for doc in stored]
    everything, sampled = corpus_lengths(inputs, TOKENIZER, CONFIG, sample=len(stored), seed=3)
    assert sampled is None and everything.tolist() == lengths.tolist()


def test_encode_in_small_pieces_gives_the_stored_ids(corpus, stored):
    _, accepted = corpus
    tok = load_tokenizer(TOKENIZER)
    info = tokenizer_info(TOKENIZER, CONFIG)
    flat, lengths = encode_texts(tok, accepted, dtype=info.dtype, eos_id=info.eos_id, piece_chars=500)
    assert lengths.tolist() == [len(doc) for doc in stored]
    assert flat.tolist() == [t for doc in stored for t in doc]


def _online_documents(texts, tokenizer) -> list[tuple[int, ...]]:
    torch = pytest.importorskip("torch")  # noqa: F841
    from packer.train.online import OnlinePackedDataset

    ds = OnlinePackedDataset(texts, tokenizer=tokenizer, config=BuildConfig(context_length=CONFIG.context_length),
                             buffer_docs=16)
    docs = []
    for item in ds:
        ids, cu = item["input_ids"].tolist(), item["cu_seqlens"].tolist()
        docs.extend(tuple(ids[a:b]) for a, b in zip(cu[:-1], cu[1:]))
    return sorted(docs)


def test_online_packing_yields_the_stored_ids(corpus, stored, tmp_path):
    _, accepted = corpus
    assert _online_documents(accepted, _fresh_copy(tmp_path)) == sorted(map(tuple, stored))


@pytest.fixture(scope="module")
def truncating_tokenizer(tmp_path_factory):
    """The sample tokenizer's JSON with truncation at 8 tokens and padding on, as many hub files ship."""
    spec = json.loads(open(TOKENIZER, encoding="utf-8").read())
    spec["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    spec["padding"] = {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                       "pad_type_id": 0, "pad_token": EOS}
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    assert Tokenizer.from_file(str(path)).encode_batch(["a", "a b c d e f g h i j"])[0].ids == [65] + [0] * 7
    return str(path)


def test_shipped_truncation_and_padding_are_off(corpus, stored, truncating_tokenizer):
    inputs, accepted = corpus
    plain, cut = load_tokenizer(TOKENIZER), load_tokenizer(truncating_tokenizer)
    assert cut.truncation is None and cut.padding is None
    ids = lambda tok: encode_texts(tok, accepted, dtype=np.uint16, eos_id=0)[0].tolist()  # noqa: E731
    assert ids(cut) == ids(plain) == [t for doc in stored for t in doc]
    lengths, _ = corpus_lengths(inputs, truncating_tokenizer, CONFIG)
    assert lengths.tolist() == [len(doc) for doc in stored]
    info = tokenizer_info(truncating_tokenizer, CONFIG)
    assert (info.shipped_truncation, info.shipped_padding) == (8, True)
    plain_info = tokenizer_info(TOKENIZER, CONFIG)
    assert (plain_info.shipped_truncation, plain_info.shipped_padding) == (None, False)


def test_a_tokenizer_object_is_configured_on_a_copy_never_mutated(corpus, stored, truncating_tokenizer):
    _, accepted = corpus
    users = Tokenizer.from_file(truncating_tokenizer)
    before = _tokenizer_state(users)
    assert _online_documents(accepted, users) == sorted(map(tuple, stored))
    assert _tokenizer_state(users) == before and users.truncation["max_length"] == 8 and not users.encode_special_tokens


def test_loaded_tokenizer_is_not_changed_by_a_build(tmp_path):
    path = _fresh_copy(tmp_path)
    before = _tokenizer_state(load_tokenizer(path))
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": f"a {EOS} b"}) + "\n", encoding="utf-8")
    lengths_before, _ = corpus_lengths([str(tmp_path / "a.jsonl")], path, BuildConfig())
    build(Job(inputs=(str(tmp_path / "a.jsonl"),), tokenizer=path, output=str(tmp_path / "ds"), workers=1))
    assert _tokenizer_state(load_tokenizer(path)) == before  # the cached object, after an in-process build
    lengths_after, _ = corpus_lengths([str(tmp_path / "a.jsonl")], path, BuildConfig())
    assert lengths_before.tolist() == lengths_after.tolist() == [len(_stored_documents(tmp_path / "ds")[0])]


def test_a_failing_file_skipped_counts_none_of_its_documents(corpus, tmp_path):
    """A truncated .gz yields some records, then fails: the build keeps none of them, nor may stats."""
    inputs, _ = corpus
    body = "".join(json.dumps({"text": t}) + "\n" for t in sample_texts()[:2000]).encode()
    (tmp_path / "bad.jsonl.gz").write_bytes(gzip.compress(body)[: len(body) // 6])
    inputs = [inputs[0], str(tmp_path / "bad.jsonl.gz"), inputs[1]]
    config = BuildConfig(**{**CONFIG.to_dict(), "on_file_error": "skip"})
    manifest = build(Job(inputs=tuple(inputs), tokenizer=TOKENIZER, output=str(tmp_path / "ds"), workers=1,
                         config=config))
    expected = [len(doc) for doc in _stored_documents(tmp_path / "ds")]
    assert manifest["totals"]["docs_accepted"] == len(expected) and len(manifest["totals"]["files_skipped"]) == 1
    lengths, _ = corpus_lengths(inputs, TOKENIZER, config)
    assert lengths.tolist() == expected
    sampled, info = corpus_lengths(inputs, TOKENIZER, config, sample=len(expected) - 1, seed=1)
    assert info == {"documents": len(expected) - 1, "of_documents": len(expected), "seed": 1}
    with pytest.raises(ValueError, match="bad.jsonl.gz"):
        corpus_lengths(inputs, TOKENIZER, CONFIG)  # on_file_error="fail": the build would fail too
