"""Vision-tower mappings of a Qwen-VL model: the blocks' one fused HF `qkv` <-> Megatron's per-head `linear_qkv`.

HF's `attn.qkv` (weight `[3 * H * d, hidden]`, bias `[3 * H * d]`) holds all query rows, then all key rows, then all
value rows (transformers 5.12.1 modeling_qwen3_vl.py Qwen3VLVisionAttention: `qkv(x).reshape(s, 3, H, d)`).
Megatron-Core's `linear_qkv` holds per head `[q_h; k_h; v_h]` (one query group per head: the vision attention has no
GQA), heads concatenated; TP rank r holds the r-th of tp equal row blocks (whole heads). The bridge maps it with
ConcatenatedQKVMapping (megatron-bridge 0.6.2 conversion/param_mapping.py:2457).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import MappingError, RankCoord, Shards, chunk, need, shard_of


def heads_interleaved(qkv: Any, num_heads: int, head_dim: int) -> Any:
    """HF `[q; k; v]` rows `[3 * H * d, *rest]` -> Megatron's per-head `[q_h; k_h; v_h]` rows `[H * 3 * d, *rest]`."""
    rest = tuple(qkv.shape[1:])
    return qkv.reshape(3, num_heads, head_dim, *rest).transpose(0, 1).reshape(3 * num_heads * head_dim, *rest)


def heads_concatenated(rows: Any, num_heads: int, head_dim: int) -> Any:
    """The inverse of `heads_interleaved`: Megatron's `[H * 3 * d, *rest]` -> HF `[q; k; v]` `[3 * H * d, *rest]`."""
    rest = tuple(rows.shape[1:])
    return rows.reshape(num_heads, 3, head_dim, *rest).transpose(0, 1).reshape(3 * num_heads * head_dim, *rest)


@dataclass(frozen=True, kw_only=True, slots=True)
class ConcatenatedQKV:
    """linear_qkv.weight `[H * 3 * d / tp, hidden]` (or .bias `[H * 3 * d / tp]`) <-> HF qkv `[3 * H * d, ...]`."""

    megatron: str
    hf: str
    num_heads: int
    """H: attention heads (each its own query group)."""
    head_dim: int
    """d: channels per head."""

    def __post_init__(self) -> None:
        if min(self.num_heads, self.head_dim) < 1:
            raise MappingError(f"{self.megatron}: heads and head_dim must be positive")

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.hf,)

    def check_layout(self, layout: ParallelLayout) -> None:
        """MappingError unless TP splits the heads evenly (Megatron-Core holds whole heads per rank)."""
        if self.num_heads % layout.tp:
            raise MappingError(f"{self.megatron}: {self.num_heads} heads do not split over tp={layout.tp}")

    def canonical(self, coord: RankCoord) -> RankCoord:
        return RankCoord(tp_rank=coord.tp_rank)

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return [RankCoord(tp_rank=r) for r in range(layout.tp)]

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """Rank `coord.tp_rank`'s rows: the tp_rank-th equal block of the per-head interleaved rows."""
        self.check_layout(layout)
        coord.check_in(layout)
        qkv = need(hf, self.hf)
        qkv = need(hf, self.hf, (3 * self.num_heads * self.head_dim, *qkv.shape[1:]))
        rows = heads_interleaved(qkv, self.num_heads, self.head_dim)
        return chunk(rows, layout.tp, coord.tp_rank, dim=0).contiguous()

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """The TP shards concatenated by rank, back to HF's `[q; k; v]`."""
        self.check_layout(layout)
        full = torch.cat([shard_of(shards, c, self.megatron) for c in self.coords(layout)], dim=0)
        rows = 3 * self.num_heads * self.head_dim
        if full.shape[0] != rows:
            raise MappingError(f"{self.megatron}: gathered {full.shape[0]} rows, expected {rows}")
        yield self.hf, heads_concatenated(full, self.num_heads, self.head_dim).contiguous()
