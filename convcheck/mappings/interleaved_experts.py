"""One GPT-OSS expert's parameter <-> its slice `[e]` of a fused HF expert tensor, gate and up interleaved.

transformers 5.12.1 modeling_gpt_oss.py:80-93 holds (E experts, F = intermediate_size):
- `experts.gate_up_proj` `[E, hidden, 2F]`, applied as `x @ W[e]`; output column 2j is gate j, 2j+1 is up j
  (`gate_up[..., ::2]`, `gate_up[..., 1::2]`), and `gate_up_proj_bias` `[E, 2F]` alternates the same way;
- `experts.down_proj` `[E, F, hidden]`, applied as `g @ D[e]`, and `down_proj_bias` `[E, hidden]`.
Megatron's expert fc1 is `[2F/etp, hidden]` = `[gate_r; up_r]` (this ETP rank's gate rows, then its up rows; the
GLU chunks the output in two halves, megatron/core/transformer/mlp.py glu), its bias `[2F/etp]` the same way; fc2
is row parallel, `[hidden, F/etp]` = `D[e].T[:, etp slice]`, its bias `[hidden]` whole on every ETP rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import MappingError, RankCoord, Shards, need, shard_of
from convcheck.mappings.fused_experts import ExpertSlice
from convcheck.mappings.simple import Gated, Split, _Owned

PROJECTIONS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
"""The fused HF expert tensors of one GPT-OSS layer, each `[E, ...]`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpertBias(_Owned):
    """One expert's row-parallel bias `[hidden]`: whole on every ETP rank of the EP rank that owns the expert."""

    hf: str

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.hf,)

    def canonical(self, coord: RankCoord) -> RankCoord:
        return RankCoord(ep_rank=coord.ep_rank)

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return [RankCoord(ep_rank=self.owner(layout))]

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        self.check_coord(layout, coord)
        return need(hf, self.hf)

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        yield self.hf, shard_of(shards, self.coords(layout)[0], self.megatron)


Inner = Gated | Split | ExpertBias


@dataclass(frozen=True, kw_only=True, slots=True)
class InterleavedSlice(ExpertSlice):
    """`inner` (expert `expert`'s fc1 / fc2 weight or bias, in Megatron's order) read from and written to
    `fused[expert]` of the GPT-OSS fused tensor `projection`."""

    inner: Inner
    projection: str
    """One of PROJECTIONS."""

    def __post_init__(self) -> None:
        if self.projection not in PROJECTIONS:
            raise MappingError(f"{self.fused}: projection must be one of {PROJECTIONS}, got {self.projection!r}")

    def _parts(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        """The inner mapping's HF tensors, as views of `fused[expert]` in Megatron's orientation."""
        piece = self._slice(hf)
        if isinstance(self.inner, Gated):  # [hidden, 2F] -> gate, up [F, hidden]; a bias [2F] -> [F], [F]
            if piece.shape[-1] % 2:
                raise MappingError(f"{self.fused}: {piece.shape[-1]} columns do not alternate gate and up")
            gate, up = piece[..., 0::2], piece[..., 1::2]
            return {
                self.inner.gate: gate.t() if gate.dim() == 2 else gate,
                self.inner.up: up.t() if up.dim() == 2 else up,
            }
        if isinstance(self.inner, Split):  # down_proj [F, hidden] -> fc2 [hidden, F]
            return {self.inner.hf: piece.t()}
        return {self.inner.hf: piece}

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """Slice `fused[expert]` rebuilt in HF's orientation (gate and up interleaved), named `fused[expert]`."""
        parts = dict(self.inner.from_shards(shards, layout))
        name = f"{self.fused}[{self.expert}]"
        if isinstance(self.inner, Gated):
            gate, up = parts[self.inner.gate], parts[self.inner.up]
            if gate.dim() == 2:
                gate, up = gate.t(), up.t()
            yield name, torch.stack([gate, up], dim=-1).flatten(-2).contiguous()
        elif isinstance(self.inner, Split):
            yield name, parts[self.inner.hf].t().contiguous()
        else:
            yield name, parts[self.inner.hf]
