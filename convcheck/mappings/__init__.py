"""Explicit Megatron <-> HF mappings as pure functions of tensors, a ParallelLayout and a RankCoord."""

from convcheck.hf.geometry import Geometry
from convcheck.mappings.base import CoverageError, MappingError, RankCoord, Shards, TensorMapping
from convcheck.mappings.check import roundtrip_findings
from convcheck.mappings.copies import WithCopies
from convcheck.mappings.gdn import GDNInProj, GDNWidths, ZeroCentered, gdn_conv1d
from convcheck.mappings.grouped_mlp import GroupedFc1, GroupedFc2
from convcheck.mappings.mamba import Blocks, mamba_conv1d, mamba_in_proj
from convcheck.mappings.mla import HeadRows
from convcheck.mappings.qkv import FusedQKV
from convcheck.mappings.registry import MappingRegistry, MappingRule, registry_from_rules
from convcheck.mappings.simple import Gated, Replicated, Split
from convcheck.mappings.vision import ConcatenatedQKV

__all__ = [
    "Blocks",
    "CoverageError",
    "ConcatenatedQKV",
    "FusedQKV",
    "GDNInProj",
    "GDNWidths",
    "Gated",
    "Geometry",
    "GroupedFc1",
    "GroupedFc2",
    "HeadRows",
    "MappingError",
    "MappingRegistry",
    "MappingRule",
    "RankCoord",
    "Replicated",
    "Shards",
    "Split",
    "TensorMapping",
    "WithCopies",
    "ZeroCentered",
    "gdn_conv1d",
    "registry_from_rules",
    "mamba_conv1d",
    "mamba_in_proj",
    "roundtrip_findings",
]
