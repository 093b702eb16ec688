"""TinyGPT on a packed batch equals each document run alone (loss and parameter gradients); unmasked packing does not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packer import masks  # noqa: E402
from packer.attention import available_backends  # noqa: E402
from packer.train.model import GPTConfig, TinyGPT, next_token_loss  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CPU_TRAINABLE = [n for n, info in available_backends("cpu").items() if info["backward"]]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def packed_batch(seed, n_rows=2, context=48, vocab=97):
    """Rows of random documents (lengths 1..20) flattened into one varlen row, as a varlen collate would."""
    rng = np.random.default_rng(seed)
    docs, rows = [], []
    for _ in range(n_rows):
        lengths, room = [], context
        while room > 0:
            n = int(min(rng.integers(1, 21), room))
            lengths.append(n)
            room -= n
        rows.append(lengths)
        docs += [rng.integers(0, vocab, n) for n in lengths]
    lengths = [n for row in rows for n in row]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.concatenate(docs)
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(masks.labels(ids, offsets)),
        "position_ids": torch.from_numpy(masks.position_ids(offsets)),
        "cu_seqlens": torch.from_numpy(offsets.astype(np.int32)),
        "max_seqlen": max(lengths),
    }, docs


def loss_and_grads(model, **batch):
    model.zero_grad()
    _, loss = model(**batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def per_document_loss_and_grads(model, docs):
    """Each document alone (its own forward), per-token losses summed, then divided by the token count."""
    model.zero_grad()
    total, count = 0.0, 0
    for doc in docs:
        ids = torch.from_numpy(doc)
        labels = masks.labels(doc, [0, len(doc)])
        logits = model(ids, torch.arange(len(doc)), torch.tensor([0, len(doc)], dtype=torch.int32), len(doc))
        total = total + next_token_loss(logits, torch.from_numpy(labels), reduction="sum")
        count += len(doc) - 1
    loss = total / count
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_close_relative(a, b, rel=1e-5):
    assert float((a - b).norm() / b.norm()) <= rel, float((a - b).norm() / b.norm())


@pytest.mark.parametrize("backend", CPU_TRAINABLE)
@pytest.mark.parametrize("cfg", [dict(), dict(n_kv_heads=2, window=5)], ids=["mha", "gqa-window"])
def test_packed_equals_each_document_alone(backend, cfg):
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, backend=backend, **cfg))
    for seed in range(3):
        batch, docs = packed_batch(seed)
        assert len(docs) >= 4
        loss, grads = loss_and_grads(model, **batch)
        ref_loss, ref_grads = per_document_loss_and_grads(model, docs)
        assert_close_relative(loss, ref_loss)
        for name in ref_grads:
            assert_close_relative(grads[name], ref_grads[name])


@pytest.mark.parametrize("backend", CPU_TRAINABLE)
@pytest.mark.parametrize("multiple", [3, 8])
def test_documents_padded_apart_equal_each_document_alone(backend, multiple):
    """ItemFields(pad_multiple=K)'s layout (context parallelism): the model takes cu_seqlens and cu_seqlens_padded
    as Transformer Engine does, and the loss and every gradient are each document's alone, padding adding nothing."""
    from packer.data import collate_varlen, make_items

    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, backend=backend))
    _, docs = packed_batch(7, n_rows=3)
    rows = [docs[:3], docs[3:6], docs[6:]]
    offsets = [np.concatenate([[0], np.cumsum([len(d) for d in row])]) for row in rows]
    items = make_items([np.concatenate(row) for row in rows], offsets, pad_multiple=multiple, pad_id=96)
    batch = collate_varlen(items)
    assert batch["n_tokens"] > sum(len(d) for d in docs)  # some document was padded
    loss, grads = loss_and_grads(model, input_ids=batch["input_ids"][0], position_ids=batch["position_ids"][0],
                                 cu_seqlens=batch["cu_seqlens"], cu_seqlens_padded=batch["cu_seqlens_padded"],
                                 max_seqlen=batch["max_seqlen"], labels=batch["labels"][0])
    ref_loss, ref_grads = per_document_loss_and_grads(model, docs)
    assert_close_relative(loss, ref_loss)
    for name in ref_grads:
        assert_close_relative(grads[name], ref_grads[name])


def test_padded_batch_equals_packed_and_unmasked_packing_differs():
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4))
    batch, docs = packed_batch(5)
    packed_loss, _ = loss_and_grads(model, **batch)

    # (a) one document per row, padded to the longest: the same loss
    L = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), L, dtype=torch.long)
    labels = torch.full((len(docs), L), -100)
    for r, d in enumerate(docs):
        ids[r, : len(d)] = torch.from_numpy(d)
        labels[r, 1 : len(d)] = torch.from_numpy(d[1:])
    padded_loss, _ = loss_and_grads(model, input_ids=ids, labels=labels)
    assert_close_relative(padded_loss, packed_loss)

    # (b) the same packed rows with plain causal attention over each row: documents see each other
    rows = batch["input_ids"].view(2, 48)
    unmasked_loss, _ = loss_and_grads(model, input_ids=rows, labels=batch["labels"].view(2, 48),
                                      position_ids=batch["position_ids"].view(2, 48))
    assert abs(float(unmasked_loss - packed_loss)) > 1e-3 * float(packed_loss)


def test_model_rejects_ambiguous_inputs():
    model = TinyGPT(GPTConfig(vocab_size=11, dim=16, n_layers=1, n_heads=2))
    with pytest.raises(ValueError, match="needs cu_seqlens"):
        model(torch.zeros(5, dtype=torch.long), torch.arange(5))
    with pytest.raises(ValueError, match="takes no cu_seqlens"):
        model(torch.zeros(1, 5, dtype=torch.long), None, torch.tensor([0, 5], dtype=torch.int32), 5)


def test_train_tiny_example_learns_on_the_sample_build(sample_dataset):
    spec = importlib.util.spec_from_file_location("train_tiny", ROOT / "examples" / "train_tiny.py")
    train_tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_tiny)
    losses = train_tiny.train(sample_dataset, steps=5, rows_per_step=1, dim=32, n_layers=1, lr=1e-2, log=None)
    assert len(losses) == 5 and all(np.isfinite(losses))
    assert np.mean(losses[-2:]) < losses[0]
