"""The mapping interface: pure functions between HF tensors and one rank's Megatron shard (no process groups)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from convcheck.errors import MappingError
from convcheck.layout import ParallelLayout, RankCoord


class CoverageError(MappingError):
    """A registry does not cover a model exactly once on both sides; the message names every offender."""


Shards = Mapping[RankCoord, Any]
"""One Megatron shard per rank coordinate (keys are `mapping.canonical(coord)`)."""


class TensorMapping(Protocol):
    """One Megatron parameter <-> the HF tensors it is made of."""

    megatron: str
    """Global Megatron parameter name."""

    @property
    def hf_names(self) -> tuple[str, ...]:
        """Every HF tensor this parameter is built from (and exported to)."""

    def canonical(self, coord: RankCoord) -> RankCoord:
        """`coord` with the axes this mapping does not slice by set to 0 (ranks that hold the same shard agree)."""

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        """The canonical coordinates whose shards `from_shards` needs."""

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """The local shard rank `coord` holds, derived from the HF tensors."""

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """The HF tensors, rebuilt from every rank's shard (one HF tensor, or one expert, at a time)."""


def need(hf: Mapping[str, Any], name: str, shape: tuple[int, ...] | None = None) -> Any:
    """hf[name], raising MappingError when absent or (if given) of another shape."""
    if name not in hf:
        raise MappingError(f"HF tensor {name!r} is needed but was not given")
    tensor = hf[name]
    if shape is not None and tuple(tensor.shape) != tuple(shape):
        raise MappingError(f"HF tensor {name!r} has shape {list(tensor.shape)}, expected {list(shape)}")
    return tensor


def shard_of(shards: Shards, coord: RankCoord, megatron: str) -> Any:
    """shards[coord], raising MappingError naming the parameter when that rank's shard is missing."""
    if coord not in shards:
        raise MappingError(f"{megatron}: no shard for {coord}")
    return shards[coord]


def chunk(tensor: Any, parts: int, index: int, dim: int) -> Any:
    """The `index`-th of `parts` equal slices of `tensor` along `dim`; MappingError when it does not divide."""
    size = tensor.shape[dim]
    if size % parts:
        raise MappingError(f"dimension {dim} of size {size} does not split into {parts} equal parts")
    if parts == 1 and index == 0:
        return tensor  # the whole tensor: no view to make
    step = size // parts
    return tensor.narrow(dim, index * step, step)
