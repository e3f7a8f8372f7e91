"""Megatron-side name patterns and mapping builders that every model family's explicit mappings share."""

from __future__ import annotations

import re

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Split

LAYER_PREFIX = r"decoder\.layers\.(?P<layer>\d+)\."
"""Megatron's name prefix of one decoder layer; the `layer` group is the global layer number."""


def expert_weight(fc: int) -> str:
    """One expert's linear_fcN: SequentialMLP `local_experts.E.linear_fcN.weight` or TE grouped `linear_fcN.weightE`
    (E global)."""
    return (
        rf"mlp\.experts\.(local_experts\.(?P<local>\d+)\.linear_fc{fc}\.weight|linear_fc{fc}\.weight(?P<grouped>\d+))"
    )


def expert_id(match: re.Match[str]) -> str:
    """The global expert number of an `expert_weight` match, whichever spelling matched."""
    return match["local"] or match["grouped"]


def vocab_rows(megatron: str, hf: str, geometry: Geometry) -> Split:
    """A vocabulary-parallel embedding or output layer: rows split over TP, padded to Megatron's rows."""
    return Split(megatron=megatron, hf=hf, padded_rows=geometry.padded_vocab, unpadded_rows=geometry.vocab)
