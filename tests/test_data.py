"""PackedDataset on the sample build: fields, padding segment, rank split, epoch order."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from packer.data import PackedDataset  # noqa: E402
from packer.shards import open_dataset  # noqa: E402


def test_items_follow_loader_semantics(sample_dataset):
    raw = open_dataset(sample_dataset)
    ds = PackedDataset(sample_dataset, shuffle=False, pad_to=1024)
    seen_pad = 0
    for i, item in enumerate(ds):
        tokens, offsets = raw[i]
        n = len(tokens)
        assert item["input_ids"].shape == (1024,) and item["input_ids"].dtype == torch.int64
        assert item["input_ids"][:n].tolist() == tokens.tolist()
        cu = item["cu_seqlens"]
        assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == 1024
        assert cu[: len(offsets)].tolist() == offsets.tolist()
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            assert item["position_ids"][a:b].tolist() == list(range(b - a))
            assert item["labels"][a] == -100
            assert item["labels"][a + 1 : b].tolist() == item["input_ids"][a + 1 : b].tolist() or a >= n
        assert (item["labels"][n:] == -100).all()
        assert item["max_seqlen"] == int((cu[1:] - cu[:-1]).max())
        seen_pad += n < 1024
    assert seen_pad > 0


def test_ranks_partition_and_epochs_reshuffle(sample_dataset):
    def ids(ds):
        return [tuple(item["input_ids"][:8].tolist()) + (len(item["input_ids"]),) for item in ds]

    full = ids(PackedDataset(sample_dataset, seed=3))
    parts = [ids(PackedDataset(sample_dataset, seed=3, rank=r, world_size=3)) for r in range(3)]
    assert sorted(sum(parts, [])) == sorted(full) and len(sum(parts, [])) == len(full)
    later = PackedDataset(sample_dataset, seed=3)
    later.set_epoch(1)
    assert ids(later) != full and sorted(ids(later)) == sorted(full)
    assert ids(PackedDataset(sample_dataset, seed=3)) == full
