"""Mamba-2 mixer: HF `in_proj` / `conv1d` (components stacked on dim 0) <-> Megatron's per-TP-rank blocks.

From megatron-core 0.19.2 megatron/core/ssm/mamba_mixer.py (d = mamba_num_heads * mamba_head_dim, G = groups,
N = state size, H = heads, t = TP size):
- `in_proj.weight` `[2d + 2GN + H, hidden]`: HF rows are `[z (d), x (d), B (GN), C (GN), dt (H)]`; TP rank r holds
  `[z_r, x_r, B_r, C_r, dt_r]`, each the r-th of t equal row slices of its component (groups and heads contiguous).
- `conv1d_weight` `[d + 2GN, 1, k]` / `conv1d_bias` `[d + 2GN]`: HF rows `[x, B, C]`; rank r holds `[x_r, B_r, C_r]`.
- `A_log`, `D`, `dt_bias` `[H]` and the gated norm `weight` `[d]` are plain dim-0 splits (see simple.Split).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import MappingError, RankCoord, Shards, chunk, need, shard_of


@dataclass(frozen=True, kw_only=True, slots=True)
class Blocks:
    """One HF tensor whose dim 0 stacks named components; each TP rank holds its slice of every component, in order."""

    megatron: str
    hf: str
    components: tuple[tuple[str, int], ...]
    """(label, rows) in HF order, e.g. `(("z", d), ("x", d), ("B", G*N), ("C", G*N), ("dt", H))`."""
    units: tuple[tuple[str, int], ...] = ()
    """(label, count) of the indivisible units per component (heads, groups); TP must divide each count."""

    def __post_init__(self) -> None:
        if not self.components or any(rows < 1 for _, rows in self.components):
            raise MappingError(f"{self.megatron}: every component needs a positive row count, got {self.components}")

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.hf,)

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.components)

    def check_layout(self, layout: ParallelLayout) -> None:
        """MappingError unless TP splits every component (and its heads / groups) evenly."""
        for label, count in self.units:
            if count % layout.tp:
                raise MappingError(f"{self.megatron}: {label}={count} is not divisible by tp={layout.tp}")
        for label, rows in self.components:
            if rows % layout.tp:
                raise MappingError(f"{self.megatron}: component {label} ({rows} rows) does not split by tp={layout.tp}")

    def canonical(self, coord: RankCoord) -> RankCoord:
        return RankCoord(tp_rank=coord.tp_rank)

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return [RankCoord(tp_rank=r) for r in range(layout.tp)]

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """`[c0_r; c1_r; ...]`: rank r's slice of each component, concatenated in HF component order."""
        coord.check_in(layout)
        self.check_layout(layout)
        tensor = need(hf, self.hf)
        if tensor.shape[0] != self.rows:
            raise MappingError(f"{self.megatron}: HF {self.hf} has {tensor.shape[0]} rows, expected {self.rows}")
        parts = tensor.split([rows for _, rows in self.components], dim=0)
        return torch.cat([chunk(p, layout.tp, coord.tp_rank, 0) for p in parts], dim=0).contiguous()

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """Each rank's shard cut into its component slices; per component the slices by rank, components in order."""
        self.check_layout(layout)
        local = [rows // layout.tp for _, rows in self.components]
        pieces = []
        for c in self.coords(layout):
            shard = shard_of(shards, c, self.megatron)
            if shard.shape[0] != sum(local):
                raise MappingError(f"{self.megatron}: {c} shard has {shard.shape[0]} rows, expected {sum(local)}")
            pieces.append(shard.split(local, dim=0))
        full = [torch.cat([p[i] for p in pieces], dim=0) for i in range(len(self.components))]
        yield self.hf, torch.cat(full, dim=0).contiguous()


def mamba_in_proj(*, megatron: str, hf: str, heads: int, head_dim: int, groups: int, state: int) -> Blocks:
    """in_proj `[2d + 2GN + H, hidden]` with HF rows `[z, x, B, C, dt]` (d = heads * head_dim)."""
    d, gn = heads * head_dim, groups * state
    return Blocks(
        megatron=megatron,
        hf=hf,
        components=(("z", d), ("x", d), ("B", gn), ("C", gn), ("dt", heads)),
        units=(("mamba_num_heads", heads), ("mamba_num_groups", groups)),
    )


def mamba_conv1d(*, megatron: str, hf: str, heads: int, head_dim: int, groups: int, state: int) -> Blocks:
    """conv1d weight `[d + 2GN, 1, k]` or bias `[d + 2GN]` with HF rows `[x, B, C]`."""
    d, gn = heads * head_dim, groups * state
    return Blocks(
        megatron=megatron,
        hf=hf,
        components=(("x", d), ("B", gn), ("C", gn)),
        units=(("mamba_num_heads", heads), ("mamba_num_groups", groups)),
    )
