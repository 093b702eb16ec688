"""Context-parallel layouts (ItemFields(pad_multiple=K)) against a brute-force reference, and seq_idx against
transformers' DataCollatorWithFlattening(return_seq_idx=True).

The reference walks each row token by token: where every real token lands once its documents are padded to
multiples of K, and what it is, predicts and sees when unpadded. The padded item must keep all three for every
real token; its padding must train nothing and see only its own run of padding.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from packer import masks  # noqa: E402
from packer.data import ItemFields, PackedDataset, collate_padded, collate_varlen, make_item, make_items  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402

MULTIPLES = [1, 2, 3, 8, 128]


def _random_rows(rng, n_rows, max_docs=5, max_len=20):
    rows = []
    for _ in range(n_rows):
        lengths = rng.integers(1, max_len, size=rng.integers(1, max_docs + 1))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        rows.append((rng.integers(0, 60000, size=int(offsets[-1])).astype(np.uint16), offsets))
    return rows


def _unpadded(tokens, offsets, loss_mask):
    """Per real token, written plainly: (input id, label, position, the real tokens it attends to)."""
    out = []
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        for t in range(a, b):
            trained = loss_mask is None or loss_mask[t] != 0
            label = int(tokens[t]) if t > a and trained else -100
            out.append((int(tokens[t]), label, t - a, set(range(a, t + 1))))
    return out


def _places(offsets, multiple):
    """Where each real token of the row lies once every document is padded to a multiple; the padded length."""
    places, start = [], 0
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        places += [start + t - a for t in range(a, b)]
        start += -(-(b - a) // multiple) * multiple
    return places, start


def _check_item(item, tokens, offsets, multiple, pad_to, pad_id, loss_mask=None):
    """Every property the issue names, against the plain walk above."""
    places, padded_len = _places(offsets, multiple)
    length = padded_len if pad_to is None else pad_to
    ids, labels, pos = (item[k].tolist() for k in ("input_ids", "labels", "position_ids"))
    mask = item["attention_mask"].numpy()
    assert len(ids) == length == item["n_tokens"] and type(item["n_tokens"]) is int
    # every real token: the same id, label, position, and the same keys (moved to their places)
    for i, (token, label, position, keys) in enumerate(_unpadded(tokens, offsets, loss_mask)):
        p = places[i]
        assert (ids[p], labels[p], pos[p]) == (token, label, position)
        assert set(np.flatnonzero(mask[p]).tolist()) == {places[k] for k in keys}
    # padding: the pad id, trains nothing, sees only its own run of padding up to itself (a document's
    # padding, or pad_to's tail after the last document's)
    padding = sorted(set(range(length)) - set(places))
    run_start = previous = None
    for p in padding:  # in order: a run goes on while the token before is padding too
        if p - 1 != previous or p == padded_len:
            run_start = p
        previous = p
        assert ids[p] == pad_id and labels[p] == -100
        assert set(np.flatnonzero(mask[p]).tolist()) == set(range(run_start, p + 1))
    # boundaries: real tokens counted per document, padded ones where each document lies (+ pad_to's tail)
    lengths = np.diff(offsets).tolist()
    real = [0] + np.cumsum(lengths).tolist()
    padded = [0] + np.cumsum([-(-n // multiple) * multiple for n in lengths]).tolist()
    if length > padded_len:  # the tail after the last document: one more sequence, as without pad_multiple
        real, padded = real + [real[-1] + length - padded_len], padded + [length]
    assert item["cu_seqlens"].tolist() == real and item["cu_seqlens_padded"].tolist() == padded
    assert item["cu_seqlens"].dtype == item["cu_seqlens_padded"].dtype == torch.int32
    assert all(d % multiple == 0 for d in np.diff(padded[:len(lengths) + 1]))
    assert item["max_seqlen"] == max(np.diff(padded)) and type(item["max_seqlen"]) is int
    # the layout the model attends by, from the pair alone, is the dense mask's
    segments = masks.padded_segments(item["cu_seqlens"], item["cu_seqlens_padded"])
    assert np.array_equal(masks.block_causal_mask(segments).numpy(), mask)
    assert item["document_ids"].tolist() == masks.document_ids(segments).tolist()
    assert item["seq_idx"].dtype == torch.int32 and item["seq_idx"].tolist() == item["document_ids"].tolist()
    return len(padding)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), multiple=st.sampled_from(MULTIPLES), with_pad_to=st.booleans(),
       with_mask=st.booleans())
def test_padded_items_against_brute_force(seed, multiple, with_pad_to, with_mask):
    rng = np.random.default_rng(seed)
    rows = _random_rows(rng, int(rng.integers(1, 5)))
    longest = max(_places(o, multiple)[1] for _, o in rows)
    pad_to = -(-longest // multiple) * multiple + multiple * int(rng.integers(0, 3)) if with_pad_to else None
    loss_masks = [rng.integers(0, 2, len(t)).astype(np.uint8) for t, _ in rows] if with_mask else None
    kw = dict(pad_to=pad_to, pad_id=7, pad_multiple=multiple, return_attention_mask=True, return_document_ids=True,
              return_seq_idx=True)
    items = make_items([t for t, _ in rows], [o for _, o in rows], loss_masks=loss_masks, **kw)
    for k, ((tokens, offsets), item) in enumerate(zip(rows, items)):
        mask = None if loss_masks is None else loss_masks[k]
        _check_item(item, tokens, offsets, multiple, pad_to, 7, mask)
        alone = make_item(tokens, offsets, loss_mask=mask, **kw)  # one row alone: the same item
        assert {k: v.tolist() if torch.is_tensor(v) else v for k, v in alone.items()} == \
            {k: v.tolist() if torch.is_tensor(v) else v for k, v in item.items()}


def test_padding_is_exercised_by_hand():
    """[a a a | b b], K = 4, pad_to 12: the docstring's picture."""
    item = make_item(np.array([5, 6, 7, 8, 9], np.uint16), np.array([0, 3, 5]), pad_multiple=4, pad_to=12, pad_id=1,
                     return_attention_mask=True, return_document_ids=True, return_seq_idx=True,
                     role_ids=np.array([1, 1, 2, 2, 2]))
    assert item["input_ids"].tolist() == [5, 6, 7, 1, 8, 9, 1, 1, 1, 1, 1, 1]
    assert item["labels"].tolist() == [-100, 6, 7, -100, -100, 9] + [-100] * 6
    assert item["position_ids"].tolist() == [0, 1, 2, 0, 0, 1, 0, 1, 0, 1, 2, 3]
    assert item["cu_seqlens"].tolist() == [0, 3, 5, 9] and item["cu_seqlens_padded"].tolist() == [0, 4, 8, 12]
    assert item["role_ids"].tolist() == [1, 1, 2, 255, 2, 2] + [255] * 6
    assert item["max_seqlen"] == 4 and item["n_tokens"] == 12
    assert _check_item(item, np.array([5, 6, 7, 8, 9]), np.array([0, 3, 5]), 4, 12, 1) == 7


def test_pad_multiple_none_adds_nothing_and_one_changes_no_token():
    rng = np.random.default_rng(5)
    rows = _random_rows(rng, 6)
    tokens, offsets = [t for t, _ in rows], [o for _, o in rows]
    for pad_to in (None, 120):
        plain = make_items(tokens, offsets, pad_to=pad_to, return_document_ids=True)
        assert all(set(it) == {"input_ids", "labels", "position_ids", "document_ids", "cu_seqlens", "max_seqlen"}
                   for it in plain)
        ones = make_items(tokens, offsets, pad_to=pad_to, return_document_ids=True, pad_multiple=1)
        for a, b in zip(plain, ones):
            for key in a:
                assert (torch.equal(a[key], b[key]) if torch.is_tensor(a[key]) else a[key] == b[key]), key
            assert torch.equal(b["cu_seqlens_padded"], a["cu_seqlens"]) and b["n_tokens"] == len(a["input_ids"])


def test_pad_multiple_checked_at_the_edge():
    for bad in (0, -2, 2.0, True, "8"):
        with pytest.raises(ValueError, match="pad_multiple must be a number of tokens >= 1"):
            ItemFields(pad_multiple=bad)
    with pytest.raises(ValueError, match="pad_to=100 is not a multiple of pad_multiple=8.*pad_to=104"):
        ItemFields(pad_to=100, pad_multiple=8)
    with pytest.raises(ValueError, match="pad_to=100 is not a multiple of pad_multiple=8"):
        make_item(np.arange(5), [0, 5], pad_to=100, pad_multiple=8)
    # a row that fits pad_to unpadded, but not with its documents padded: refused, naming both
    with pytest.raises(ValueError, match="pad_to=8 is shorter than a row of 16 tokens with its documents padded"):
        make_item(np.arange(6), [0, 3, 6], pad_to=8, pad_multiple=8)


# -- collates ------------------------------------------------------------------------------


def _flat_reference(items):
    """The items laid end to end, by hand: real boundaries run on by real tokens, padded ones by length."""
    real, padded, n = [0], [0], 0
    for it in items:
        for d in it["cu_seqlens"].diff().tolist():
            real.append(real[-1] + d)
        for d in it["cu_seqlens_padded"].diff().tolist():
            padded.append(padded[-1] + d)
        n += len(it["input_ids"])
    return real, padded, n


@pytest.mark.parametrize("multiple", [2, 8])
def test_collates_carry_the_padded_layout(multiple):
    rng = np.random.default_rng(multiple)
    rows = _random_rows(rng, 5)
    kw = dict(pad_multiple=multiple, return_document_ids=True, return_seq_idx=True)
    items = make_items([t for t, _ in rows], [o for _, o in rows], **kw)
    for order in (items, items[::-1]):  # a block run (views) and a shuffled batch (copies)
        batch = collate_varlen(order)
        real, padded, n = _flat_reference(order)
        assert batch["cu_seqlens"].tolist() == real and batch["cu_seqlens_padded"].tolist() == padded
        assert batch["n_tokens"] == n == batch["input_ids"].shape[1] and type(batch["n_tokens"]) is int
        assert batch["max_seqlen"] == max(it["max_seqlen"] for it in order)
        assert batch["input_ids"][0].tolist() == sum((it["input_ids"].tolist() for it in order), [])
        segments = masks.padded_segments(batch["cu_seqlens"], batch["cu_seqlens_padded"])
        assert batch["document_ids"][0].tolist() == masks.document_ids(segments).tolist()  # across the batch
        assert batch["seq_idx"].dtype == torch.int32 and batch["seq_idx"].tolist() == batch["document_ids"].tolist()
    L = -(-max(len(it["input_ids"]) for it in items) // multiple) * multiple + multiple
    items = make_items([t for t, _ in rows], [o for _, o in rows], pad_to=L, **kw)
    for order in (items, items[::-1]):
        batch = collate_padded(order)
        real, padded, n = _flat_reference(order)
        assert batch["input_ids"].shape == (5, L) and batch["n_tokens"] == n == 5 * L
        assert batch["cu_seqlens"].tolist() == real and batch["cu_seqlens_padded"].tolist() == padded
        assert batch["seq_idx"].tolist() == [it["seq_idx"].tolist() for it in order]  # row-local, as document_ids


def test_packed_dataset_items_and_batches(sample_dataset):
    raw = open_dataset(sample_dataset)
    fields = ItemFields(pad_multiple=8, seq_idx=True)
    ds = PackedDataset(sample_dataset, shuffle=False, fields=fields)
    n_padded = 0
    for i, item in enumerate(ds):
        tokens, offsets = raw[i]
        ref = make_item(tokens, offsets, pad_multiple=8, return_seq_idx=True, pad_id=ds.pad_id)
        assert item.keys() == ref.keys()
        assert all(torch.equal(item[k], ref[k]) if torch.is_tensor(ref[k]) else item[k] == ref[k] for k in ref)
        n_padded += item["n_tokens"] > len(tokens)
    assert n_padded > 0 and i == len(raw) - 1
    batches = list(PackedDataset(sample_dataset, shuffle=False, fields=fields, batch_size=4))
    items = list(ds)
    by_items = [collate_varlen(items[k:k + 4]) for k in range(0, len(raw), 4)]
    for a, b in zip(batches, by_items):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


def test_packed_dataset_padded_batches_and_a_short_pad_to(sample_dataset):
    """collate_padded batches cut from the blocks equal the items stacked; a pad_to that a row's padded documents
    outgrow is refused at that row, in one line naming both."""
    raw = open_dataset(sample_dataset)
    longest = max(int(masks.cu_seqlens(raw[i][1])[-1]) + 8 * (len(raw[i][1]) - 1) for i in range(len(raw)))
    fields = ItemFields(pad_multiple=8, pad_to=-(-longest // 8) * 8, seq_idx=True)
    items = list(PackedDataset(sample_dataset, shuffle=False, fields=fields))
    for k, batch in enumerate(PackedDataset(sample_dataset, shuffle=False, fields=fields, batch_size=4,
                                            collate_fn=collate_padded)):
        ref = collate_padded([dict(it) for it in items[4 * k:4 * k + 4]])  # plain dicts: the copying path
        assert batch.keys() == ref.keys() and batch["input_ids"].shape[1] == fields.pad_to
        assert all(torch.equal(batch[key], ref[key]) if torch.is_tensor(ref[key]) else batch[key] == ref[key]
                   for key in ref)
    context = int(PackedDataset(sample_dataset).context_length)
    with pytest.raises(ValueError, match=f"pad_to={context} is shorter than a row of .* documents padded"):
        list(PackedDataset(sample_dataset, shuffle=False, fields=ItemFields(pad_multiple=128, pad_to=context)))


# -- seq_idx: transformers' own collator ------------------------------------------------------


def test_seq_idx_equals_transformers_flattening_collator():
    transformers = pytest.importorskip("transformers")
    rng = np.random.default_rng(11)
    rows = _random_rows(rng, 4)
    items = make_items([t for t, _ in rows], [o for _, o in rows], return_seq_idx=True)
    docs = [{"input_ids": t[a:b].astype(np.int64).tolist()} for t, o in rows for a, b in zip(o[:-1], o[1:])]
    theirs = transformers.DataCollatorWithFlattening(return_seq_idx=True, return_flash_attn_kwargs=True)(docs)
    from packer.hf import collate_hf

    for ours in (collate_varlen(items), collate_varlen([dict(it) for it in items]), collate_hf(items)):
        assert ours["seq_idx"].dtype == theirs["seq_idx"].dtype == torch.int32
        for key in ("input_ids", "labels", "position_ids", "seq_idx"):
            assert torch.equal(ours[key], theirs[key]), key
    hf = collate_hf(items)
    assert torch.equal(hf["cu_seq_lens_q"], theirs["cu_seq_lens_q"]) and hf["max_length_q"] == theirs["max_length_q"]
    assert len(docs) > len(rows)  # several documents a row: the index runs on across rows


def test_online_packing_pads_documents_too():
    """OnlinePackedDataset takes the same ItemFields: each item is its unpadded twin's row, padded per document."""
    from packer.config import BuildConfig
    from packer.train.online import OnlinePackedDataset

    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 500, n).tolist() for n in rng.integers(1, 40, 120)]
    config = BuildConfig(context_length=64, eos=False, seed=1)
    plain = list(OnlinePackedDataset(docs, config=config, buffer_docs=30, fields=ItemFields(document_ids=True)))
    padded = list(OnlinePackedDataset(docs, config=config, buffer_docs=30,
                                      fields=ItemFields(pad_multiple=8, seq_idx=True, document_ids=True)))
    assert len(plain) == len(padded) > 10
    for a, b in zip(plain, padded):
        ref = make_item(a["input_ids"].numpy(), a["cu_seqlens"].numpy(), pad_multiple=8, pad_id=0,
                        return_seq_idx=True, return_document_ids=True)
        assert b.keys() == ref.keys()
        assert all(torch.equal(b[k], ref[k]) if torch.is_tensor(ref[k]) else b[k] == ref[k] for k in ref)


# -- attention kernels on the padded layout ---------------------------------------------------------


def _padded_attention_case(device, dtype, multiple=8, heads=4, kv_heads=2, head_dim=32, seed=0):
    """q [N, H, D], k, v [N, K, D] over a collate_varlen batch of random rows with documents padded apart."""
    rng = np.random.default_rng(seed)
    rows = _random_rows(rng, 4, max_docs=4, max_len=60)
    batch = collate_varlen(make_items([t for t, _ in rows], [o for _, o in rows], pad_multiple=multiple))
    g = torch.Generator().manual_seed(seed)
    n = batch["n_tokens"]
    q, k, v = (torch.randn(n, h, head_dim, generator=g).to(device, dtype) for h in (heads, kv_heads, kv_heads))
    return q, k, v, batch


def _real_reference(q, k, v, batch):
    """{place: float64 output} of every real token, each real document alone (causal, grouped-query heads repeated)."""
    real, padded = batch["cu_seqlens"].tolist(), batch["cu_seqlens_padded"].tolist()
    repeat = q.shape[1] // k.shape[1]
    out = {}
    for a, b, p in zip(real[:-1], real[1:], padded[:-1]):
        qd, kd, vd = (x[p:p + b - a].double().cpu().transpose(0, 1) for x in (q, k, v))
        kd, vd = kd.repeat_interleave(repeat, 0), vd.repeat_interleave(repeat, 0)
        doc = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True).transpose(0, 1)
        out.update({p + t: doc[t] for t in range(b - a)})
    return out


def _max_real_difference(out, reference) -> float:
    places = sorted(reference)
    return (out[places].double().cpu() - torch.stack([reference[p] for p in places])).abs().max().item()


def test_varlen_attention_on_padded_segments_cpu():
    """The CPU twin of the CUDA check below: packer's varlen_attention given masks.padded_segments of the pair."""
    from packer.attention import varlen_attention

    q, k, v, batch = _padded_attention_case("cpu", torch.float32)
    assert batch["n_tokens"] > batch["cu_seqlens"][-1]  # padding between documents
    segments = masks.padded_segments(batch["cu_seqlens"], batch["cu_seqlens_padded"])
    out = varlen_attention(q, k, v, segments, batch["max_seqlen"])
    assert _max_real_difference(out, _real_reference(q, k, v, batch)) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (benchmarks/gpu_check.sh runs it; CPU twin above)")
def test_padded_layout_on_cuda_kernels():
    """Transformer Engine's THD attention given the item's pair as cu_seqlens_q / cu_seqlens_q_padded (where it
    imports), and packer's varlen_attention on CUDA (flash-attn or torch varlen) given padded_segments, each
    against the float64 per-document reference at every real token."""
    from packer.attention import varlen_attention

    q, k, v, batch = _padded_attention_case("cuda", torch.bfloat16)
    reference = _real_reference(q, k, v, batch)
    segments = masks.padded_segments(batch["cu_seqlens"], batch["cu_seqlens_padded"]).cuda()
    assert _max_real_difference(varlen_attention(q, k, v, segments, batch["max_seqlen"]), reference) < 2e-2
    te = pytest.importorskip("transformer_engine.pytorch", reason="transformer_engine does not import here")
    attention = te.DotProductAttention(q.shape[1], q.shape[2], num_gqa_groups=k.shape[1],
                                       attn_mask_type="padding_causal", qkv_format="thd", attention_dropout=0.0)
    real, padded = batch["cu_seqlens"].cuda(), batch["cu_seqlens_padded"].cuda()
    theirs = attention(q, k, v, cu_seqlens_q=real, cu_seqlens_kv=real, cu_seqlens_q_padded=padded,
                       cu_seqlens_kv_padded=padded, max_seqlen_q=batch["max_seqlen"],
                       max_seqlen_kv=batch["max_seqlen"]).reshape(q.shape)
    assert _max_real_difference(theirs, reference) < 2e-2
