"""A fused linear_qkv whose checkpoint stores fewer than q, k and v (Gemma 4): keys used as values, or no keys and
values at all, the missing rows synthesised on import and left out of the export."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from convcheck.layout import ParallelLayout, RankCoord
from convcheck.mappings.base import Shards, need
from convcheck.mappings.qkv import FusedQKV


@dataclass(frozen=True, kw_only=True, slots=True)
class PartialQKV:
    """linear_qkv.weight `[G * (n / G + 2) * d / tp, hidden]` <- q `[n * d, hidden]` and what the layer stores:
    k `[G * d, hidden]` and v (a plain layer); k only (v None: the v rows are a copy of k's, Gemma 4's
    attention_k_eq_v on full-attention layers); nothing (k and v None: the k and v rows are zeros, Gemma 4's
    KV-shared layers, which read an earlier layer's keys and values). Per group [q heads; k; v], as FusedQKV."""

    megatron: str
    q: str
    k: str | None
    v: str | None
    num_heads: int
    num_query_groups: int
    head_dim: int

    def _fused(self) -> FusedQKV:
        return FusedQKV(
            megatron=self.megatron,
            q=self.q,
            k=self.k or f"{self.megatron}#k",
            v=self.v or f"{self.megatron}#v",
            num_heads=self.num_heads,
            num_query_groups=self.num_query_groups,
            head_dim=self.head_dim,
        )

    @property
    def hf_names(self) -> tuple[str, ...]:
        return tuple(name for name in (self.q, self.k, self.v) if name is not None)

    def canonical(self, coord: RankCoord) -> RankCoord:
        return RankCoord(tp_rank=coord.tp_rank)

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return [RankCoord(tp_rank=r) for r in range(layout.tp)]

    def _complete(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        """`hf` with the rows the checkpoint lacks: v a copy of k, or k and v zeros `[G * d, hidden]`."""
        fused = self._fused()
        q = need(hf, self.q)
        out = {self.q: q}
        k = (
            need(hf, self.k)
            if self.k is not None
            else q.new_zeros((self.num_query_groups * self.head_dim, *q.shape[1:]))
        )
        out[fused.k] = k
        out[fused.v] = need(hf, self.v) if self.v is not None else (k if self.k is not None else k.clone())
        return out

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """Rank `coord.tp_rank`'s rows, the missing k / v rows filled as the layer's kind says."""
        return self._fused().to_shard(self._complete(hf), layout, coord)

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """The stored projections only, split back from the gathered rows."""
        for name, tensor in self._fused().from_shards(shards, layout):
            if name in self.hf_names:
                yield name, tensor
