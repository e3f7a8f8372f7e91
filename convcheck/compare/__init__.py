"""Bitwise comparison of tensors on any device: integer views, memcmp of host memory, diagnosis of rearrangements,
keyed digests."""
