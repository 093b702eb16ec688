"""The on-disk contract both sides read: shard formats, the manifest, open_dataset, verify."""
