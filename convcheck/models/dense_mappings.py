"""Explicit mappings of the Llama-style decoders (Llama, Qwen2, Qwen3, Qwen3-MoE, Mistral): Megatron names -> HF names
and the mapping kind, local spec, TE spec and legacy GroupedMLP names alike."""

from __future__ import annotations

import re

from convcheck.mappings import Gated, Replicated, Split
from convcheck.mappings.registry import MappingRule
from convcheck.models.shared_mappings import (
    LAYER_PREFIX,
    fused_qkv_rule,
    routed_expert_rules,
    vocab_rows,
)

EMBEDDING = "model.embed_tokens.weight"


def hf_layer(match: re.Match[str], suffix: str) -> str:
    """HF name of `suffix` in the matched Megatron layer: model.layers.N.<suffix>."""
    return f"model.layers.{match['layer']}.{suffix}"


def hf_expert(match: re.Match[str], projection: str) -> str:
    """HF name of one expert's projection weight in the matched layer, with an `{expert}` field left to fill."""
    return hf_layer(match, f"mlp.experts.{{expert}}.{projection}.weight")


EMBEDDING_AND_FINAL_NORM = (
    MappingRule(
        r"embedding\.word_embeddings\.weight", lambda match, geometry: vocab_rows(match[0], EMBEDDING, geometry)
    ),
    MappingRule(
        r"decoder\.final_layernorm\.weight",
        lambda match, geometry: Replicated(megatron=match[0], hf="model.norm.weight"),
    ),
)
LAYER_NORMS = (
    MappingRule(
        LAYER_PREFIX + r"(input_layernorm\.weight|self_attention\.linear_qkv\.layer_norm_weight)",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "input_layernorm.weight")),
    ),
    MappingRule(
        LAYER_PREFIX + r"(pre_mlp_layernorm\.weight|mlp\.linear_fc1\.layer_norm_weight)",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "post_attention_layernorm.weight")),
    ),
)
OUTPUT_PROJECTION = MappingRule(
    LAYER_PREFIX + r"self_attention\.linear_proj\.weight",
    lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, "self_attn.o_proj.weight"), dim=1),
)
"""linear_proj `[H, heads * d / tp]` (row-parallel) <-> self_attn.o_proj."""
ATTENTION = (
    fused_qkv_rule(LAYER_PREFIX, hf_layer, bias=True),
    MappingRule(
        LAYER_PREFIX + r"self_attention\.q_layernorm\.weight",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "self_attn.q_norm.weight")),
    ),
    MappingRule(
        LAYER_PREFIX + r"self_attention\.k_layernorm\.weight",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "self_attn.k_norm.weight")),
    ),
    OUTPUT_PROJECTION,
)
GATED_MLP = (
    MappingRule(
        LAYER_PREFIX + r"mlp\.linear_fc1\.weight",
        lambda match, geometry: Gated(
            megatron=match[0], gate=hf_layer(match, "mlp.gate_proj.weight"), up=hf_layer(match, "mlp.up_proj.weight")
        ),
    ),
    MappingRule(
        LAYER_PREFIX + r"mlp\.linear_fc2\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, "mlp.down_proj.weight"), dim=1),
    ),
)
EXPERTS = (
    MappingRule(
        LAYER_PREFIX + r"mlp\.router\.weight",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "mlp.gate.weight")),
    ),
    *routed_expert_rules(LAYER_PREFIX, lambda match, _geometry, projection: hf_expert(match, projection)),
)


def output_layer(tied: bool) -> MappingRule:
    """lm_head; tied: the output layer (PP > 1) is a copy of the embedding and produces nothing of its own."""
    hf = EMBEDDING if tied else "lm_head.weight"
    return MappingRule(r"output_layer\.weight", lambda match, geometry: vocab_rows(match[0], hf, geometry))


def decoder_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of a Llama-style decoder (dense or MoE layers)."""
    return [*EMBEDDING_AND_FINAL_NORM, *LAYER_NORMS, *ATTENTION, *GATED_MLP, *EXPERTS, output_layer(tied)]
