"""Gemma 4 text, dense (Gemma4ForCausalLM, enable_moe_block false) explicit mappings: the bridge's own local layer
spec (megatron-bridge 0.6.2 gemma/modeling_gemma4.py:744-784, Gemma4DenseTransformerLayer) and the per-layer input
embedding modules it attaches to the GPTModel (:884-915).

Per decoder layer L (HF `model.layers.L.*`; n = heads, H = hidden, F = intermediate_size, P = per-layer input width;
sliding layers have d = head_dim and G = num_key_value_heads, full layers d = global_head_dim and
G = num_global_key_value_heads):
- `input_layernorm.weight` `[H]` <- input_layernorm; `post_self_attn_layernorm.weight` `[H]` <- post_attention_layernorm
  (on the attention output, before the residual add); `pre_mlp_layernorm.weight` `[H]` <- pre_feedforward_layernorm;
  `post_mlp_layernorm.weight` `[H]` <- post_feedforward_layernorm; all plain scales (HF Gemma4RMSNorm multiplies by w),
  whole on every rank;
- `self_attention.linear_qkv.weight` `[G * (n / G + 2) * d / tp, H]` <- q_proj, k_proj, v_proj (per group [q; k; v]);
  a full layer with attention_k_eq_v stores no v_proj (its v rows are k's); a KV-shared layer (the last
  num_kv_shared_layers) stores no k_proj / v_proj (its k and v rows are zeros: it reads an earlier layer's);
- `self_attention.q_layernorm.weight` `[d]` <- q_norm; `k_layernorm.weight` `[d]` <- k_norm where the layer stores one
  (a KV-shared layer has none: its Megatron k_layernorm is left unmapped, gemma4-shared-kv-k-norm-unmapped);
- `self_attention.linear_proj.weight` `[H, n * d / tp]` <- o_proj, columns split;
- `mlp.linear_fc1.weight` `[2F' / tp, H]` = `[gate_r; up_r]` <- gate_proj, up_proj; `mlp.linear_fc2.weight`
  `[H, F' / tp]` <- down_proj (F' = 2F in a double-wide KV-shared layer, else F);
- `per_layer_input_gate.weight` `[P, H]`, `per_layer_projection.weight` `[H, P]`, `post_per_layer_input_norm.weight`
  `[H]`, `layer_scalar` `[1]` <- the same names, whole on every rank.
Model level: `embedding.word_embeddings.weight` `[V / tp, H]` (rows split); `decoder.final_layernorm.weight` `[H]`;
`per_layer_embedding.weight` `[V' / tp, L * P]` <- embed_tokens_per_layer (a vocabulary-parallel embedding of
vocab_size_per_layer_input rows, unpadded); `per_layer_model_proj.weight` `[L * P / tp, H]` <-
per_layer_model_projection (column-parallel); `per_layer_proj_norm.weight` `[P]` <- per_layer_projection_norm. The
output layer is the tied embedding.

The MoE variant (enable_moe_block, 26B-A4B; megatron-bridge 0.6.2 gemma4_bridge.py:502 `_moe_mapping_registry`) is
megatron-core's TE MoE layer patched by the bridge (gemma/modeling_gemma4.py:1276-1476, :1517): per layer L, with E
experts of width F_e and a dense MLP of width F beside them,
- `self_attention.linear_qkv.layer_norm_weight` `[H]` <- input_layernorm (fused into linear_qkv);
  `self_attention.linear_proj.post_layernorm.weight` `[H]` <- post_attention_layernorm (TERowParallelLinearLayerNorm);
  `pre_shared_expert_layernorm.weight` `[H]` <- pre_feedforward_layernorm (the dense MLP's input norm);
  `pre_mlp_layernorm.weight` `[H]` <- pre_feedforward_layernorm_2 (the experts' input norm);
  `mlp.post_shared_expert_layernorm.weight` `[H]` <- post_feedforward_layernorm_1 (on the dense MLP's output);
  `mlp.post_moe_layernorm.weight` `[H]` <- post_feedforward_layernorm_2 (on the experts' output);
  `post_ffn_layernorm.weight` `[H]` <- post_feedforward_layernorm (on their sum); all whole on every rank;
- `mlp.router.weight` `[E, H]` <- router.proj; `mlp.router.scale` `[H]` <- router.scale (on the scaleless-normed
  router input); `mlp.router.per_expert_scale` `[E]` <- router.per_expert_scale (on the renormalised top-k weights);
  all whole on every rank (EP and TP alike);
- `mlp.shared_experts.linear_fc1.weight` `[2F / tp, H]` = `[gate_r; up_r]` <- mlp.gate_proj, mlp.up_proj;
  `mlp.shared_experts.linear_fc2.weight` `[H, F / tp]` <- mlp.down_proj (the dense MLP is the MoE layer's shared
  expert, ungated);
- expert e's `mlp.experts.linear_fc1.weight{e}` `[2F_e / etp, H]` <- `experts.gate_up_proj[e]` (`[E, 2F_e, H]`, slice e
  is [gate rows; up rows]) and `linear_fc2.weight{e}` `[H, F_e / etp]` <- `experts.down_proj[e]` (`[E, H, F_e]`), as
  transformers 5's save_pretrained writes them (convcheck.mappings.fused_experts.FusedSlice);
- the q / k norms, linear_qkv (PartialQKV: a full layer with attention_k_eq_v stores no v_proj), linear_proj and
  layer_scalar as in the dense variant.
"""

from __future__ import annotations

import re

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Gated, Replicated, Split
from convcheck.mappings.fused_experts import FusedSlice
from convcheck.mappings.qkv_partial import PartialQKV
from convcheck.mappings.registry import MappingRule
from convcheck.models.dense_mappings import (
    EMBEDDING_AND_FINAL_NORM,
    GATED_MLP,
    OUTPUT_PROJECTION,
    hf_layer,
    output_layer,
)
from convcheck.models.shared_mappings import LAYER_PREFIX, expert_id, expert_weight

REPLICATED: dict[str, str] = {
    r"input_layernorm\.weight": "input_layernorm.weight",
    r"post_self_attn_layernorm\.weight": "post_attention_layernorm.weight",
    r"post_mlp_layernorm\.weight": "post_feedforward_layernorm.weight",
    r"self_attention\.q_layernorm\.weight": "self_attn.q_norm.weight",
    r"per_layer_input_gate\.weight": "per_layer_input_gate.weight",
    r"per_layer_projection\.weight": "per_layer_projection.weight",
    r"post_per_layer_input_norm\.weight": "post_per_layer_input_norm.weight",
    r"layer_scalar": "layer_scalar",
}
"""Megatron parameter (pattern after the layer prefix) -> HF tensor of the same layer, whole on every rank: the four
sandwich norms each to its own HF norm, the q norm, the per-layer input block and the layer's output scale."""


def _replicated(pattern: str, hf_suffix: str) -> MappingRule:
    return MappingRule(
        LAYER_PREFIX + pattern, lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, hf_suffix))
    )


def layer_qkv(match: re.Match[str], geometry: Geometry) -> PartialQKV:
    """The matched layer's linear_qkv with its kind's heads and width and the projections it stores."""
    layer = int(match["layer"])
    full = geometry.is_full_attention(layer)
    shared = geometry.shares_kv(layer)
    return PartialQKV(
        megatron=match[0],
        q=hf_layer(match, "self_attn.q_proj.weight"),
        k=None if shared else hf_layer(match, "self_attn.k_proj.weight"),
        v=None if shared or (full and geometry.k_eq_v) else hf_layer(match, "self_attn.v_proj.weight"),
        num_heads=geometry.num_heads,
        num_query_groups=(geometry.global_query_groups or geometry.num_query_groups)
        if full
        else geometry.num_query_groups,
        head_dim=(geometry.global_head_dim or geometry.head_dim) if full else geometry.head_dim,
    )


LAYER = (
    *(_replicated(pattern, suffix) for pattern, suffix in REPLICATED.items()),
    MappingRule(
        LAYER_PREFIX + r"self_attention\.k_layernorm\.weight",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "self_attn.k_norm.weight")),
        when=lambda match, hf: hf_layer(match, "self_attn.k_norm.weight") in hf,
    ),
    MappingRule(LAYER_PREFIX + r"self_attention\.linear_qkv\.weight", layer_qkv),
    OUTPUT_PROJECTION,
    *GATED_MLP,
)

PER_LAYER_INPUT = (
    MappingRule(
        r"per_layer_embedding\.weight",
        lambda match, geometry: Split(megatron=match[0], hf="model.embed_tokens_per_layer.weight", dim=0),
    ),
    MappingRule(
        r"per_layer_model_proj\.weight",
        lambda match, geometry: Split(megatron=match[0], hf="model.per_layer_model_projection.weight", dim=0),
    ),
    MappingRule(
        r"per_layer_proj_norm\.weight",
        lambda match, geometry: Replicated(megatron=match[0], hf="model.per_layer_projection_norm.weight"),
    ),
)
"""The per-layer input embedding (PLE) modules on the GPTModel itself (the first pipeline stage's)."""


def pre_mlp_norm(match: re.Match[str], geometry: Geometry) -> Replicated:
    """pre_mlp_layernorm `[H]`: the dense MLP's input norm (pre_feedforward_layernorm) in a dense model, the routed
    experts' (pre_feedforward_layernorm_2) in an MoE one, where pre_shared_expert_layernorm is the dense MLP's."""
    suffix = "pre_feedforward_layernorm_2.weight" if geometry.num_experts else "pre_feedforward_layernorm.weight"
    return Replicated(megatron=match[0], hf=hf_layer(match, suffix))


MOE_REPLICATED: dict[str, str] = {
    r"self_attention\.linear_qkv\.layer_norm_weight": "input_layernorm.weight",
    r"self_attention\.linear_proj\.post_layernorm\.weight": "post_attention_layernorm.weight",
    r"pre_shared_expert_layernorm\.weight": "pre_feedforward_layernorm.weight",
    r"pffl_weight": "pre_feedforward_layernorm.weight",  # bridge 0.5.x: an inert buffer (gemma4_provider.py:207)
    r"mlp\.post_shared_expert_layernorm\.weight": "post_feedforward_layernorm_1.weight",
    r"mlp\.post_moe_layernorm\.weight": "post_feedforward_layernorm_2.weight",
    r"post_ffn_layernorm\.weight": "post_feedforward_layernorm.weight",
    r"mlp\.router\.weight": "router.proj.weight",
    r"mlp\.router\.scale": "router.scale",
    r"mlp\.router\.per_expert_scale": "router.per_expert_scale",
}
"""The MoE layer's TE-fused and extra norms and its router, each whole on every rank, to its HF tensor. Bridge 0.5.x
keeps the dense MLP's input norm as the layer's buffer `pffl_weight` (gemma4_provider.py:207; it folds the norm into
the shared expert's linear_fc1 on import, gemma4_bridge.py:324-357) and maps it whole to pre_feedforward_layernorm
(:463-466); 0.6.2 builds `pre_shared_expert_layernorm` instead."""


def expert_fc1(match: re.Match[str], geometry: Geometry) -> FusedSlice:
    """Expert e's linear_fc1 `[2F_e / etp, H]` ([gate; up] rows) <-> `experts.gate_up_proj[e]` of `[E, 2F_e, H]`."""
    name, e = hf_layer(match, "experts.gate_up_proj"), expert_id(match)
    inner = Gated(megatron=match[0], axis="etp", expert=int(e), num_experts=geometry.num_experts,
                  gate=f"{name}[{e}].gate", up=f"{name}[{e}].up")  # fmt: skip
    return FusedSlice(inner=inner, fused=name)


def expert_fc2(match: re.Match[str], geometry: Geometry) -> FusedSlice:
    """Expert e's linear_fc2 `[H, F_e / etp]` (row-parallel) <-> `experts.down_proj[e]` of `[E, H, F_e]`."""
    name, e = hf_layer(match, "experts.down_proj"), expert_id(match)
    inner = Split(megatron=match[0], axis="etp", dim=1, expert=int(e), num_experts=geometry.num_experts,
                  hf=f"{name}[{e}]")  # fmt: skip
    return FusedSlice(inner=inner, fused=name)


MOE_BLOCK = (
    *(_replicated(pattern, suffix) for pattern, suffix in MOE_REPLICATED.items()),
    MappingRule(
        LAYER_PREFIX + r"mlp\.shared_experts\.linear_fc1\.weight",
        lambda match, geometry: Gated(
            megatron=match[0], gate=hf_layer(match, "mlp.gate_proj.weight"), up=hf_layer(match, "mlp.up_proj.weight")
        ),
    ),
    MappingRule(
        LAYER_PREFIX + r"mlp\.shared_experts\.linear_fc2\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, "mlp.down_proj.weight"), dim=1),
    ),
    MappingRule(LAYER_PREFIX + expert_weight(1), expert_fc1),
    MappingRule(LAYER_PREFIX + expert_weight(2), expert_fc2),
)
"""The MoE variant's layer parameters the dense one does not have (its attention is the dense one's rules)."""


def gemma4_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of a Gemma 4 text decoder in the bridge's layout, dense or MoE (tied: the output layer
    of the last pipeline stage is a copy of the embedding)."""
    layer = [*LAYER, MappingRule(LAYER_PREFIX + r"pre_mlp_layernorm\.weight", pre_mlp_norm), *MOE_BLOCK]
    return [*EMBEDDING_AND_FINAL_NORM, *layer, *PER_LAYER_INPUT, output_layer(tied)]
