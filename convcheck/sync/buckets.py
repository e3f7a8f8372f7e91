"""Flat byte buckets for weight updates: tensors packed into bounded uint8 buffers plus a metadata list.

The metadata of a bucket is a list of (name, dtype, shape, offset); a tensor's bytes are `buffer[offset:offset +
numel * itemsize]`, offsets aligned to ALIGN bytes. A tensor larger than the bound travels alone in its own bucket.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 16


@dataclass(frozen=True, slots=True)
class BucketEntry:
    """Where one tensor lies in a bucket."""

    name: str
    dtype: str
    """torch dtype name without the `torch.` prefix, e.g. "bfloat16"."""
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


@dataclass(frozen=True, slots=True)
class Bucket:
    """One packed bucket: the bytes and the metadata list that says how to cut them."""

    buffer: Any
    """1-D uint8 tensor."""
    entries: tuple[BucketEntry, ...]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _pack(items: list[tuple[str, Any]]) -> Bucket:
    entries, offset = [], 0
    for name, tensor in items:
        entries.append(BucketEntry(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset))
        offset = _aligned(offset + tensor.numel() * tensor.element_size())
    buffer = torch.zeros(offset, dtype=torch.uint8)
    for entry, (_, tensor) in zip(entries, items):
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[entry.offset : entry.offset + raw.numel()] = raw.cpu()
    return Bucket(buffer=buffer, entries=tuple(entries))


def pack_buckets(items: Iterable[tuple[str, Any]], bucket_bytes: int) -> Iterator[Bucket]:
    """Pack a stream of (name, tensor) into buckets of at most `bucket_bytes` (one oversized tensor: a bucket alone)."""
    pending: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in items:
        nbytes = _aligned(tensor.numel() * tensor.element_size())
        if pending and size + nbytes > bucket_bytes:
            yield _pack(pending)
            pending, size = [], 0
        pending.append((name, tensor))
        size += nbytes
    if pending:
        yield _pack(pending)


def unpack_bucket(bucket: Bucket) -> Iterator[tuple[str, Any]]:
    """The (name, tensor) pairs of a bucket, each a copy cut from the buffer as its metadata says."""
    total = bucket.buffer.numel()
    for entry in bucket.entries:
        end = entry.offset + entry.nbytes
        if entry.offset < 0 or end > total:
            raise ValueError(
                f"bucket entry {entry.name!r} spans bytes [{entry.offset}, {end}) of a {total}-byte bucket"
            )
        raw = bucket.buffer[entry.offset : end].clone()
        yield entry.name, raw.view(getattr(torch, entry.dtype)).reshape(entry.shape)
