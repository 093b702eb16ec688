"""The text path (packer/encode/text.py): encode_texts / encode_stream give the tokenizer's own ids,
bos/eos added once per document, long documents in pieces, streamed batches the one-batch result."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TOKENIZER, sample_texts
from conftest import reference_ids as _reference
from tokenizers import Tokenizer

from packer.encode import text as text_path
from packer.encode.text import _pieces, encode_stream, encode_texts


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(TOKENIZER)


@pytest.mark.parametrize("bos,eos", [(None, 0), (1, 0), (None, None), (5, None)])
def test_encode_equals_the_tokenizer(tok, bos, eos):
    texts = sample_texts()[:300]
    flat, lengths = encode_texts(tok, texts, dtype=np.uint16, eos_id=eos, bos_id=bos)
    ref = _reference(tok, texts, bos, eos)
    assert flat.dtype == np.uint16 and lengths.dtype == np.int64
    assert lengths.tolist() == [len(r) for r in ref]
    assert flat.tolist() == [t for r in ref for t in r]


def test_long_document_in_pieces_gives_the_same_tokens(tok):
    text = " ".join(sample_texts()[:400])  # prose and code: spaces, newlines, punctuation runs
    pieces = list(_pieces(text, 2000))
    assert "".join(pieces) == text and len(pieces) > 20
    flat, lengths = encode_texts(tok, [text], dtype=np.uint16, eos_id=0, piece_chars=2000)
    assert flat.tolist() == _reference(tok, [text], None, 0)[0] and lengths.tolist() == [len(flat)]
    no_space = "x" * 200_000  # no cut point anywhere: cut every 30K until the last 30K + 64K
    assert [len(p) for p in _pieces(no_space, 30_000)] == [30_000] * 4 + [80_000]
    tail = "word " * 400 + "a" * 100  # no cut point after character 2000: the text stays whole, not cut mid-word
    assert list(_pieces(tail, 2000)) == [tail]
    assert encode_texts(tok, [tail], dtype=np.uint16, piece_chars=2000)[0].tolist() == _reference(tok, [tail])[0]


@pytest.mark.parametrize("bos,eos", [(None, 0), (1, 0), (None, None)])
def test_long_documents_keep_their_place_in_a_batch(tok, bos, eos):
    texts = sample_texts()
    long_texts = [" ".join(texts[k : k + 30]) for k in (0, 100, 200)]  # each > 2000 characters
    short = [t for t in texts if len(t) < 500]
    batch = [short[0], long_texts[0], long_texts[1], short[1], short[2], long_texts[2]]
    assert sum(len(t) > 2000 for t in batch) == 3 and sum(len(t) <= 2000 for t in batch) == 3
    flat, lengths = encode_texts(tok, batch, dtype=np.uint32, eos_id=eos, bos_id=bos, piece_chars=2000)
    ref = _reference(tok, batch, bos, eos)
    assert flat.dtype == np.uint32 and lengths.tolist() == [len(r) for r in ref]
    assert flat.tolist() == [t for r in ref for t in r]
    only_long = encode_texts(tok, long_texts, dtype=np.uint32, eos_id=eos, bos_id=bos, piece_chars=2000)
    assert only_long[0].tolist() == [t for r in _reference(tok, long_texts, bos, eos) for t in r]


def test_stream_batches_give_the_one_batch_result(tok):
    texts = sample_texts()  # 3894 documents: several batches of ENCODE_BATCH_DOCS
    batches = list(encode_stream(tok, iter(texts), dtype=np.uint16, eos_id=0))
    assert len(batches) > 3 and all(len(n) <= text_path.ENCODE_BATCH_DOCS for _, n in batches)
    flat, lengths = encode_texts(tok, texts, dtype=np.uint16, eos_id=0)
    assert np.array_equal(np.concatenate([ids for ids, _ in batches]), flat)
    assert np.array_equal(np.concatenate([n for _, n in batches]), lengths)
    assert list(encode_stream(tok, iter([]), dtype=np.uint16)) == []


class _Submitting:
    """An engine with submit_ids over the tokenizer (as tiktoken's): it logs each batch's start and wait."""

    def __init__(self, tok):
        self.tok, self.log = tok, []

    def encode_ids(self, texts, dtype):  # a long document's pieces, one at a time
        return text_path.hf.encode_batch(self.tok, texts, dtype)

    def submit_ids(self, texts, dtype):
        k = sum(1 for event, _ in self.log if event == "start")
        self.log.append(("start", k))
        result = text_path.hf.encode_batch(self.tok, texts, dtype)

        def wait():
            self.log.append(("wait", k))
            return result
        return wait


def test_a_submitting_engine_is_waited_on_one_batch_later_with_the_same_parts(tok, monkeypatch):
    """encode_parts starts batch k+1 before it waits on batch k; the parts, long documents between
    batches included, are those of the engine waited on at once."""
    monkeypatch.setattr(text_path, "ENCODE_BATCH_DOCS", 7)
    texts = sample_texts()[:40]
    texts[17] = " ".join(sample_texts()[:200])  # a long document (in pieces) between two batches
    engine = _Submitting(tok)
    got = list(text_path.encode_parts(engine, texts, dtype=np.uint16, eos_id=0, bos_id=1, piece_chars=20_000))
    want = list(text_path.encode_parts(tok, texts, dtype=np.uint16, eos_id=0, bos_id=1, piece_chars=20_000))
    assert len(got) == len(want) > 8
    for (a, n), (b, m) in zip(got, want):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(n, m)
    starts = [k for event, k in engine.log if event == "start"]
    waits = [k for event, k in engine.log if event == "wait"]
    assert starts == waits == list(range(len(starts))) and len(starts) >= 5  # each batch once, in order
    ahead = [engine.log.index(("start", k + 1)) < engine.log.index(("wait", k)) for k in range(len(starts) - 1)]
    assert ahead.count(False) == 1  # one ahead, but across the long document


def test_the_hf_engine_encodes_on_its_own_thread_with_the_same_parts(tok, monkeypatch):
    """hf's submit_ids runs encode_batch_fast on a thread of its own (tokenizers lets go of the GIL), one
    batch at a time in order: the parts equal those of the tokenizer called in place."""
    import threading

    monkeypatch.setattr(text_path, "ENCODE_BATCH_DOCS", 7)
    threads = []
    real = text_path.hf.encode_batch
    monkeypatch.setattr(text_path.hf, "encode_batch",
                        lambda *a: threads.append(threading.current_thread().name) or real(*a))
    texts = sample_texts()[:60]
    engine = text_path.hf.Encoder("unused", tok)
    got = list(text_path.encode_parts(engine, texts, dtype=np.uint16, eos_id=0, bos_id=None))
    in_place = list(threads)
    want = list(text_path.encode_parts(tok, texts, dtype=np.uint16, eos_id=0, bos_id=None))
    assert len(got) == len(want) == 9
    for (a, n), (b, m) in zip(got, want):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(n, m)
    assert len(in_place) == 9 and all(name.startswith("packer-hf") for name in in_place)
    assert threads[9:] == [threading.current_thread().name] * 9  # the plain tokenizer: encoded where called
