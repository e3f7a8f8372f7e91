"""One expert's parameter <-> its slice `[e]` of a fused HF expert tensor, as transformers 5 and Qwen3.6 store MoE
experts: `experts.gate_up_proj` `[E, 2F, hidden]` (slice e is `[gate rows; up rows]`, the bridge's
FusedGatedExpertMapping splits it with torch.chunk(.., 2, dim=0), param_mapping.py:3010) and `experts.down_proj`
`[E, hidden, F]` (slice e is expert e's down_proj).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import MappingError, RankCoord, Shards, need
from convcheck.mappings.simple import Gated, Split


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpertSlice:
    """`inner` (one expert's per-expert mapping) read from and written to `fused[expert]`; the registry counts the
    fused tensor produced once when every expert's slice is. Subclasses say how a slice holds the inner tensors
    (`_parts`) and how they go back into one (`from_shards`)."""

    inner: Any
    fused: str
    """The fused HF tensor, `[E, ...]`."""

    @property
    def megatron(self) -> str:
        return self.inner.megatron

    @property
    def expert(self) -> int:
        return int(self.inner.expert or 0)

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.fused,)

    @property
    def fused_part(self) -> tuple[str, int, int]:
        """(fused HF name, this slice, slices in all)."""
        return self.fused, self.expert, self.inner.num_experts

    def canonical(self, coord: RankCoord) -> RankCoord:
        return self.inner.canonical(coord)

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return self.inner.coords(layout)

    def _slice(self, hf: Mapping[str, Any]) -> Any:
        """`fused[expert]`, after checking the fused tensor holds one slice per expert."""
        fused = need(hf, self.fused)
        if fused.shape[0] != self.inner.num_experts:
            raise MappingError(f"{self.fused}: shape {list(fused.shape)}, expected [{self.inner.num_experts}, ...]")
        return fused[self.expert]

    def _parts(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        """The inner mapping's HF tensors, as views of `fused[expert]` in Megatron's orientation."""
        raise NotImplementedError

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """Slice `fused[expert]` rebuilt, named `fused[expert]` (the whole tensor needs every expert's shards)."""
        raise NotImplementedError

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        return self.inner.to_shard(self._parts(hf), layout, coord)

    def row_pieces(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> list[Any] | None:
        """The inner mapping's row blocks, when it gives them (Gated)."""
        pieces = getattr(self.inner, "row_pieces", None)
        return None if pieces is None else pieces(self._parts(hf), layout, coord)


@dataclass(frozen=True, kw_only=True, slots=True)
class FusedSlice(ExpertSlice):
    """`inner` (the per-expert Gated fc1 or row-parallel Split fc2 of expert `expert`) read from and written to
    `fused[expert]`, `[E, 2F, hidden]` (Gated: slice e is [gate rows; up rows]) or `[E, hidden, F]` (Split)."""

    inner: Gated | Split

    def _parts(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        """The inner mapping's HF tensors: views of slice `[expert]` of the fused tensor."""
        piece = self._slice(hf)
        if piece.dim() != 2:
            raise MappingError(f"{self.fused}: slice {list(piece.shape)}, expected [{self.inner.num_experts}, ., .]")
        if isinstance(self.inner, Gated):
            if piece.shape[0] % 2:
                raise MappingError(f"{self.fused}: {piece.shape[0]} rows do not split into gate and up")
            gate, up = piece.chunk(2, dim=0)
            return {self.inner.gate: gate, self.inner.up: up}
        return {self.inner.hf: piece}

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """Slice `fused[expert]` rebuilt, named `fused[expert]` (the whole tensor needs every expert's shards)."""
        parts = dict(self.inner.from_shards(shards, layout))
        if isinstance(self.inner, Gated):
            yield f"{self.fused}[{self.expert}]", torch.cat([parts[self.inner.gate], parts[self.inner.up]], dim=0)
        else:
            yield f"{self.fused}[{self.expert}]", parts[self.inner.hf]


@dataclass(frozen=True, kw_only=True, slots=True)
class TransposedFusedSlice(FusedSlice):
    """FusedSlice of a fused tensor stored transposed, as published Qwen3-VL-MoE checkpoints hold their experts:
    `gate_up_proj` `[E, hidden, 2F]` (slice e transposed is [gate rows; up rows]) and `down_proj` `[E, F, hidden]`
    (slice e transposed is expert e's down_proj); the bridge's FusedGatedExpertMapping / FusedExpertMapping with
    transpose_on_export (megatron-bridge 0.6.2 qwen_vl/qwen3_vl_bridge.py:357)."""

    def _slice(self, hf: Mapping[str, Any]) -> Any:
        """`fused[expert].T`, `[2F, hidden]` or `[hidden, F]`."""
        return FusedSlice._slice(self, hf).transpose(0, 1)

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """Slice `fused[expert]` rebuilt in the stored (transposed) orientation."""
        for name, tensor in FusedSlice.from_shards(self, shards, layout):
            yield name, tensor.transpose(0, 1).contiguous()


def stored_as_linear(shapes: Mapping[str, tuple[int, ...]], hidden: int, moe_ffn: int) -> bool:
    """Whether a checkpoint's fused `...mlp.experts.gate_up_proj` tensors (`shapes`: HF name -> shape) hold each
    expert as `[2F, hidden]` (nn.Linear's orientation, square ones included) rather than transposed `[hidden, 2F]`.
    transformers decides the same way on load: its Qwen3-VL-MoE conversion `Transpose(1, 2, check_dims=True)`
    transposes a stored tensor only when its shape differs from the parameter's (transformers 5.12.1
    conversion_mapping.py:838, core_model_loading.py:290); its save_pretrained writes the parameter's orientation."""
    for name, shape in shapes.items():
        if name.endswith(".mlp.experts.gate_up_proj") and len(shape) == 3:
            return tuple(shape[1:]) == (2 * moe_ffn, hidden)
    return False
