"""Packed equals alone for fine-tuning: the loss and every parameter gradient of a packed batch of masked
examples (prompt untrained, completion trained) equal the token-weighted per-example computation, for TinyGPT
(float32 1e-5, float64 1e-9; varlen and padded batches; every CPU backend that trains) and for a tiny HF Llama
built from a config (float64). Negative control: the same batch with its mask ignored differs by far more."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from packer.attention import available_backends  # noqa: E402
from packer.data import PackedDataset, collate_padded, collate_varlen, make_items  # noqa: E402
from packer.train.model import GPTConfig, TinyGPT, next_token_loss  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

VOCAB, CONTEXT = 97, 48
CPU_TRAINABLE = [n for n, info in available_backends("cpu").items() if info["backward"]]
TOL = {torch.float32: 1e-5, torch.float64: 1e-9}


def sft_rows(seed, n_rows=3):
    """Rows of examples (length 2..20, the first 0..n-1 tokens a prompt: mask 0) filling a context of 48:
    (tokens per row, offsets per row, mask per row, the examples as (ids, mask))."""
    rng = np.random.default_rng(seed)
    tokens, offsets, row_masks, examples = [], [], [], []
    for _ in range(n_rows):
        lengths, room = [], CONTEXT
        while room >= 2:
            n = int(min(rng.integers(2, 21), room))
            lengths.append(n)
            room -= n
        row = [(rng.integers(0, VOCAB, n), (np.arange(n) >= rng.integers(0, n)).astype(np.uint8)) for n in lengths]
        examples += row
        tokens.append(np.concatenate([ids for ids, _ in row]))
        row_masks.append(np.concatenate([mask for _, mask in row]))
        offsets.append(np.concatenate([[0], np.cumsum(lengths)]))
    return tokens, offsets, row_masks, examples


def packed_batch(rows, *, padded=False, ignore_mask=False):
    """The loader's batch of the rows (collate_varlen, or collate_padded flattened to one packed row)."""
    tokens, offsets, row_masks, _ = rows
    items = make_items(tokens, offsets, loss_masks=None if ignore_mask else row_masks,
                       pad_to=CONTEXT + 5 if padded else None)
    batch = collate_padded(items) if padded else collate_varlen(items)
    return {"input_ids": batch["input_ids"].reshape(-1), "labels": batch["labels"].reshape(-1),
            "position_ids": batch["position_ids"].reshape(-1), "cu_seqlens": batch["cu_seqlens"],
            "max_seqlen": batch["max_seqlen"]}


def gradients(model, loss):
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def per_example(model, examples, dtype):
    """Each example alone: summed loss of its trained targets (t >= 1, mask[t] = 1, predicted from t - 1) over
    the number of trained targets of all examples: the token-weighted mean."""
    total, count = torch.zeros((), dtype=dtype), 0
    for ids, mask in examples:
        n = len(ids)
        logits = model(torch.from_numpy(ids), torch.arange(n), torch.tensor([0, n], dtype=torch.int32), n)
        target = torch.from_numpy(ids[1:])
        losses = F.cross_entropy(logits[:-1].to(dtype), target, reduction="none")
        keep = torch.from_numpy(mask[1:].astype(bool))
        total = total + losses[keep].sum()
        count += int(keep.sum())
    return total / count


def relative(a, b) -> float:
    return float((a - b).norm() / b.norm())


def differences(model, rows, dtype, **batch_args) -> dict:
    """Relative |packed - per example| of the loss and the largest over parameter gradients."""
    batch = packed_batch(rows, **batch_args)
    if dtype == torch.float32:  # the model's own loss (next_token_loss, which computes in float32)
        _, loss = model(**batch)
    else:
        labels = batch.pop("labels")
        loss = F.cross_entropy(model(**batch)[:-1], labels[1:], ignore_index=-100)
    g = gradients(model, loss)
    ref = per_example(model, rows[3], dtype)
    g_ref = gradients(model, ref)
    return {"loss": relative(loss.detach().to(dtype), ref.detach()),
            "grads": max(relative(g[name], g_ref[name]) for name in g)}


def tiny(backend, dtype):
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, backend=backend)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("backend", CPU_TRAINABLE)
@pytest.mark.parametrize("padded", [False, True], ids=["varlen", "padded"])
def test_tiny_model_packed_sft_equals_each_example_alone(backend, dtype, padded):
    model = tiny(backend, dtype)
    for seed in range(3):
        rows = sft_rows(seed)
        untrained = sum(int((m[1:] == 0).sum()) for _, m in rows[3])
        assert len(rows[3]) >= 6 and untrained > 20  # several examples, many prompt tokens
        d = differences(model, rows, dtype, padded=padded)
        assert d["loss"] < TOL[dtype] and d["grads"] < TOL[dtype], d


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_negative_control_mask_ignored(dtype):
    """The same check with the mask dropped from the batch (every token trained) is far off: the gradients by
    half their norm, the loss by 50x the float32 tolerance (a fresh model's per-token losses are all near
    log(vocab), so the loss moves least; measured 2026-12: 8.6e-4 and 0.57)."""
    model = tiny("sdpa", dtype)
    d = differences(model, sft_rows(0), dtype, ignore_mask=True)
    assert d["loss"] > 5e-4 and d["grads"] > 0.1, d


def test_next_token_loss_counts_trained_targets_only():
    """The packed mean divides by trained targets: the same as summing and dividing by their count."""
    rows = sft_rows(7)
    batch = packed_batch(rows)
    logits = torch.randn(len(batch["input_ids"]), VOCAB, dtype=torch.float64)
    n_trained = sum(int(m[1:].sum()) for _, m in rows[3])
    assert int((batch["labels"] != -100).sum()) == n_trained
    total = next_token_loss(logits, batch["labels"], reduction="sum")
    assert torch.allclose(next_token_loss(logits, batch["labels"]), total / n_trained, rtol=1e-12)


# -- a tiny HF Llama built from a config (no download) -------------------------------------


def llama(attn, vocab=VOCAB):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=4 * CONTEXT)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=attn, dtype=torch.float64).train()


def hf_rows_batch(rows, *, ignore_mask=False):
    from packer.hf import collate_hf

    tokens, offsets, row_masks, _ = rows
    return collate_hf(make_items(tokens, offsets, loss_masks=None if ignore_mask else row_masks))


def hf_differences(model, batch, examples) -> dict:
    """|packed - per example| of the float64 loss, HF's own .loss and the largest parameter gradient."""
    out = model(**batch)
    labels = batch["labels"][0]
    loss = F.cross_entropy(out.logits[0, :-1], labels[1:], ignore_index=-100)  # float64: HF's .loss is float32
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)
    total, count = 0.0, 0
    for ids, mask in examples:
        logits = model(input_ids=torch.from_numpy(ids)[None], use_cache=False).logits[0]
        keep = torch.from_numpy(mask[1:].astype(bool))
        total = total + F.cross_entropy(logits[:-1], torch.from_numpy(ids[1:]), reduction="none")[keep].sum()
        count += int(keep.sum())
    ref = total / count
    ref_grads = torch.autograd.grad(ref, params)
    return {"loss": abs((loss - ref).item()), "hf_loss": abs((out.loss.double() - ref).item()),
            "grads": max(float((a - b).abs().max()) for a, b in zip(grads, ref_grads))}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hf_llama_packed_sft_equals_each_example_alone(attn):
    rows = sft_rows(1)
    d = hf_differences(llama(attn), hf_rows_batch(rows), rows[3])
    tol = 1e-9 if attn == "sdpa" else 1e-6  # eager takes its softmax in float32 (tests/train/test_hf.py)
    assert d["loss"] < tol and d["grads"] < tol and d["hf_loss"] < 2e-5, d


def test_hf_llama_negative_control_mask_ignored():
    rows = sft_rows(1)
    d = hf_differences(llama("sdpa"), hf_rows_batch(rows, ignore_mask=True), rows[3])
    assert d["loss"] > 1e-3 and d["grads"] > 1e-4, d


# -- through the loader: a stored dataset with masks ---------------------------------------


@pytest.fixture(scope="module")
def masked_dataset(tmp_path_factory):
    from masked_data import build_masked

    return build_masked(tmp_path_factory.mktemp("sft-train") / "ds")


def stored_examples(path, rows):
    """The stored segments of `rows` with their stored masks: what each example is alone."""
    from packer.store.dataset import open_dataset

    ds = open_dataset(path)
    (tokens, offsets), masks = ds.views(rows), ds.mask_views(rows)
    return [(t[a:b].astype(np.int64), m[a:b]) for t, o, m in zip(tokens, offsets, masks)
            for a, b in zip(o[:-1].tolist(), o[1:].tolist())]


def test_loader_batches_train_as_each_stored_example_alone(masked_dataset):
    """PackedDataset(batch_size=3) on a dataset with masks: TinyGPT's float64 loss and gradients, and a config-built
    Llama's, equal the stored examples run alone."""
    from packer.hf import collate_hf

    batches = list(PackedDataset(masked_dataset, shuffle=False, batch_size=3))
    k = max(range(len(batches)), key=lambda j: len(batches[j]["cu_seqlens"]))  # the batch with most segments
    rows = np.arange(3 * k, min(3 * k + 3, len(PackedDataset(masked_dataset))))
    examples = stored_examples(masked_dataset, rows)
    assert len(examples) >= 4 and sum(int((m[1:] == 0).sum()) for _, m in examples) > 30
    batch = {key: (v.reshape(-1) if key in ("input_ids", "labels", "position_ids") else v)
             for key, v in batches[k].items()}
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=16384, dim=32, n_layers=1, n_heads=4, backend="sdpa")).double()
    labels = batch.pop("labels")
    loss = F.cross_entropy(model(**batch)[:-1], labels[1:], ignore_index=-100)
    g = gradients(model, loss)
    ref = per_example(model, examples, torch.float64)
    g_ref = gradients(model, ref)
    assert relative(loss.detach(), ref.detach()) < 1e-9
    assert max(relative(g[name], g_ref[name]) for name in g) < 1e-9
    hf = list(PackedDataset(masked_dataset, shuffle=False, batch_size=3, collate_fn=collate_hf))[k]
    d = hf_differences(llama("sdpa", vocab=16384), hf, examples)
    assert d["loss"] < 1e-9 and d["grads"] < 1e-9 and d["hf_loss"] < 2e-5, d
