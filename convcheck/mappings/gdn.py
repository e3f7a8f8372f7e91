"""Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention): HF tensors <-> megatron-core 0.19.2 GatedDeltaNet shards.

Widths: Hk key heads of dk channels, Hv value heads of dv channels, r = Hv / Hk value heads per key head (value head
j reads key head j // r: ssm/gated_delta_net/common.py:418-421 repeat_interleave), t = TP size.
- `in_proj.weight` `[2*Hk*dk + 2*Hv*dv + 2*Hv, hidden]`: TP rank s holds `[q_s; k_s; v_s; z_s; b_s; a_s]`
  (gdn.py:41-48 in_proj_split_sections), each the s-th of t row slices of q, k `[Hk*dk]` (key-head major), v, z
  `[Hv*dv]` (value-head major), b, a `[Hv]`.
- HF Qwen3-Next: in_proj_qkvz `[Hk * (2dk + 2r*dv), hidden]` holds per key head h `[q_h; k_h; v_hr..hr+r-1;
  z_hr..hr+r-1]`, in_proj_ba `[Hk * 2r, hidden]` per key head `[b_group; a_group]` (transformers
  modeling_qwen3_next.py fix_query_key_value_ordering). HF Qwen3.5: in_proj_qkv `[q; k; v]`, in_proj_z, in_proj_b,
  in_proj_a, each flat.
- `conv1d.weight` `[2*Hk*dk + Hv*dv, 1, kernel]`: channels `[q; k; v]`; rank s holds `[q_s; k_s; v_s]`
  (common.py:220-228, conv_dim_local_tp): a `mamba.Blocks` of three components.
- `A_log`, `dt_bias` `[Hv]` split by heads, `out_proj` `[hidden, Hv*dv]` row parallel (see simple.Split);
  `out_norm.weight` `[dv]` replicated and zero-centered (ZeroCentered).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import MappingError, RankCoord, Shards, chunk, need, shard_of
from convcheck.mappings.mamba import Blocks
from convcheck.mappings.simple import Replicated

COMPONENTS = ("q", "k", "v", "z", "b", "a")
"""Megatron's in_proj sections, in order, on every TP rank."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GDNWidths:
    """The GDN head counts and widths (HF linear_num_key_heads, linear_num_value_heads, linear_*_head_dim)."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int

    def __post_init__(self) -> None:
        if min(self.key_heads, self.value_heads, self.key_dim, self.value_dim) < 1:
            raise MappingError(f"GDN widths must be positive, got {self}")
        if self.value_heads % self.key_heads:
            raise MappingError(f"linear_num_value_heads={self.value_heads} is not a multiple of {self.key_heads}")

    @property
    def ratio(self) -> int:
        """r: value heads per key head."""
        return self.value_heads // self.key_heads

    def rows(self) -> tuple[int, ...]:
        """Rows of q, k, v, z, b, a: `(Hk*dk, Hk*dk, Hv*dv, Hv*dv, Hv, Hv)`."""
        qk, v = self.key_heads * self.key_dim, self.value_heads * self.value_dim
        return (qk, qk, v, v, self.value_heads, self.value_heads)

    def check_tp(self, megatron: str, tp: int) -> None:
        """MappingError unless TP splits the key heads (and so the value heads) evenly."""
        if self.key_heads % tp:
            raise MappingError(f"{megatron}: linear_num_key_heads={self.key_heads} is not divisible by tp={tp}")


def ungroup_qkvz(qkvz: Any, w: GDNWidths) -> list[Any]:
    """HF in_proj_qkvz `[Hk * (2dk + 2r*dv), *rest]` (per key head `[q_h; k_h; v_group; z_group]`) -> flat
    q, k `[Hk*dk, *rest]`, v, z `[Hv*dv, *rest]`."""
    rest = tuple(qkvz.shape[1:])
    group = qkvz.reshape(w.key_heads, -1, *rest)
    sizes = [w.key_dim, w.key_dim, w.ratio * w.value_dim, w.ratio * w.value_dim]
    return [part.reshape(-1, *rest) for part in group.split(sizes, dim=1)]


def group_qkvz(q: Any, k: Any, v: Any, z: Any, w: GDNWidths) -> Any:
    """Inverse of ungroup_qkvz: flat q, k, v, z -> in_proj_qkvz, per key head `[q_h; k_h; v_group; z_group]`."""
    rest = tuple(q.shape[1:])
    parts = [t.reshape(w.key_heads, -1, *rest) for t in (q, k, v, z)]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def ungroup_ba(ba: Any, w: GDNWidths) -> list[Any]:
    """HF in_proj_ba `[Hk * 2r, *rest]` (per key head `[b_group; a_group]`) -> flat b, a `[Hv, *rest]`."""
    rest = tuple(ba.shape[1:])
    group = ba.reshape(w.key_heads, 2 * w.ratio, *rest)
    return [part.reshape(-1, *rest) for part in group.split([w.ratio, w.ratio], dim=1)]


def group_ba(b: Any, a: Any, w: GDNWidths) -> Any:
    """Inverse of ungroup_ba: flat b, a `[Hv, *rest]` -> in_proj_ba, per key head `[b_group; a_group]`."""
    rest = tuple(b.shape[1:])
    return torch.cat([b.reshape(w.key_heads, w.ratio, *rest), a.reshape(w.key_heads, w.ratio, *rest)], dim=1).reshape(
        -1, *rest
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class GDNInProj:
    """in_proj.weight `[2*Hk*dk + 2*Hv*dv + 2*Hv, hidden]` <-> HF `(qkvz, ba)` (Qwen3-Next) or `(qkv, z, b, a)`
    (Qwen3.5); TP rank s holds `[q_s; k_s; v_s; z_s; b_s; a_s]`."""

    megatron: str
    hf: tuple[str, ...]
    """Two names (in_proj_qkvz, in_proj_ba) or four (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a)."""
    widths: GDNWidths

    def __post_init__(self) -> None:
        if len(self.hf) not in (2, 4):
            raise MappingError(f"{self.megatron}: needs (qkvz, ba) or (qkv, z, b, a), got {self.hf}")

    @property
    def hf_names(self) -> tuple[str, ...]:
        return self.hf

    def canonical(self, coord: RankCoord) -> RankCoord:
        return RankCoord(tp_rank=coord.tp_rank)

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return [RankCoord(tp_rank=r) for r in range(layout.tp)]

    def components(self, hf: Mapping[str, Any]) -> list[Any]:
        """Flat q, k, v, z, b, a (views of the HF tensors), shapes checked."""
        w, rows = self.widths, self.widths.rows()
        if len(self.hf) == 2:
            qkvz = need(hf, self.hf[0])
            rest = tuple(qkvz.shape[1:])
            qkvz = need(hf, self.hf[0], (sum(rows[:4]), *rest))
            ba = need(hf, self.hf[1], (sum(rows[4:]), *rest))
            return [*ungroup_qkvz(qkvz, w), *ungroup_ba(ba, w)]
        qkv = need(hf, self.hf[0])
        rest = tuple(qkv.shape[1:])
        qkv = need(hf, self.hf[0], (sum(rows[:3]), *rest))
        z, b, a = (need(hf, name, (n, *rest)) for name, n in zip(self.hf[1:], rows[3:]))
        return [*qkv.split(list(rows[:3]), dim=0), z, b, a]

    def row_pieces(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> list[Any]:
        """The shard's row blocks, top to bottom: this rank's slice of q, k, v, z, b, a."""
        coord.check_in(layout)
        self.widths.check_tp(self.megatron, layout.tp)
        return [chunk(c, layout.tp, coord.tp_rank, 0) for c in self.components(hf)]

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """Rank `coord.tp_rank`'s `[q_s; k_s; v_s; z_s; b_s; a_s]`, `[in_proj rows / tp, hidden]`."""
        return torch.cat(self.row_pieces(hf, layout, coord), dim=0).contiguous()

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """Each rank's shard cut into its six sections; per section the slices by rank; then HF's grouping."""
        self.widths.check_tp(self.megatron, layout.tp)
        local = [n // layout.tp for n in self.widths.rows()]
        pieces = []
        for c in self.coords(layout):
            shard = shard_of(shards, c, self.megatron)
            if shard.shape[0] != sum(local):
                raise MappingError(f"{self.megatron}: {c} shard has {shard.shape[0]} rows, expected {sum(local)}")
            pieces.append(shard.split(local, dim=0))
        q, k, v, z, b, a = (torch.cat([p[i] for p in pieces], dim=0) for i in range(len(COMPONENTS)))
        if len(self.hf) == 2:
            yield self.hf[0], group_qkvz(q, k, v, z, self.widths).contiguous()
            yield self.hf[1], group_ba(b, a, self.widths).contiguous()
            return
        yield self.hf[0], torch.cat([q, k, v], dim=0).contiguous()
        for name, tensor in zip(self.hf[1:], (z, b, a)):
            yield name, tensor.contiguous()


def gdn_conv1d(*, megatron: str, hf: str, widths: GDNWidths) -> Blocks:
    """conv1d weight `[2*Hk*dk + Hv*dv, 1, kernel]` with channels `[q; k; v]`, each split over TP."""
    qk, v = widths.key_heads * widths.key_dim, widths.value_heads * widths.value_dim
    return Blocks(
        megatron=megatron,
        hf=hf,
        components=(("q", qk), ("k", qk), ("v", v)),
        units=(("linear_num_key_heads", widths.key_heads), ("linear_num_value_heads", widths.value_heads)),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ZeroCentered(Replicated):
    """A replicated norm weight `[n]` Megatron applies as `1 + w` and HF as a plain scale `w`: the shard is
    `hf - 1` (in the HF dtype), the export `shard + 1` (exact for HF values in [0.5, 2] in bf16)."""

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        return Replicated.to_shard(self, hf, layout, coord) - 1

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        for name, tensor in Replicated.from_shards(self, shards, layout):
            yield name, tensor + 1
