"""Megatron-side name patterns and mapping builders that every model family's explicit mappings share."""

from __future__ import annotations

import re
from collections.abc import Callable

from convcheck.hf.geometry import Geometry
from convcheck.mappings import FusedQKV, Gated, GroupedFc1, GroupedFc2, Split
from convcheck.mappings.fused_experts import FusedSlice
from convcheck.mappings.registry import MappingRule

LAYER_PREFIX = r"decoder\.layers\.(?P<layer>\d+)\."
"""Megatron's name prefix of one decoder layer; the `layer` group is the global layer number."""


def fused_qkv_rule(
    prefix: str, hf_layer: Callable[[re.Match[str], str], str], module: str = "self_attn", bias: bool = False
) -> MappingRule:
    """linear_qkv `[G * (n + 2) * d / tp, hidden]` (with the output gate `[G * (2n + 2) * d / tp, hidden]`, per group
    [q heads; gate heads; k; v]) from `{module}.q_proj` / `k_proj` / `v_proj` of the layer `hf_layer` names; `bias`:
    the fused bias too."""
    return MappingRule(
        prefix + r"self_attention\.linear_qkv\." + (r"(?P<kind>weight|bias)" if bias else r"(?P<kind>weight)"),
        lambda match, geometry: FusedQKV(
            megatron=match[0],
            q=hf_layer(match, f"{module}.q_proj.{match['kind']}"),
            k=hf_layer(match, f"{module}.k_proj.{match['kind']}"),
            v=hf_layer(match, f"{module}.v_proj.{match['kind']}"),
            num_heads=geometry.num_heads,
            num_query_groups=geometry.num_query_groups,
            head_dim=geometry.head_dim,
            output_gate=geometry.attention_output_gate,
        ),
    )


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


def routed_expert_rules(
    prefix: str, hf: ExpertName, when: Callable[[re.Match[str], frozenset[str]], bool] | None = None
) -> tuple[MappingRule, ...]:
    """Every spelling of a layer's routed experts: one expert per parameter (SequentialMLP `local_experts.E` or TE
    grouped `linear_fcN.weightE`, E global; gated linear_fc1 [2 x ffn/etp, hidden], row-parallel linear_fc2
    [hidden, ffn/etp], split over ETP) and legacy GroupedMLP (megatron-core <= 0.16: all local experts in one
    weight1 / weight2); `when`: whether the one-expert rules apply (per-expert HF tensors, not fused ones)."""

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
            when,
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
            when,
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


FusedName = Callable[[re.Match[str], str], str]
"""(match, fused projection: gate_up_proj or down_proj) -> that fused HF tensor of the matched layer."""


def fused_expert_rules(prefix: str, fused: FusedName) -> tuple[MappingRule, ...]:
    """One expert per parameter (SequentialMLP or TE grouped) <-> its slice of the layer's fused `gate_up_proj`
    `[E, 2F, hidden]` / `down_proj` `[E, hidden, F]`; they apply where the checkpoint holds the fused tensor (as the
    bridge chooses with moe_experts_stored_packed), and `stored_fused` says where that is."""

    def fc1(match: re.Match[str], geometry: Geometry) -> FusedSlice:
        name = fused(match, "gate_up_proj")
        inner = Gated(
            megatron=match[0],
            axis="etp",
            expert=int(expert_id(match)),
            num_experts=geometry.num_experts,
            gate=f"{name}[{expert_id(match)}].gate",
            up=f"{name}[{expert_id(match)}].up",
        )
        return FusedSlice(inner=inner, fused=name)

    def fc2(match: re.Match[str], geometry: Geometry) -> FusedSlice:
        name = fused(match, "down_proj")
        inner = Split(
            megatron=match[0],
            axis="etp",
            dim=1,
            expert=int(expert_id(match)),
            num_experts=geometry.num_experts,
            hf=f"{name}[{expert_id(match)}]",
        )
        return FusedSlice(inner=inner, fused=name)

    return (
        MappingRule(prefix + expert_weight(1), fc1, stored_fused(fused)),
        MappingRule(prefix + expert_weight(2), fc2, stored_fused(fused)),
    )


def stored_fused(fused: FusedName) -> Callable[[re.Match[str], frozenset[str]], bool]:
    """Whether the checkpoint holds the matched layer's experts fused (its `gate_up_proj` is an HF tensor)."""
    return lambda match, names: fused(match, "gate_up_proj") in names


def stored_per_expert(fused: FusedName) -> Callable[[re.Match[str], frozenset[str]], bool]:
    """The opposite of `stored_fused`."""
    return lambda match, names: fused(match, "gate_up_proj") not in names
