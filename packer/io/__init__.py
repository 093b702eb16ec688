"""Bytes and places, nothing about tokens: filesystems and URIs, atomic writes, locks, line and ranged reads, failpoints."""
