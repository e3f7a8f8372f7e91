"""A weight split across tensor-parallel ranks that the HF checkpoint stores transposed (Gemma 3's projector keeps
`mm_input_projection_weight` `[in, out]` for a matmul where Megatron's ColumnParallelLinear holds `[out, in]`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import RankCoord, Shards, chunk, need, shard_of
from convcheck.mappings.simple import _Owned


@dataclass(frozen=True, kw_only=True, slots=True)
class TransposedSplit(_Owned):
    """Megatron `[out / size, in]` (rows split along `axis`) <-> the HF tensor `[in, out]` (its columns split)."""

    hf: str

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.hf,)

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """This rank's rows of the transpose: HF columns `[r * out / size, (r + 1) * out / size)` as rows."""
        self.check_coord(layout, coord)
        index = getattr(coord, f"{self.axis}_rank")
        return chunk(need(hf, self.hf).t(), self.size(layout), index, 0).contiguous()

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """The shards concatenated by rank along rows, transposed back to `[in, out]`."""
        rows = torch.cat([shard_of(shards, c, self.megatron) for c in self.coords(layout)], dim=0)
        yield self.hf, rows.t().contiguous()
