"""GQA fused QKV: HF q/k/v_proj <-> Megatron `linear_qkv` (weight `[G * (n + 2) * head_dim, hidden]`, or bias).

Megatron-Core's row order is per query group g: `[q heads g*n .. g*n+n-1, k head g, v head g]` with n = heads
per group, groups concatenated; TP rank r holds the r-th of tp equal row blocks. With G >= tp that is whole groups
`[r*G/tp, (r+1)*G/tp)`; with fewer KV heads than TP ranks (tp a multiple of G, megatron-core 0.19.2
transformer_config.py:1339 and attention.py:353) each group is split over tp/G ranks, whose outputs Megatron
all-gathers before attention. Any other G/tp combination is rejected.

With `attention_output_gate` (Qwen3-Next, Qwen3.5) each group is `[q heads, gate heads, k head, v head]`
(attention.py:1829-1866 splits `[n*d, n*d, d, d]` per group) while HF's q_proj `[H * 2 * d, hidden]` holds per head
`[q_h; gate_h]` (transformers modeling_qwen3_next.py:295).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import MappingError, RankCoord, Shards, chunk, need, shard_of


@dataclass(frozen=True, kw_only=True, slots=True)
class FusedQKV:
    """linear_qkv.weight `[G*(n+2)*d, hidden]` or linear_qkv.bias `[G*(n+2)*d]` <-> q `[H*d, ...]`, k/v `[G*d, ...]`."""

    megatron: str
    q: str
    k: str
    v: str
    num_heads: int
    """H: query heads."""
    num_query_groups: int
    """G: key/value heads."""
    head_dim: int
    """d: channels per head."""
    output_gate: bool = False
    """q holds per head `[q_h; gate_h]` (`[H * 2 * d, ...]`); Megatron's group is then `[q, gate, k, v]`."""

    def __post_init__(self) -> None:
        if min(self.num_heads, self.num_query_groups, self.head_dim) < 1:
            raise MappingError(f"{self.megatron}: heads, query groups and head_dim must be positive")
        if self.num_heads % self.num_query_groups:
            raise MappingError(
                f"{self.megatron}: num_heads={self.num_heads} is not a multiple of "
                f"num_query_groups={self.num_query_groups}"
            )

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.q, self.k, self.v)

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups

    @property
    def group_rows(self) -> int:
        """Rows of one query group: `(n + 2) * d`, or `(2n + 2) * d` with the output gate."""
        q_heads = self.heads_per_group * (2 if self.output_gate else 1)
        return (q_heads + 2) * self.head_dim

    def check_layout(self, layout: ParallelLayout) -> None:
        """MappingError unless query groups and TP divide one another (Megatron-Core's own rule)."""
        g, tp = self.num_query_groups, layout.tp
        if g % tp and tp % g:
            raise MappingError(
                f"{self.megatron}: num_query_groups={g} and tp={tp} do not divide one another; "
                "Megatron-Core needs num_query_groups % tp == 0 or tp % num_query_groups == 0"
            )
        if (g * self.group_rows) % tp:
            raise MappingError(f"{self.megatron}: {g * self.group_rows} rows do not split over tp={tp}")

    def canonical(self, coord: RankCoord) -> RankCoord:
        return RankCoord(tp_rank=coord.tp_rank)

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return [RankCoord(tp_rank=r) for r in range(layout.tp)]

    def _grouped(self, hf: Mapping[str, Any]) -> Any:
        """`[G, group_rows, *rest]`: each group's q heads (then its gate heads), then its k head, then its v head."""
        q = need(hf, self.q)
        rest = tuple(q.shape[1:])
        gate = 2 if self.output_gate else 1
        q = need(hf, self.q, (self.num_heads * gate * self.head_dim, *rest))
        k = need(hf, self.k, (self.num_query_groups * self.head_dim, *rest))
        v = need(hf, self.v, (self.num_query_groups * self.head_dim, *rest))
        g, n, d = self.num_query_groups, self.heads_per_group, self.head_dim
        if self.output_gate:  # [G, n, 2, d]: per head [q_h; gate_h] -> per group [q heads; gate heads]
            heads = q.reshape(g, n, 2, d, *rest)
            queries = [heads[:, :, 0].reshape(g, n * d, *rest), heads[:, :, 1].reshape(g, n * d, *rest)]
        else:
            queries = [q.reshape(g, n * d, *rest)]
        return torch.cat([*queries, k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """Rank `coord.tp_rank`'s rows `[G*(n+2)*d / tp, *rest]`: the tp_rank-th equal block of the fused rows."""
        self.check_layout(layout)
        coord.check_in(layout)
        grouped = self._grouped(hf)
        rows = grouped.reshape(-1, *grouped.shape[2:])
        return chunk(rows, layout.tp, coord.tp_rank, dim=0).contiguous()

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """Concatenate the TP shards by rank and split each group back into q (with its gate), k, v."""
        self.check_layout(layout)
        full = torch.cat([shard_of(shards, c, self.megatron) for c in self.coords(layout)], dim=0)
        n, d, g = self.heads_per_group, self.head_dim, self.num_query_groups
        if full.shape[0] != g * self.group_rows:
            raise MappingError(f"{self.megatron}: gathered {full.shape[0]} rows, expected {g * self.group_rows}")
        rest = tuple(full.shape[1:])
        grouped = full.reshape(g, self.group_rows, *rest)
        if self.output_gate:
            q, gate, k, v = grouped.split([n * d, n * d, d, d], dim=1)
            heads = torch.stack([q.reshape(g, n, d, *rest), gate.reshape(g, n, d, *rest)], dim=2)  # [G, n, 2, d]
            yield self.q, heads.reshape(g * n * 2 * d, *rest).contiguous()
        else:
            q, k, v = grouped.split([n * d, d, d], dim=1)
            yield self.q, q.reshape(g * n * d, *rest).contiguous()
        yield self.k, k.reshape(g * d, *rest).contiguous()
        yield self.v, v.reshape(g * d, *rest).contiguous()
