"""Catalog entries of OLMoE bugs (hooks in convcheck.mutants.olmoe): its full-width q/k norms and its routed experts.

The q/k norm swap and the expert order are made identically in import and export (a roundtrip cannot see them): the
mapping oracle names the tensor and first wrong element, logits the changed forward. The q_norm loaded as if split
over TP leaves pre-load values in the parameter: coverage, roundtrip and mapping name the element.
"""

from __future__ import annotations

from convcheck.mutants.mutant import FORWARD, Mutant
from convcheck.mutants.mutant import HOOKS as _M

OLMOE = "tiny:olmoe"

OLMOE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="olmoe_qk_norm_sharded",
        description="OLMoE q_norm loaded as if split by heads over TP: each rank writes only its own heads' block of "
        "the full-width weight",
        hook=_M + "olmoe:qk_norm_sharded",
        fixture=OLMOE,
        layout="tp2",
        experts="te-grouped",
        catches=("coverage", "roundtrip", "layout", "mapping"),
        targets=(
            "decoder.layers.0.self_attention.q_layernorm.weight",
            "model.layers.0.self_attn.q_norm.weight",
            "<layout>",
        ),
    ),
    Mutant(
        name="olmoe_qk_norms_swapped",
        description="OLMoE q_layernorm <-> HF k_norm and k_layernorm <-> q_norm in every layer (import and export)",
        hook=_M + "olmoe:qk_norms_swapped",
        fixture=OLMOE,
        layout="tp1",
        experts="te-grouped",
        catches=("mapping", "logits"),
        targets=(
            "decoder.layers.*.self_attention.[qk]_layernorm.weight",
            "model.layers.*.self_attn.[qk]_norm.weight",
            FORWARD,
        ),
    ),
    Mutant(
        name="olmoe_experts_misordered",
        description="OLMoE layer 0's routed experts 0 and 1 trade HF tensors (grouped experts, import and export)",
        hook=_M + "olmoe:experts_misordered",
        fixture=OLMOE,
        layout="tp1",
        experts="te-grouped",
        catches=("mapping", "logits"),
        targets=(
            "decoder.layers.0.mlp.experts.linear_fc[12].weight[01]",
            "model.layers.0.mlp.experts.[01].*",
            FORWARD,
        ),
    ),
)
