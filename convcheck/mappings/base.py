"""The mapping interface: pure functions between HF tensors and one rank's Megatron shard (no process groups)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from convcheck.errors import ConvcheckError
from convcheck.layout import ParallelLayout


class MappingError(ConvcheckError):
    """A mapping cannot be built or applied (impossible geometry, missing or misshapen tensor)."""


class CoverageError(MappingError):
    """A registry does not cover a model exactly once on both sides; the message names every offender."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankCoord:
    """Where one rank sits in the parallel grid (only the axes a mapping uses matter to it)."""

    tp_rank: int = 0
    """Tensor-parallel rank (attention, dense MLP, embeddings)."""
    ep_rank: int = 0
    """Expert-parallel rank (which experts the rank owns)."""
    etp_rank: int = 0
    """Expert-tensor-parallel rank (which slice of each owned expert)."""
    pp_rank: int = 0
    """Pipeline rank (which layers the rank owns; no tensor mapping slices by it)."""

    def __post_init__(self) -> None:
        for name in ("tp_rank", "ep_rank", "etp_rank", "pp_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise MappingError(f"RankCoord.{name} must be a non-negative integer, got {value!r}")

    def check_in(self, layout: ParallelLayout) -> None:
        """Raise MappingError when a coordinate is outside `layout`."""
        for axis, size in (("tp", layout.tp), ("ep", layout.ep), ("etp", layout.etp), ("pp", layout.pp)):
            if getattr(self, f"{axis}_rank") >= size:
                raise MappingError(f"{self} is outside layout {layout.label}: {axis}_rank must be < {size}")


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
    step = size // parts
    return tensor.narrow(dim, index * step, step)
