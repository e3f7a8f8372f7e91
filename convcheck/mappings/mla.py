"""Multi-latent attention (DeepSeek-V2/V3, Moonlight, Kimi, GLM-4.7-Flash): HF q/kv projections <-> the linears of
megatron-core 0.19.2's MLASelfAttention as its local (TE-free) spec builds them, the spec convcheck runs.

Every MLA projection there is a ColumnParallelLinear (gpt_layer_specs.py:421-424), so TP rank r holds the r-th of
tp equal row blocks of the HF weight `[out, in]`; the row order inside each is HF's:
- linear_q_down_proj `[q_lora_rank/tp, hidden]` <- q_a_proj and linear_kv_down_proj
  `[(kv_lora_rank + qk_rope_head_dim)/tp, hidden]` <- kv_a_proj_with_mqa (rows: the KV latent, then the one RoPE key
  all heads share). They are split though attention needs every row: the forward all-gathers their outputs
  (multi_latent_attention.py:651-652, :737-739) and only then splits latent from RoPE key (:741, HF :437), so at
  TP2 rank 1 holds the latent's last rows and the RoPE key. With TE they are TELinear `duplicated` instead
  (:525, :572): whole on every rank, a layout these mappings do not describe.
- linear_q_up_proj `[n/tp * (nope + rope), q_lora_rank]` <- q_b_proj, or without q LoRA linear_q_proj
  `[n/tp * (nope + rope), hidden]` <- q_proj: per head `[q_nope; q_rope]` rows (:863 view, :924 split; HF :433-434).
- linear_kv_up_proj `[n/tp * (nope + v), kv_lora_rank]` <- kv_b_proj: per head `[k_nope; v]` rows (:869 view, :930
  split; HF :439-440).
A head's rows never straddle two ranks (n % tp == 0), so each rank's row block is whole heads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import MappingError, RankCoord, Shards, chunk, need, shard_of


@dataclass(frozen=True, kw_only=True, slots=True)
class HeadRows:
    """A column-parallel MLA weight `[repeats * sum(parts), cols]` (`repeats` blocks of `parts` rows, e.g. per head
    `[k_nope; v]`) <-> the HF weight of that shape; TP rank r holds rows `[r*R/tp, (r+1)*R/tp)`, whole repeats."""

    megatron: str
    hf: str
    repeats: int
    """Blocks of `parts` rows: attention heads for the up projections, 1 for the down projections."""
    parts: tuple[tuple[str, int], ...]
    """(name, rows) of each piece of one block, top to bottom, e.g. (("k_nope", 128), ("v", 128))."""
    cols: int
    """Input width: hidden for q_proj and the down projections, the LoRA rank for the up projections."""

    def __post_init__(self) -> None:
        if min(self.repeats, self.cols, *(rows for _, rows in self.parts)) < 1:
            raise MappingError(f"{self.megatron}: repeats, cols and every part's rows must be positive")

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.hf,)

    @property
    def rows(self) -> int:
        """R: every row of the HF weight."""
        return self.repeats * sum(rows for _, rows in self.parts)

    def check_layout(self, layout: ParallelLayout) -> None:
        """MappingError unless TP divides the blocks (heads) and the rows, as megatron-core requires."""
        if self.repeats > 1 and self.repeats % layout.tp:
            raise MappingError(f"{self.megatron}: {self.repeats} heads do not split over tp={layout.tp}")
        if self.rows % layout.tp:
            raise MappingError(f"{self.megatron}: {self.rows} rows do not split over tp={layout.tp}")

    def canonical(self, coord: RankCoord) -> RankCoord:
        return RankCoord(tp_rank=coord.tp_rank)

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return [RankCoord(tp_rank=r) for r in range(layout.tp)]

    def row_pieces(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> list[Any]:
        """The shard as one row block: rank `coord.tp_rank`'s `[R/tp, cols]` rows of the HF weight (a view)."""
        self.check_layout(layout)
        coord.check_in(layout)
        tensor = need(hf, self.hf, (self.rows, self.cols))
        return [chunk(tensor, layout.tp, coord.tp_rank, dim=0)]

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """Rank `coord.tp_rank`'s `[R/tp, cols]` shard."""
        return self.row_pieces(hf, layout, coord)[0].contiguous()

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """The TP shards concatenated by rank: `[R, cols]`."""
        self.check_layout(layout)
        full = torch.cat([shard_of(shards, c, self.megatron) for c in self.coords(layout)], dim=0)
        if tuple(full.shape) != (self.rows, self.cols):
            raise MappingError(f"{self.megatron}: gathered {list(full.shape)}, expected {[self.rows, self.cols]}")
        yield self.hf, full.contiguous()


def q_down(*, megatron: str, hf: str, q_lora_rank: int, hidden: int) -> HeadRows:
    """linear_q_down_proj `[q_lora_rank/tp, hidden]` <-> q_a_proj `[q_lora_rank, hidden]`."""
    return HeadRows(megatron=megatron, hf=hf, repeats=1, parts=(("q_latent", q_lora_rank),), cols=hidden)


def kv_down(*, megatron: str, hf: str, kv_lora_rank: int, rope_dim: int, hidden: int) -> HeadRows:
    """linear_kv_down_proj `[(kv_lora_rank + rope)/tp, hidden]` <-> kv_a_proj_with_mqa `[kv_lora_rank + rope, hidden]`
    (the KV latent's rows, then the shared RoPE key's)."""
    parts = (("kv_latent", kv_lora_rank), ("k_rope", rope_dim))
    return HeadRows(megatron=megatron, hf=hf, repeats=1, parts=parts, cols=hidden)


def q_up(*, megatron: str, hf: str, heads: int, nope_dim: int, rope_dim: int, cols: int) -> HeadRows:
    """linear_q_up_proj / linear_q_proj `[heads/tp * (nope + rope), cols]` <-> q_b_proj / q_proj (per head
    `[q_nope; q_rope]`; cols: q_lora_rank, or hidden without q LoRA)."""
    parts = (("q_nope", nope_dim), ("q_rope", rope_dim))
    return HeadRows(megatron=megatron, hf=hf, repeats=heads, parts=parts, cols=cols)


def kv_up(*, megatron: str, hf: str, heads: int, nope_dim: int, v_dim: int, kv_lora_rank: int) -> HeadRows:
    """linear_kv_up_proj `[heads/tp * (nope + v), kv_lora_rank]` <-> kv_b_proj (per head `[k_nope; v]`)."""
    parts = (("k_nope", nope_dim), ("v", v_dim))
    return HeadRows(megatron=megatron, hf=hf, repeats=heads, parts=parts, cols=kv_lora_rank)
