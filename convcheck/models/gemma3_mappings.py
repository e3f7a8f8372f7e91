"""Gemma 3 text (Gemma3ForCausalLM) explicit mappings: the bridge's TE layer spec (megatron-bridge 0.6.2
gemma/gemma3_provider.py:143-170), whose sandwich norms live inside the linear layers.

Per decoder layer L (HF `model.layers.L.*`; d = head_dim, n = heads, G = KV groups, F = intermediate_size, H = hidden):
- `self_attention.linear_qkv.layer_norm_weight` `[H]` <- input_layernorm (the pre-attention norm), whole on every rank;
- `self_attention.linear_qkv.weight` `[G * (n / G + 2) * d / tp, H]` <- q_proj, k_proj, v_proj (per group [q; k; v]);
- `self_attention.q_layernorm.weight` / `k_layernorm.weight` `[d]` <- q_norm / k_norm (per head), whole;
- `self_attention.linear_proj.weight` `[H, n * d / tp]` <- o_proj, columns split;
- `self_attention.linear_proj.post_layernorm.weight` `[H]` <- post_attention_layernorm (TERowParallelLinearLayerNorm's
  post norm, applied to o_proj's output before the residual add), whole;
- `mlp.linear_fc1.layer_norm_weight` `[H]` <- pre_feedforward_layernorm, whole;
- `mlp.linear_fc1.weight` `[2F / tp, H]` = `[gate_r; up_r]` <- gate_proj, up_proj;
- `mlp.linear_fc2.weight` `[H, F / tp]` <- down_proj, columns split;
- `mlp.linear_fc2.post_layernorm.weight` `[H]` <- post_feedforward_layernorm, whole.
Every norm is zero-centred on both sides (HF Gemma3RMSNorm multiplies by 1 + w, Megatron's
layernorm_zero_centered_gamma): the stored weight is copied as is. The output layer is the tied embedding.
"""

from __future__ import annotations

from convcheck.mappings import Replicated
from convcheck.mappings.registry import MappingRule
from convcheck.models.dense_mappings import (
    EMBEDDING_AND_FINAL_NORM,
    GATED_MLP,
    OUTPUT_PROJECTION,
    hf_layer,
    output_layer,
)
from convcheck.models.shared_mappings import LAYER_PREFIX, fused_qkv_rule

NORMS: dict[str, str] = {
    r"self_attention\.linear_qkv\.layer_norm_weight": "input_layernorm.weight",
    r"self_attention\.q_layernorm\.weight": "self_attn.q_norm.weight",
    r"self_attention\.k_layernorm\.weight": "self_attn.k_norm.weight",
    r"self_attention\.linear_proj\.post_layernorm\.weight": "post_attention_layernorm.weight",
    r"mlp\.linear_fc1\.layer_norm_weight": "pre_feedforward_layernorm.weight",
    r"mlp\.linear_fc2\.post_layernorm\.weight": "post_feedforward_layernorm.weight",
}
"""Megatron norm (pattern after the layer prefix) -> HF norm of the same layer: Gemma 3's four sandwich norms and
the per-head q/k norms, each `[H]` or `[d]`, whole on every rank."""


def _norm(pattern: str, hf_suffix: str) -> MappingRule:
    return MappingRule(
        LAYER_PREFIX + pattern, lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, hf_suffix))
    )


LAYER = (
    *(_norm(pattern, suffix) for pattern, suffix in NORMS.items()),
    fused_qkv_rule(LAYER_PREFIX, hf_layer),
    OUTPUT_PROJECTION,
    *GATED_MLP,
)


def gemma3_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of a Gemma 3 text decoder in the bridge's TE layout (tied: the output layer of the
    last pipeline stage is a copy of the embedding)."""
    return [*EMBEDDING_AND_FINAL_NORM, *LAYER, output_layer(tied)]
