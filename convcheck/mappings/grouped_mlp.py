"""Legacy GroupedMLP experts (megatron-core 0.16.1): per-expert HF gate/up/down_proj <-> `weight1` / `weight2`.

Layout, from megatron-core 0.16.1 megatron/core/transformer/moe/experts.py, class GroupedMLP (E = local experts,
F = moe_ffn_hidden_size, t = expert-TP size, i.e. `self.tp_group = pg_collection.expt_tp`, line 121):
- weight1 is allocated `[hidden, E * 2F / t]` (lines 128-133, 144-148) but read expert-major through
  `self.weight1.view(self.num_local_experts, self.config.hidden_size, -1)` (line 243): its memory is
  E blocks of `[hidden, 2F/t]`, i.e. block e is expert e's fc1 shard transposed (`x @ w1[e]`, trans_b=False).
- Within a block the last dim is `[gate slice | up slice]` of this ETP rank: the glu takes
  `torch.chunk(x, 2, dim=-1)` and returns `activation_func(x[0]) * x[1]` (lines 96-97); sharded_state_dict
  confirms it: `t.view(real_shape).transpose(-1, -2)` (353, 362), `torch.chunk(t, 2, -2)` (389) with offsets
  `(tp_rank, tp_size * 2)` for the gate and `(tp_size + tp_rank, tp_size * 2)` for the up half (396, 405).
- weight2 is `[E * F / t, hidden]` (lines 135-136, 151-154), read as `weight2.view(E, -1, hidden)` (line 244):
  block e is expert e's down_proj columns of this ETP rank, transposed: `down[:, r*F/t:(r+1)*F/t].T`.
- Local expert e on EP rank p is global expert `p * E + e` (`local_expert_indices_offset`, line 299).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import MappingError, RankCoord, Shards, chunk, need, shard_of


@dataclass(frozen=True, kw_only=True, slots=True)
class _GroupedBase:
    megatron: str
    num_experts: int
    """Global expert count (all EP ranks)."""
    hidden: int
    ffn: int
    """F: moe_ffn_hidden_size of one expert."""

    def __post_init__(self) -> None:
        if min(self.num_experts, self.hidden, self.ffn) < 1:
            raise MappingError(f"{self.megatron}: num_experts, hidden and ffn must be positive")

    def check_layout(self, layout: ParallelLayout) -> None:
        """MappingError unless EP divides the experts and ETP divides F."""
        if self.num_experts % layout.ep:
            raise MappingError(f"{self.megatron}: ep={layout.ep} does not divide num_experts={self.num_experts}")
        if self.ffn % layout.etp:
            raise MappingError(f"{self.megatron}: etp={layout.etp} does not divide ffn={self.ffn}")

    def local_experts(self, layout: ParallelLayout) -> int:
        return self.num_experts // layout.ep

    def global_expert(self, layout: ParallelLayout, ep_rank: int, local: int) -> int:
        """Global id of local expert `local` on EP rank `ep_rank`."""
        return ep_rank * self.local_experts(layout) + local

    def canonical(self, coord: RankCoord) -> RankCoord:
        return RankCoord(ep_rank=coord.ep_rank, etp_rank=coord.etp_rank)

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return [RankCoord(ep_rank=p, etp_rank=r) for p in range(layout.ep) for r in range(layout.etp)]


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupedFc1(_GroupedBase):
    """weight1 `[hidden, E_local * 2F/etp]` (expert-major memory) <-> gate_proj/up_proj `[F, hidden]` per expert."""

    gate: str
    """HF name template with `{expert}`, e.g. `model.layers.0.mlp.experts.{expert}.gate_proj.weight`."""
    up: str

    @property
    def hf_names(self) -> tuple[str, ...]:
        return tuple(t.format(expert=e) for e in range(self.num_experts) for t in (self.gate, self.up))

    def expert_block(self, hf: Mapping[str, Any], expert: int, layout: ParallelLayout, etp_rank: int) -> Any:
        """Expert `expert`'s block for ETP rank `etp_rank`: `[hidden, 2F/etp]` = `[gate_r; up_r]^T`."""
        gate = need(hf, self.gate.format(expert=expert), (self.ffn, self.hidden))
        up = need(hf, self.up.format(expert=expert), (self.ffn, self.hidden))
        rows = torch.cat([chunk(gate, layout.etp, etp_rank, 0), chunk(up, layout.etp, etp_rank, 0)], dim=0)
        return rows.t()

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """The EP rank's experts in local order, each `[hidden, 2F/etp]`, laid end to end in memory."""
        self.check_layout(layout)
        coord.check_in(layout)
        n = self.local_experts(layout)
        blocks = [
            self.expert_block(hf, self.global_expert(layout, coord.ep_rank, e), layout, coord.etp_rank)
            for e in range(n)
        ]
        return torch.stack(blocks).contiguous().view(self.hidden, n * 2 * self.ffn // layout.etp)

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """One global expert at a time: its blocks from every ETP rank of its EP rank -> gate_proj, up_proj."""
        self.check_layout(layout)
        n, width = self.local_experts(layout), 2 * self.ffn // layout.etp
        for ep_rank in range(layout.ep):
            for local in range(n):
                gates, ups = [], []
                for etp_rank in range(layout.etp):
                    shard = shard_of(shards, RankCoord(ep_rank=ep_rank, etp_rank=etp_rank), self.megatron)
                    if tuple(shard.shape) != (self.hidden, n * width):
                        raise MappingError(
                            f"{self.megatron}: shard shape {list(shard.shape)}, expected {[self.hidden, n * width]}"
                        )
                    rows = shard.contiguous().view(n, self.hidden, width)[local].t()
                    gate, up = rows.split(width // 2, dim=0)
                    gates.append(gate)
                    ups.append(up)
                expert = self.global_expert(layout, ep_rank, local)
                yield self.gate.format(expert=expert), torch.cat(gates, dim=0).contiguous()
                yield self.up.format(expert=expert), torch.cat(ups, dim=0).contiguous()


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupedFc2(_GroupedBase):
    """weight2 `[E_local * F/etp, hidden]` (expert-major) <-> down_proj `[hidden, F]` per expert."""

    down: str
    """HF name template with `{expert}`, e.g. `model.layers.0.mlp.experts.{expert}.down_proj.weight`."""

    @property
    def hf_names(self) -> tuple[str, ...]:
        return tuple(self.down.format(expert=e) for e in range(self.num_experts))

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """The EP rank's experts in local order, each `down[:, etp slice].T` of shape `[F/etp, hidden]`."""
        self.check_layout(layout)
        coord.check_in(layout)
        blocks = []
        for e in range(self.local_experts(layout)):
            name = self.down.format(expert=self.global_expert(layout, coord.ep_rank, e))
            down = need(hf, name, (self.hidden, self.ffn))
            blocks.append(chunk(down, layout.etp, coord.etp_rank, 1).t())
        return torch.cat(blocks, dim=0).contiguous()

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """One global expert at a time: its `[F/etp, hidden]` blocks from every ETP rank -> down_proj."""
        self.check_layout(layout)
        n, rows = self.local_experts(layout), self.ffn // layout.etp
        for ep_rank in range(layout.ep):
            for local in range(n):
                parts = []
                for etp_rank in range(layout.etp):
                    shard = shard_of(shards, RankCoord(ep_rank=ep_rank, etp_rank=etp_rank), self.megatron)
                    if tuple(shard.shape) != (n * rows, self.hidden):
                        raise MappingError(
                            f"{self.megatron}: shard shape {list(shard.shape)}, expected {[n * rows, self.hidden]}"
                        )
                    parts.append(shard.view(n, rows, self.hidden)[local].t())
                expert = self.global_expert(layout, ep_rank, local)
                yield self.down.format(expert=expert), torch.cat(parts, dim=1).contiguous()
