"""Length-bucketed batching: hand case, token budget, coverage, seeds, ranks, the padded collate."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from packer.train.bucketing import BucketedBatchSampler, bucket_ids, collate_documents


def test_hand_case_from_the_docstring():
    sampler = BucketedBatchSampler([3, 9, 4, 12, 2, 10, 16], max_tokens=32, shuffle=False)
    assert [b.tolist() for b in sampler.batches()] == [[4], [0, 2], [1, 3], [5, 6]]
    assert sampler.padding_share() == pytest.approx(10 / 66)


def test_bucket_ids():
    assert bucket_ids([1, 2, 3, 4, 5, 8, 9]).tolist() == [0, 1, 2, 2, 3, 3, 4]
    q = bucket_ids(np.arange(1, 101), buckets=4)
    assert np.bincount(q).tolist() == [25, 25, 25, 25] and (np.diff(q) >= 0).all()
    with pytest.raises(ValueError, match="pow2"):
        bucket_ids([1, 2], buckets="log")


@pytest.mark.parametrize("buckets", ["pow2", 1, 8])
@pytest.mark.parametrize("seed", range(5))
def test_budget_kept_every_doc_once_buckets_not_mixed(buckets, seed):
    rng = np.random.default_rng(seed)
    lengths = np.maximum(rng.lognormal(np.log(60), 1.2, 2000).astype(int), 1)
    budget = int(rng.integers(lengths.max(), 4 * lengths.max()))
    sampler = BucketedBatchSampler(lengths, max_tokens=budget, buckets=buckets, seed=seed)
    batches = list(sampler)
    assert all(len(b) * lengths[b].max() <= budget for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    bucket = bucket_ids(lengths, buckets)
    assert all(len(set(bucket[b].tolist())) == 1 for b in batches)
    assert max(len(b) for b in batches) > 1 and len(sampler) == len(batches)
    # greedy (seen unshuffled): a batch ends at its bucket's end or where the next document breaks the budget
    plain = BucketedBatchSampler(lengths, max_tokens=budget, buckets=buckets, shuffle=False).batches()
    for b, c in zip(plain[:-1], plain[1:]):
        assert bucket[b[0]] != bucket[c[0]] or (len(b) + 1) * max(lengths[b].max(), lengths[c[0]]) > budget


def test_narrower_buckets_pad_less():
    lengths = np.maximum(np.random.default_rng(0).lognormal(np.log(300), 1.18, 5000).astype(int), 1)
    share = {b: BucketedBatchSampler(lengths, max_tokens=int(lengths.max()) * 4, buckets=b).padding_share()
             for b in (1, "pow2", 64)}
    assert share[1] > 0.5 > share["pow2"] > 0.2 > share[64] > 0


def test_same_seed_same_batches_epochs_reshuffle_ranks_split():
    lengths = np.random.default_rng(1).integers(1, 500, 1000)
    a = list(BucketedBatchSampler(lengths, max_tokens=2000, seed=4))
    assert a == list(BucketedBatchSampler(lengths, max_tokens=2000, seed=4))
    later = BucketedBatchSampler(lengths, max_tokens=2000, seed=4)
    later.set_epoch(1)
    b = list(later)
    assert a != b and sorted(i for x in b for i in x) == list(range(1000))
    parts = [list(BucketedBatchSampler(lengths, max_tokens=2000, seed=4, rank=r, world_size=3)) for r in range(3)]
    assert sorted(map(tuple, sum(parts, []))) == sorted(map(tuple, a))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    capped = list(BucketedBatchSampler(lengths, max_tokens=2000, seed=4, max_batch_size=3))
    assert max(map(len, capped)) == 3 and sorted(i for x in capped for i in x) == list(range(1000))


def test_bad_inputs_name_the_fix():
    with pytest.raises(ValueError, match="document 1 has length 50.*max_tokens=40"):
        BucketedBatchSampler([3, 50], max_tokens=40)
    with pytest.raises(ValueError, match="document 0 has length 0"):
        BucketedBatchSampler([0, 5], max_tokens=40)


def test_collate_documents_hand_case_and_dataloader():
    torch = pytest.importorskip("torch")
    out = collate_documents([[5, 6, 7], {"input_ids": [8, 9]}], pad_id=1)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 9, 1]]
    assert out["labels"].tolist() == [[-100, 6, 7], [-100, 9, -100]]
    assert out["position_ids"].tolist() == [[0, 1, 2], [0, 1, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]] and out["max_seqlen"] == 3
    docs = [list(range(1, n + 1)) for n in np.random.default_rng(2).integers(1, 40, 200)]
    sampler = BucketedBatchSampler([len(d) for d in docs], max_tokens=128, seed=1)
    loader = torch.utils.data.DataLoader(docs, batch_sampler=sampler, collate_fn=functools.partial(collate_documents))
    n_docs = 0
    for batch in loader:
        assert batch["input_ids"].numel() <= 128 and batch["input_ids"].dtype == torch.int64
        n_docs += len(batch["input_ids"])
        assert (batch["attention_mask"].sum(1) == (batch["input_ids"] != 0).sum(1)).all()
    assert n_docs == 200
