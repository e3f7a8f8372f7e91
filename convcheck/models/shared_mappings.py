"""Megatron-side name patterns and mapping builders that every model family's explicit mappings share."""

from __future__ import annotations

import re
from collections.abc import Callable

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Gated, Split
from convcheck.mappings.registry import MappingRule

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


ExpertName = Callable[[re.Match[str], Geometry, str], str]
"""(match, geometry, projection) -> the HF name of that projection of the matched expert (global id filled in)."""


def routed_expert_rules(prefix: str, hf: ExpertName) -> tuple[MappingRule, MappingRule]:
    """One routed expert's gated linear_fc1 [2 x ffn/etp, hidden] (gate_proj | up_proj) and row-parallel linear_fc2
    [hidden, ffn/etp] (down_proj), split over ETP; E global, in either spelling of `expert_weight`."""
    return (
        MappingRule(
            prefix + expert_weight(1),
            lambda match, geometry: Gated(
                megatron=match[0],
                axis="etp",
                expert=int(expert_id(match)),
                num_experts=geometry.num_experts,
                gate=hf(match, geometry, "gate_proj"),
                up=hf(match, geometry, "up_proj"),
            ),
        ),
        MappingRule(
            prefix + expert_weight(2),
            lambda match, geometry: Split(
                megatron=match[0],
                axis="etp",
                dim=1,
                expert=int(expert_id(match)),
                num_experts=geometry.num_experts,
                hf=hf(match, geometry, "down_proj"),
            ),
        ),
    )
