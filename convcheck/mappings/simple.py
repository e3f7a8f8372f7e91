"""Plain mappings: replicated, split along one dim (with vocab padding), and gated `[gate; up]` fc1."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import MappingError, RankCoord, Shards, chunk, need, shard_of

_RANK_OF = {"tp": "tp_rank", "ep": "ep_rank", "etp": "etp_rank", "pp": "pp_rank"}
"""A mapping's axis -> the RankCoord field of the rank along it."""
_CANONICAL: dict[tuple[str, int, int], RankCoord] = {}
"""(axis, rank along it, EP rank) -> the canonical coordinate (RankCoord is frozen: one object serves every mapping)."""

_AXES = ("tp", "etp")


@dataclass(frozen=True, kw_only=True, slots=True)
class _Owned:
    """Common fields: the parameter name, the split axis, and (for one expert) which expert it is."""

    megatron: str
    axis: str = "tp"
    """Grid axis that splits the tensor: "tp" (dense) or "etp" (experts)."""
    expert: int | None = None
    """Global expert id when the parameter is one expert (then only its EP rank holds it)."""
    num_experts: int = 0

    def __post_init__(self) -> None:
        if self.axis not in _AXES:
            raise MappingError(f"{self.megatron}: axis must be one of {_AXES}, got {self.axis!r}")
        if self.expert is not None and not 0 <= self.expert < self.num_experts:
            raise MappingError(f"{self.megatron}: expert {self.expert} is not in [0, {self.num_experts})")

    def size(self, layout: ParallelLayout) -> int:
        return getattr(layout, self.axis)

    def canonical(self, coord: RankCoord) -> RankCoord:
        ep_rank = coord.ep_rank if self.expert is not None else 0
        key = (self.axis, getattr(coord, _RANK_OF[self.axis]), ep_rank)
        found = _CANONICAL.get(key)
        if found is None:
            found = _CANONICAL[key] = RankCoord(ep_rank=ep_rank, **{_RANK_OF[self.axis]: key[1]})
        return found

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        ep_rank = self.owner(layout) if self.expert is not None else 0
        return [RankCoord(ep_rank=ep_rank, **{f"{self.axis}_rank": r}) for r in range(self.size(layout))]

    def owner(self, layout: ParallelLayout) -> int:
        """The EP rank holding this expert."""
        if self.expert is None:
            return 0
        if self.num_experts % layout.ep:
            raise MappingError(f"{self.megatron}: ep={layout.ep} does not divide num_experts={self.num_experts}")
        return self.expert // (self.num_experts // layout.ep)

    def check_coord(self, layout: ParallelLayout, coord: RankCoord) -> None:
        """MappingError when `coord` is outside the layout or (for an expert) on an EP rank that does not own it."""
        coord.check_in(layout)
        if self.expert is not None:
            owner = self.owner(layout)
            if coord.ep_rank != owner:
                raise MappingError(
                    f"{self.megatron}: expert {self.expert} lives on ep_rank {owner}, not {coord.ep_rank}"
                )


@dataclass(frozen=True, kw_only=True, slots=True)
class Replicated(_Owned):
    """Every rank holds the whole HF tensor (norms, router, q/k layernorm)."""

    hf: str

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.hf,)

    def canonical(self, coord: RankCoord) -> RankCoord:
        return RankCoord()

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return [RankCoord()]

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        self.check_coord(layout, coord)
        return need(hf, self.hf)

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        yield self.hf, shard_of(shards, RankCoord(), self.megatron)


@dataclass(frozen=True, kw_only=True, slots=True)
class Split(_Owned):
    """HF tensor split evenly along `dim` across `axis`; dim 0 may be zero-padded to `padded_rows` first (vocab)."""

    hf: str
    dim: int = 0
    padded_rows: int | None = None
    """Rows after padding (Megatron's padded vocab size); None: no padding."""
    unpadded_rows: int | None = None
    """Rows of the HF tensor (the vocab size) when `padded_rows` is set."""

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.hf,)

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """Rank's slice `[rows/size, ...]` (dim 0) or `[..., cols/size]` (dim 1); padding rows are zeros."""
        self.check_coord(layout, coord)
        tensor = need(hf, self.hf)
        if self.padded_rows is not None:
            extra = self.padded_rows - tensor.shape[0]
            if extra < 0 or self.dim != 0:
                raise MappingError(f"{self.megatron}: cannot pad {tensor.shape[0]} rows to {self.padded_rows}")
            if extra:  # no copy of the whole table when the vocab needs no padding
                tensor = torch.cat([tensor, tensor.new_zeros((extra, *tensor.shape[1:]))], dim=0)
        index = getattr(coord, f"{self.axis}_rank")
        return chunk(tensor, self.size(layout), index, self.dim).contiguous()

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """Concatenate the shards by rank along `dim`; drop padding rows."""
        full = torch.cat([shard_of(shards, c, self.megatron) for c in self.coords(layout)], dim=self.dim)
        if self.padded_rows is not None:
            if full.shape[0] != self.padded_rows or self.unpadded_rows is None:
                raise MappingError(f"{self.megatron}: gathered {full.shape[0]} rows, expected {self.padded_rows}")
            full = full[: self.unpadded_rows]
        yield self.hf, full.contiguous()


@dataclass(frozen=True, kw_only=True, slots=True)
class Gated(_Owned):
    """fc1 `[2F/size, hidden]` = `[gate_r; up_r]` <-> gate_proj, up_proj `[F, hidden]` (dense MLP or one expert)."""

    gate: str
    up: str

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.gate, self.up)

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        return torch.cat(self.row_pieces(hf, layout, coord), dim=0).contiguous()

    def row_pieces(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> list[Any]:
        """The shard's row blocks, top to bottom (views of the HF tensors): this rank's gate rows, then its up rows."""
        self.check_coord(layout, coord)
        gate = need(hf, self.gate)
        up = need(hf, self.up, tuple(gate.shape))
        index, size = getattr(coord, f"{self.axis}_rank"), self.size(layout)
        return [chunk(gate, size, index, 0), chunk(up, size, index, 0)]

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """Each rank's shard split in half; gate halves then up halves concatenated by rank."""
        halves = [shard_of(shards, c, self.megatron).chunk(2, dim=0) for c in self.coords(layout)]
        yield self.gate, torch.cat([h[0] for h in halves], dim=0).contiguous()
        yield self.up, torch.cat([h[1] for h in halves], dim=0).contiguous()
