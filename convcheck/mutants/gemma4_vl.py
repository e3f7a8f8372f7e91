"""Planted Gemma 4 VL bugs through the real Megatron-Bridge objects: the vision tower's x / y position tables
exchanged, the vision embedder's projection read in the transposed storage order; both made identically in import and
export (a roundtrip cannot see them)."""

from __future__ import annotations

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.param_mapping import ReplicatedMapping

from convcheck.mutants.patch import transform_hf_symmetrically

POSITION_TABLE = "vision_tower.patch_embedder.position_embedding_table"
PROJECTION = "embed_vision.embedding_projection.weight"


def _tables_exchanged(table: torch.Tensor) -> torch.Tensor:
    """`[2, N, V]` with its x table (index 0) and y table (index 1) exchanged."""
    return table.flip(0).contiguous()


def position_tables_swapped() -> None:
    """The vision tower's position table `[2, N_pos, V]` (x positions' embeddings, then y's) is imported with its two
    tables exchanged and exported exchanged back: every patch gets its column's embedding from the row table."""
    transform_hf_symmetrically(ReplicatedMapping, POSITION_TABLE, _tables_exchanged, _tables_exchanged)


def _transposed(weight: torch.Tensor) -> torch.Tensor:
    """`[H, V]` read as if stored `[V, H]`: its transpose's elements in `[H, V]`'s shape."""
    return weight.t().contiguous().view(weight.shape)


def _untransposed(weight: torch.Tensor) -> torch.Tensor:
    """`_transposed`'s inverse: `[H, V]` elements viewed `[V, H]`, transposed back."""
    return weight.view(weight.shape[1], weight.shape[0]).t().contiguous()


def vision_projection_transposed() -> None:
    """The multimodal embedder's projection `[H, V]` (vision width V to the text width H) is imported in the
    transposed storage order (the same elements, each at another place of the same shape) and exported back: every
    image soft token is projected by a scrambled matrix."""
    transform_hf_symmetrically(ReplicatedMapping, PROJECTION, _transposed, _untransposed)
