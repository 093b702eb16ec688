"""The public loading API: datasets and collates for a training loop (implemented in packer/train/).

    from packer.data import PackedDataset, collate_varlen
    loader = DataLoader(PackedDataset("out/sample", batch_size=8), batch_size=None)
"""

from packer.balance import Balance, CostModel
from packer.online_pack import CarryPolicy
from packer.train.bucketing import BucketedBatchSampler, collate_documents
from packer.train.data import PackedDataset
from packer.train.items import ItemFields, collate_padded, collate_varlen, make_item, make_items
from packer.train.online import OnlinePackedDataset
from packer.train.order import BlockShuffle

__all__ = ["Balance", "BlockShuffle", "BucketedBatchSampler", "CarryPolicy", "CostModel", "ItemFields",
           "OnlinePackedDataset", "PackedDataset", "collate_documents", "collate_padded", "collate_varlen", "make_item", "make_items"]
