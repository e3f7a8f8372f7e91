"""Megatron-side name patterns and mapping builders that every model family's explicit mappings share."""

from __future__ import annotations

import re
from collections.abc import Callable

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Gated, GroupedFc1, GroupedFc2, Split
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
"""(match, geometry, projection) -> the HF name of that projection of an expert of the matched layer, with an
`{expert}` field left to fill."""


def routed_expert_rules(prefix: str, hf: ExpertName) -> tuple[MappingRule, ...]:
    """Every spelling of a layer's routed experts: one expert per parameter (SequentialMLP `local_experts.E` or TE
    grouped `linear_fcN.weightE`, E global; gated linear_fc1 [2 x ffn/etp, hidden], row-parallel linear_fc2
    [hidden, ffn/etp], split over ETP) and legacy GroupedMLP (megatron-core <= 0.16: all local experts in one
    weight1 / weight2)."""

    def one(match: re.Match[str], geometry: Geometry, projection: str) -> str:
        return hf(match, geometry, projection).format(expert=expert_id(match))

    return (
        MappingRule(
            prefix + expert_weight(1),
            lambda match, geometry: Gated(
                megatron=match[0],
                axis="etp",
                expert=int(expert_id(match)),
                num_experts=geometry.num_experts,
                gate=one(match, geometry, "gate_proj"),
                up=one(match, geometry, "up_proj"),
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
                hf=one(match, geometry, "down_proj"),
            ),
        ),
        MappingRule(
            prefix + r"mlp\.experts\.weight1",
            lambda match, geometry: GroupedFc1(
                megatron=match[0],
                num_experts=geometry.num_experts,
                hidden=geometry.hidden,
                ffn=geometry.moe_ffn,
                gate=hf(match, geometry, "gate_proj"),
                up=hf(match, geometry, "up_proj"),
            ),
        ),
        MappingRule(
            prefix + r"mlp\.experts\.weight2",
            lambda match, geometry: GroupedFc2(
                megatron=match[0],
                num_experts=geometry.num_experts,
                hidden=geometry.hidden,
                ffn=geometry.moe_ffn,
                down=hf(match, geometry, "down_proj"),
            ),
        ),
    )
