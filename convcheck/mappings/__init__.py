"""Explicit Megatron <-> HF mappings as pure functions of tensors, a ParallelLayout and a RankCoord."""

from convcheck.mappings.base import CoverageError, MappingError, RankCoord, Shards, TensorMapping
from convcheck.mappings.check import roundtrip_findings
from convcheck.mappings.grouped_mlp import GroupedFc1, GroupedFc2
from convcheck.mappings.qkv import FusedQKV
from convcheck.mappings.registry import Geometry, MappingRegistry, build_registry
from convcheck.mappings.simple import Gated, Replicated, Split

__all__ = [
    "CoverageError",
    "FusedQKV",
    "Gated",
    "Geometry",
    "GroupedFc1",
    "GroupedFc2",
    "MappingError",
    "MappingRegistry",
    "RankCoord",
    "Replicated",
    "Shards",
    "Split",
    "TensorMapping",
    "build_registry",
    "roundtrip_findings",
]
