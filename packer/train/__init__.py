"""The torch side: rows -> items and batches, PackedDataset, online packing, bucketing, attention, a tiny model."""
