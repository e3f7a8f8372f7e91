"""OLMoE's explicit mappings: the Llama-style decoder of `dense.py` with MoE layers and full-width q/k norms."""

from __future__ import annotations

from convcheck.mappings import Replicated, Split
from convcheck.mappings.registry import MappingRule
from convcheck.models.dense import EMBEDDING_AND_FINAL_NORM, EXPERTS, LAYER_NORMS, hf_layer, output_layer
from convcheck.models.shared_mappings import LAYER_PREFIX, fused_qkv_rule

O_PROJ = MappingRule(
    LAYER_PREFIX + r"self_attention\.linear_proj\.weight",
    lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, "self_attn.o_proj.weight"), dim=1),
)

FULL_WIDTH_QK_NORMS = (
    MappingRule(
        LAYER_PREFIX + r"self_attention\.q_layernorm\.weight",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "self_attn.q_norm.weight")),
    ),
    MappingRule(
        LAYER_PREFIX + r"self_attention\.k_layernorm\.weight",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "self_attn.k_norm.weight")),
    ),
)
"""q_norm `[num_heads * head_dim]` and k_norm `[num_kv_heads * head_dim]`: one RMSNorm over every head, which the
bridge's OLMoESelfAttention holds whole on every TP rank (megatron-bridge 0.6.2 olmoe_provider.py:121-135), not
per head (Qwen3) nor split by heads."""


def olmoe_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of an OLMoE decoder (every layer MoE: router and routed experts, no dense MLP)."""
    return [
        *EMBEDDING_AND_FINAL_NORM,
        *LAYER_NORMS,
        fused_qkv_rule(LAYER_PREFIX, hf_layer, bias=True),
        O_PROJ,
        *FULL_WIDTH_QK_NORMS,
        *EXPERTS,
        output_layer(tied),
    ]
