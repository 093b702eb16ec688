"""Loss masks -> labels: -100 exactly at document starts, padding and untrained tokens, checked against a
per-token reference on hand cases and seeded random blocks; an all-ones mask gives today's labels; the
collates, the batch path and OnlinePackedDataset (pre-tokenized examples, split pieces, carry, resume) keep it."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from masked_data import build_masked  # noqa: E402

from packer import masks  # noqa: E402
from packer.config import BuildConfig  # noqa: E402
from packer.data import ItemFields, PackedDataset, collate_padded, collate_varlen, make_item, make_items  # noqa: E402
from packer.online_pack import CarryPolicy  # noqa: E402
from packer.store.dataset import open_dataset  # noqa: E402
from packer.store.formats import FORMATS  # noqa: E402
from packer.train.items import (  # noqa: E402
    _block_batch,
    _make_block,
)
from packer.train.online import OnlinePackedDataset  # noqa: E402

IGNORE = -100


def reference_labels(tokens, offsets, mask, length):
    """The rule, token by token: labels[i] = tokens[i] unless i starts a document, is padding, or mask[i] == 0."""
    starts = set(int(o) for o in offsets[:-1])
    out = []
    for i in range(length):
        trained = i < len(tokens) and i not in starts and (mask is None or mask[i] != 0)
        out.append(int(tokens[i]) if trained else IGNORE)
    return out


def random_rows(seed, n_rows=12, context=40, vocab=50):
    """(tokens uint16, offsets int32, mask uint8 or None) rows of 1..5 documents, each a prompt then a completion."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        lengths = rng.integers(1, 12, rng.integers(1, 6))
        lengths = lengths[np.cumsum(lengths) <= context] if lengths.sum() > context else lengths
        lengths = lengths if len(lengths) else np.array([context])
        mask = np.concatenate([(np.arange(n) >= rng.integers(0, n + 1)).astype(np.uint8) for n in lengths])
        tokens = rng.integers(0, vocab, int(lengths.sum())).astype(np.uint16)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        rows.append((tokens, offsets, None if rng.random() < 0.2 else mask))
    return rows


# -- hand cases ----------------------------------------------------------------------------


def test_prompt_completion_hand_case():
    """The module docstring's row: [p p c c | q d] with mask [0 0 1 1 | 0 1], padded to 8."""
    item = make_item(np.array([11, 12, 21, 22, 13, 23], np.uint16), np.array([0, 4, 6], np.int32),
                     loss_mask=np.array([0, 0, 1, 1, 0, 1], np.uint8), pad_to=8, pad_id=0)
    assert item["input_ids"].tolist() == [11, 12, 21, 22, 13, 23, 0, 0]
    assert item["labels"].tolist() == [IGNORE, IGNORE, 21, 22, IGNORE, 23, IGNORE, IGNORE]
    assert item["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 0, 1]
    assert item["cu_seqlens"].tolist() == [0, 4, 6, 8]


def test_an_untrained_token_is_never_a_target_but_stays_an_input():
    """mask 0 in the middle of a document (a user turn between assistant turns): its label only goes."""
    item = make_item(np.arange(1, 7), [0, 6], loss_mask=np.array([1, 1, 0, 0, 1, 1], np.uint8))
    assert item["input_ids"].tolist() == [1, 2, 3, 4, 5, 6]
    assert item["labels"].tolist() == [IGNORE, 2, IGNORE, IGNORE, 5, 6]


def test_all_trained_mask_gives_todays_labels_exactly():
    for seed in range(5):
        rows = random_rows(seed)
        tokens, offsets = [t for t, _, _ in rows], [o for _, o, _ in rows]
        for pad_to in (None, 48):
            plain = make_items(tokens, offsets, pad_to=pad_to, return_document_ids=True)
            ones = make_items(tokens, offsets, loss_masks=[np.ones(len(t), np.uint8) for t in tokens], pad_to=pad_to,
                              return_document_ids=True)
            nones = make_items(tokens, offsets, loss_masks=[None] * len(tokens), pad_to=pad_to,
                               return_document_ids=True)
            for a, b, c in zip(plain, ones, nones):
                assert a.keys() == b.keys() == c.keys()
                for key in a:
                    if torch.is_tensor(a[key]):
                        assert torch.equal(a[key], b[key]) and torch.equal(a[key], c[key]), key
                    else:
                        assert a[key] == b[key] == c[key], key


def test_a_mask_of_another_length_is_refused():
    with pytest.raises(ValueError, match="loss mask of 4 values for a row of 5 tokens"):
        make_item(np.arange(5), [0, 5], loss_mask=np.ones(4, np.uint8))
    with pytest.raises(ValueError, match="1 loss masks for 2 rows"):
        make_items([np.arange(5), np.arange(3)], [[0, 5], [0, 3]], loss_masks=[None])


# -- random blocks against the reference ---------------------------------------------------


@pytest.mark.parametrize("pad_to", [None, 40, 64], ids=["unpadded", "pad-context", "pad-more"])
def test_labels_equal_the_reference_on_random_blocks(pad_to):
    untrained_inside = padded_rows = unmasked_rows = 0
    for seed in range(20):
        rows = random_rows(seed)
        items = make_items([t for t, _, _ in rows], [o for _, o, _ in rows], loss_masks=[m for _, _, m in rows],
                           pad_to=pad_to, pad_id=7)
        for (tokens, offsets, mask), item in zip(rows, items):
            length = pad_to or len(tokens)
            assert item["labels"].tolist() == reference_labels(tokens, offsets, mask, length)
            assert item["input_ids"].tolist() == tokens.tolist() + [7] * (length - len(tokens))
            starts = set(offsets[:-1].tolist())
            untrained_inside += 0 if mask is None else sum(1 for i in np.flatnonzero(mask == 0) if i not in starts)
            padded_rows += length > len(tokens)
            unmasked_rows += mask is None
    assert untrained_inside > 100 and unmasked_rows > 5  # the property was exercised
    assert padded_rows > 100 if pad_to else padded_rows == 0


def test_masks_labels_the_leaf_reference_equals_the_block_builder():
    """packer.masks.labels / batch_labels (row by row, numpy and torch) give make_items' labels."""
    for seed in range(5):
        rows = random_rows(seed)
        items = make_items([t for t, _, _ in rows], [o for _, o, _ in rows], loss_masks=[m for _, _, m in rows],
                           pad_to=40)
        ids_BL = torch.stack([item["input_ids"] for item in items])
        batch = masks.batch_labels(ids_BL, [o for _, o, _ in rows], [m for _, _, m in rows])
        assert torch.equal(batch, torch.stack([item["labels"] for item in items]))
        for (tokens, offsets, mask), item in zip(rows, items):
            assert masks.labels(item["input_ids"].numpy(), offsets, mask).tolist() == item["labels"].tolist()
            assert torch.equal(masks.labels(item["input_ids"], torch.from_numpy(offsets), mask), item["labels"])
    with pytest.raises(ValueError, match="a loss mask of 3 values for a row of 4 tokens"):
        masks.labels(np.arange(6), [0, 4], [1, 1, 0])


def test_mask_dtypes_bool_and_int_are_read_as_nonzero_trained():
    tokens, offsets = np.arange(1, 6), [0, 5]
    expected = [IGNORE, IGNORE, 3, IGNORE, 5]
    for mask in ([1, 0, 1, 0, 1], np.array([True, False, True, False, True]), np.array([1, 0, 1, 0, 1], np.int64)):
        assert make_item(tokens, offsets, loss_mask=mask)["labels"].tolist() == expected


# -- collates and the batch path -----------------------------------------------------------


def test_collates_and_block_batches_keep_the_masked_labels():
    rows = random_rows(3, n_rows=8)
    tokens, offsets, loss_masks = [t for t, _, _ in rows], [o for _, o, _ in rows], [m for _, _, m in rows]
    expected = [reference_labels(t, o, m, 40) for t, o, m in rows]
    items = make_items(tokens, offsets, loss_masks=loss_masks, pad_to=40)
    padded = collate_padded(items[2:6])
    assert padded["labels"].tolist() == expected[2:6]
    varlen = collate_varlen(items[2:6])
    assert varlen["labels"][0].tolist() == sum(expected[2:6], [])
    alone = [make_item(t, o, loss_mask=m, pad_to=40) for t, o, m in rows[2:6]]  # not one block: the copy path
    assert collate_varlen(alone)["labels"][0].tolist() == sum(expected[2:6], [])
    assert collate_padded(alone)["labels"].tolist() == expected[2:6]
    block = _make_block(tokens, offsets, 40, 0, False, loss_masks=loss_masks)  # what PackedDataset(batch_size=B) cuts
    assert _block_batch(block, 2, 6, padded=True)["labels"].tolist() == expected[2:6]
    assert _block_batch(block, 2, 6, padded=False)["labels"][0].tolist() == sum(expected[2:6], [])


def test_the_mask_scratch_is_not_shared_between_blocks():
    """Scratch arrays are reused between calls: a later block must not change an earlier block's labels."""
    rows = random_rows(4)
    first = make_items([t for t, _, _ in rows], [o for _, o, _ in rows], loss_masks=[m for _, _, m in rows])
    before = [item["labels"].clone() for item in first]
    other = random_rows(5)
    make_items([t for t, _, _ in other], [o for _, o, _ in other], loss_masks=[np.zeros(len(t), np.uint8)
                                                                              for t, _, _ in other])
    assert all(torch.equal(a["labels"], b) for a, b in zip(first, before))


# -- PackedDataset on a stored dataset with masks ------------------------------------------


@pytest.fixture(scope="module", params=FORMATS)
def masked_dataset(request, tmp_path_factory):
    return build_masked(tmp_path_factory.mktemp("sft") / request.param, fmt=request.param)


def stored_reference(path, pad_to=None):
    """Row index -> the reference labels of that row, from the reader's tokens, offsets and masks."""
    ds = open_dataset(path)
    rows = np.arange(len(ds))
    (tokens, offsets), masks = ds.views(rows), ds.mask_views(rows)
    return [reference_labels(t, o, m, pad_to or len(t)) for t, o, m in zip(tokens, offsets, masks)]


def test_packed_dataset_items_and_batches_follow_the_stored_mask(masked_dataset):
    ds = open_dataset(masked_dataset)
    assert ds.has_loss_mask
    order = PackedDataset(masked_dataset, seed=1).epoch_rows({"rank": 0, "world_size": 1, "worker": 0,
                                                               "num_workers": 1})
    for pad_to in (None, 160):
        want = stored_reference(masked_dataset, pad_to)
        items = list(PackedDataset(masked_dataset, seed=1, fields=ItemFields(pad_to=pad_to)))
        assert [item["labels"].tolist() for item in items] == [want[i] for i in order.tolist()]
        collate = collate_padded if pad_to else collate_varlen
        batches = list(PackedDataset(masked_dataset, seed=1, batch_size=5, collate_fn=collate,
                                     fields=ItemFields(pad_to=pad_to)))
        got = [row for b in batches for row in (b["labels"].tolist() if pad_to else [b["labels"][0].tolist()])]
        if pad_to:
            assert got == [want[i] for i in order.tolist()]
        else:  # a varlen batch is its rows back to back
            flat = [sum((want[i] for i in order[k:k + 5].tolist()), []) for k in range(0, len(order), 5)]
            assert got == flat
    untrained = sum(lab.count(IGNORE) - len(o) + 1 for lab, o in zip(stored_reference(masked_dataset),
                                                                       ds.views(np.arange(len(ds)))[1]))
    assert untrained > 1000  # the masks left many tokens untrained beyond the document starts


def test_hf_batches_follow_the_stored_mask(masked_dataset):
    pytest.importorskip("transformers")
    from packer.hf import HFBatches

    want = stored_reference(masked_dataset)
    ds = PackedDataset(masked_dataset, shuffle=False)
    batches = list(HFBatches(ds, 4, return_row_ids=True))
    for batch in batches:
        assert batch["labels"][0].tolist() == sum((want[i] for i in batch["row_ids"].tolist()), [])


# -- OnlinePackedDataset -------------------------------------------------------------------


def sft_examples(seed, n, high=30):
    """Pre-tokenized examples with globally unique ids 1, 2, ...; a token is trained iff its id % 3 != 0, so
    every label can be checked from the id alone after packing, splitting and carrying."""
    lengths = np.random.default_rng(seed).integers(1, high, n)
    starts = np.concatenate([[1], 1 + np.cumsum(lengths)])
    ids = [np.arange(a, a + k) for a, k in zip(starts.tolist(), lengths.tolist())]
    return [{"input_ids": x.tolist(), "loss_mask": (x % 3 != 0).astype(np.uint8).tolist()} for x in ids]


def check_online_item(item, padded=False):
    """Every label is -100 at a segment start, on padding (with `padded`: the last segment) and on ids % 3 == 0,
    else the id."""
    ids, labels, cu = item["input_ids"].tolist(), item["labels"].tolist(), item["cu_seqlens"].tolist()
    real = cu[-2] if padded else len(ids)
    starts = set(cu[:-1])
    for i, (t, lab) in enumerate(zip(ids, labels)):
        trained = i not in starts and i < real and t % 3 != 0
        assert lab == (t if trained else IGNORE), (i, t, lab)


@pytest.mark.parametrize("long_docs", ["split", "truncate"])
def test_online_pre_tokenized_examples_keep_their_masks(long_docs):
    examples = sft_examples(0, 300)
    ds = OnlinePackedDataset(examples, config=BuildConfig(context_length=16, eos=False, long_docs=long_docs),
                             buffer_docs=64)
    items = list(ds)
    for item in items:
        check_online_item(item)
    got = sorted(t for item in items for t in item["input_ids"].tolist())
    if long_docs == "split":  # every token once
        assert got == sorted(t for ex in examples for t in ex["input_ids"])
    assert sum(item["labels"].tolist().count(IGNORE) > len(item["cu_seqlens"]) - 1 for item in items) > 10


def test_online_labels_form_pairs_and_padding_with_no_specials_added():
    """Masked examples are taken as they are (as `packer build --input-kind tokens` takes them): eos and bos on,
    yet no token is added; a plain id list beside them still gets its eos."""
    examples = sft_examples(1, 80)
    eos, bos = 10_000, 10_001
    as_labels = [{"input_ids": ex["input_ids"], "labels": [t if m else IGNORE for t, m in zip(ex["input_ids"],
                                                                                              ex["loss_mask"])]}
                 for ex in examples]
    as_pairs = [(np.array(ex["input_ids"]), np.array(ex["loss_mask"], np.uint8)) for ex in examples]
    runs = []
    for source in (examples, as_labels, as_pairs):
        ds = OnlinePackedDataset(source, config=BuildConfig(context_length=32, bos=True), buffer_docs=20, eos_id=eos,
                                 bos_id=bos, fields=ItemFields(pad_to=40, pad_id=0))
        items = list(ds)
        for item in items:
            assert len(item["input_ids"]) == 40
            check_online_item(item, padded=True)
        runs.append([(item["input_ids"].tolist(), item["labels"].tolist()) for item in items])
        assert sorted(t for ids,
                      _ in runs[-1] for t in ids if t) == sorted(t for ex in examples for t in ex["input_ids"])
    assert runs[0] == runs[1] == runs[2]
    (mixed,) = OnlinePackedDataset([[1, 2], {"input_ids": [4, 5], "loss_mask": [0, 1]}],
                                   config=BuildConfig(context_length=16, bos=True), eos_id=eos, bos_id=bos)
    assert sorted(mixed["input_ids"].tolist()) == sorted([bos, 1, 2, eos, 4, 5])


def test_online_texts_and_masked_examples_mix():
    """A raw token list (all trained) beside masked examples in one bin."""
    source = [list(range(100, 105)), {"input_ids": [3, 4, 5, 6], "loss_mask": [0, 0, 1, 1]}]
    (item,) = OnlinePackedDataset(source, config=BuildConfig(context_length=16, eos=False))
    by_doc = dict(zip(map(tuple, np.split(item["input_ids"].numpy(), item["cu_seqlens"][1:-1].numpy())),
                      np.split(item["labels"].numpy(), item["cu_seqlens"][1:-1].numpy())))
    assert by_doc[(100, 101, 102, 103, 104)].tolist() == [IGNORE, 101, 102, 103, 104]
    assert by_doc[(3, 4, 5, 6)].tolist() == [IGNORE, IGNORE, 5, 6]


def test_online_resume_keeps_carried_masks():
    examples = sft_examples(2, 200, high=20)
    config, policy = BuildConfig(context_length=24, eos=False), CarryPolicy(min_fill=1.0)
    make = lambda: OnlinePackedDataset(examples, config=config, buffer_docs=16, policy=policy)  # noqa: E731
    full = [(item["input_ids"].tolist(), item["labels"].tolist()) for item in make()]
    ds, states = make(), []
    for _ in ds:
        states.append(ds.state_dict())
    assert any(any(m is not None for m in s["carry_masks"]) for s in states)  # masks were carried
    for k in (3, len(full) // 2, len(full) - 2):
        resumed = make()
        resumed.load_state_dict(states[k])
        assert [(i["input_ids"].tolist(), i["labels"].tolist()) for i in resumed] == full[k + 1:]


def test_online_bad_masks_name_the_document():
    with pytest.raises(ValueError, match="source document 1: loss_mask needs one 0/1 value per token"):
        list(OnlinePackedDataset([[1, 2], {"input_ids": [1, 2, 3], "loss_mask": [1, 0]}],
                                 config=BuildConfig(context_length=8, eos=False)))
    with pytest.raises(ValueError, match="source document 0: labels must equal input_ids except -100"):
        list(OnlinePackedDataset([{"input_ids": [1, 2, 3], "labels": [1, 5, -100]}],
                                 config=BuildConfig(context_length=8, eos=False)))
    with pytest.raises(ValueError, match="source document 0: loss_mask needs one 0/1"):
        list(OnlinePackedDataset([{"input_ids": [1, 2], "loss_mask": [2, 1]}], config=BuildConfig(context_length=8,
                                                                                                  eos=False)))
