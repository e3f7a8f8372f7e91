"""MiniMax-M2 (MiniMaxM2ForCausalLM) explicit mappings: megatron-core's TE MoE layer spec with the bridge's full-width
q/k norms (megatron-bridge 0.6.2 minimax_m2/minimax_m2_provider.py:195-216, minimax_m2_bridge.py:186-251), against
the checkpoint names transformers 5.12.1's save_pretrained writes (and the published checkpoint holds):
`block_sparse_moe.gate`, `block_sparse_moe.e_score_correction_bias`, `block_sparse_moe.experts.E.w1 / w3 / w2`.

Per decoder layer L (HF `model.layers.L.*`; d = head_dim, n = heads, G = KV groups, F = intermediate_size, the
expert width, H = hidden, E = experts):
- `self_attention.linear_qkv.layer_norm_weight` `[H]` <- input_layernorm, whole;
- `self_attention.linear_qkv.weight` `[G * (n / G + 2) * d / tp, H]` <- q_proj, k_proj, v_proj (per group [q; k; v]);
- `self_attention.q_layernorm.weight` `[n * d / tp]` <- q_norm `[n * d]` and `k_layernorm.weight` `[G * d / tp]` <-
  k_norm `[G * d]`: one RMSNorm over every head (its sum of squares all-reduced over TP), so each TP rank holds the
  rows of its own heads (split along dim 0, like the heads of linear_qkv); G < tp is not covered here;
- `self_attention.linear_proj.weight` `[H, n * d / tp]` <- o_proj, columns split;
- `pre_mlp_layernorm.weight` `[H]` <- post_attention_layernorm, whole;
- `mlp.router.weight` `[E, H]` <- block_sparse_moe.gate.weight, and `mlp.router.expert_bias` `[E]` (float32) <-
  block_sparse_moe.e_score_correction_bias (float32), whole;
- expert e's `linear_fc1` `[2F / etp, H]` = `[w1_r; w3_r]` (gate; up) and `linear_fc2` `[H, F / etp]` <- w2.
"""

from __future__ import annotations

from convcheck.mappings import Replicated, Split
from convcheck.mappings.registry import MappingRule
from convcheck.models.dense_mappings import EMBEDDING_AND_FINAL_NORM, hf_layer, output_layer
from convcheck.models.shared_mappings import LAYER_PREFIX, fused_qkv_rule, routed_expert_rules

MOE = "block_sparse_moe"
EXPERT_WEIGHT = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
"""The projection of convcheck's expert rules -> MiniMax's legacy per-expert name."""


def _whole(pattern: str, hf_suffix: str) -> MappingRule:
    return MappingRule(
        LAYER_PREFIX + pattern, lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, hf_suffix))
    )


def _rows(pattern: str, hf_suffix: str) -> MappingRule:
    """A full-width q or k norm: rows of this TP rank's heads."""
    return MappingRule(
        LAYER_PREFIX + pattern, lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, hf_suffix), dim=0)
    )


LAYER = (
    _whole(r"self_attention\.linear_qkv\.layer_norm_weight", "input_layernorm.weight"),
    _whole(r"pre_mlp_layernorm\.weight", "post_attention_layernorm.weight"),
    fused_qkv_rule(LAYER_PREFIX, hf_layer),
    _rows(r"self_attention\.q_layernorm\.weight", "self_attn.q_norm.weight"),
    _rows(r"self_attention\.k_layernorm\.weight", "self_attn.k_norm.weight"),
    MappingRule(
        LAYER_PREFIX + r"self_attention\.linear_proj\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, "self_attn.o_proj.weight"), dim=1),
    ),
    _whole(r"mlp\.router\.weight", f"{MOE}.gate.weight"),
    _whole(r"mlp\.router\.expert_bias", f"{MOE}.e_score_correction_bias"),
    *routed_expert_rules(
        LAYER_PREFIX,
        lambda match, _geometry, projection: hf_layer(
            match, f"{MOE}.experts.{{expert}}.{EXPERT_WEIGHT[projection]}.weight"
        ),
    ),
)


def minimax_m2_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of a MiniMax-M2 decoder (every layer MoE; tied: the output layer copies the
    embedding)."""
    return [*EMBEDDING_AND_FINAL_NORM, *LAYER, output_layer(tied)]
