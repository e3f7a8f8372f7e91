"""Planted Gemma 3 VL bugs through the real Megatron-Bridge objects: the projector's `[V, H]` weight read as if stored
`[H, V]` (reshaped where it must be transposed), the soft-embedding norm's weight negated (HF's 1 + w read as 1 - w)."""

from __future__ import annotations

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.param_mapping import AutoMapping

from convcheck.mutants.patch import transform_hf_symmetrically

PROJECTION = "multi_modal_projector.proj.weight"
SOFT_NORM = "multi_modal_projector.mm_soft_embed_norm.weight"


def projector_reshaped() -> None:
    """The projector's HF `mm_input_projection_weight` `[V, H]` is imported as if it were stored `[H, V]` (its bytes
    reshaped to `[H, V]`, then transposed by the bridge's permute into `[H, V]`... of the wrong elements) and exported
    the inverse way (the same bug both ways, a roundtrip cannot see it): every soft token is projected by a scrambled
    matrix of the right shape."""

    def scrambled(tensor: torch.Tensor) -> torch.Tensor:
        rows, cols = tensor.shape
        return tensor.reshape(cols, rows).t().contiguous()

    def unscrambled(tensor: torch.Tensor) -> torch.Tensor:
        rows, cols = tensor.shape
        return tensor.t().reshape(rows, cols).contiguous()

    transform_hf_symmetrically(AutoMapping, PROJECTION, scrambled, unscrambled)


def soft_norm_negated() -> None:
    """The soft-embedding RMSNorm `[V]` is imported negated and exported negated back (exact in bf16; a roundtrip cannot
    see it): Megatron scales every pooled patch by 1 - w where HF scales by 1 + w."""

    def negated(tensor: torch.Tensor) -> torch.Tensor:
        return (-tensor).contiguous()

    transform_hf_symmetrically(AutoMapping, SOFT_NORM, negated, negated)
