"""Bitwise comparison of tensors on any device: integer views, diagnosis of rearrangements, keyed digests."""
