"""GLM-4.5 / 4.6 (Glm4MoeForCausalLM) explicit mappings: every Megatron parameter of the GQA decoder layers (fused QKV
with its bias, optional q / k norms), the dense-first MLP, the MoE block (router with its fp32 expert bias, shared
experts, routed experts per expert or fused) and the MTP layers.

MTP layer k is HF's `model.layers.{L + k}` (L = num_hidden_layers), as for DeepSeek-V3: its transformer layer carries
the decoder layer's names, and the vocabulary and MTP rules of convcheck.models.deepseek_mappings give the rest (enorm,
hnorm, eh_proj, shared_head.norm, and the embed_tokens / shared_head.head copies of model.embed_tokens and lm_head).
megatron-core names that transformer layer `mtp.layers.k.mtp_model_layer` (0.17 on) or `mtp.layers.k.transformer_layer`
(0.16, megatron/core/transformer/multi_token_prediction.py:666); the bridge maps both (glm45_bridge.py:201).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Gated, Replicated, Split
from convcheck.mappings.base import TensorMapping
from convcheck.mappings.registry import MappingRule
from convcheck.models.deepseek_mappings import MTP, vocabulary
from convcheck.models.shared_mappings import expert_weight, fused_expert_rules, fused_qkv_rule, routed_expert_rules

TRANSFORMER_LAYER = (
    r"(decoder\.layers\.(?P<layer>\d+)|mtp\.layers\.(?P<mtp>\d+)\.(mtp_model_layer|transformer_layer))\."
)
"""A decoder layer (`layer`: its global number) or MTP layer k's transformer layer (`mtp`: k), either spelling."""
FUSED_SUFFIX = ".mlp.experts.gate_up_proj"


def hf_layer(match: re.Match[str], geometry: Geometry, suffix: str) -> str:
    """HF name of `suffix` in the matched layer: model.layers.N.<suffix>, N = L + k for MTP layer k."""
    layer = match["layer"]
    index = int(layer) if layer is not None else geometry.num_layers + int(match["mtp"])
    return f"model.layers.{index}.{suffix}"


@lru_cache(maxsize=8)
def _checkpoint_fused(names: frozenset[str]) -> bool:
    """Whether the checkpoint stores routed experts fused (the bridge decides once for the whole checkpoint, by glob:
    glm45_bridge.py:311-316)."""
    return any(name.endswith(FUSED_SUFFIX) for name in names)


def _fused(_match: re.Match[str], names: frozenset[str]) -> bool:
    return _checkpoint_fused(names)


def _per_expert(_match: re.Match[str], names: frozenset[str]) -> bool:
    return not _checkpoint_fused(names)


def _rule(pattern: str, build: Callable[[re.Match[str], Geometry], TensorMapping]) -> MappingRule:
    return MappingRule(TRANSFORMER_LAYER + pattern, build)


def _replicated(pattern: str, suffix: str) -> MappingRule:
    """A norm or router tensor every rank holds whole (the expert bias keeps its float32)."""
    return _rule(pattern, lambda m, g: Replicated(megatron=m[0], hf=hf_layer(m, g, suffix)))


def _rows(pattern: str, suffix: str) -> MappingRule:
    """Row parallel `[hidden, F / tp]`: o_proj and the down projections of the dense MLP and the shared experts."""
    return _rule(pattern, lambda m, g: Split(megatron=m[0], hf=hf_layer(m, g, suffix), dim=1))


def _gated(pattern: str, mlp: str) -> MappingRule:
    """fc1 `[2F / tp, hidden]` = `[gate_r; up_r]` of the dense MLP or the shared experts (`mlp`: their HF prefix)."""
    return _rule(
        pattern,
        lambda m, g: Gated(
            megatron=m[0], gate=hf_layer(m, g, f"{mlp}.gate_proj.weight"), up=hf_layer(m, g, f"{mlp}.up_proj.weight")
        ),
    )


def _qkv(match: re.Match[str], geometry: Geometry) -> TensorMapping:
    """linear_qkv weight `[G * (n + 2) * d / tp, hidden]` or bias `[G * (n + 2) * d / tp]`, per group [q; k; v]."""
    rule = fused_qkv_rule(TRANSFORMER_LAYER, lambda m, suffix: hf_layer(m, geometry, suffix), bias=True)
    return rule.build(match, geometry)


def _fused_expert(fc: int) -> MappingRule:
    """One expert's linear_fc`fc` <-> its slice of the layer's fused gate_up_proj `[E, 2F, H]` or down_proj
    `[E, H, F]`."""

    def build(match: re.Match[str], geometry: Geometry) -> TensorMapping:
        rules = fused_expert_rules(
            TRANSFORMER_LAYER, lambda m, projection: hf_layer(m, geometry, f"mlp.experts.{projection}")
        )
        return rules[fc - 1].build(match, geometry)

    return MappingRule(TRANSFORMER_LAYER + expert_weight(fc), build, _fused)


NORMS = (
    # local spec: input_layernorm; TE spec: fused into linear_qkv
    _replicated(r"(input_layernorm\.weight|self_attention\.linear_qkv\.layer_norm_weight)", "input_layernorm.weight"),
    # local spec: pre_mlp_layernorm in dense and MoE layers; TE spec: a dense layer's fused linear_fc1 norm
    _replicated(r"(pre_mlp_layernorm\.weight|mlp\.linear_fc1\.layer_norm_weight)", "post_attention_layernorm.weight"),
    _replicated(r"self_attention\.q_layernorm\.weight", "self_attn.q_norm.weight"),  # [head_dim], use_qk_norm
    _replicated(r"self_attention\.k_layernorm\.weight", "self_attn.k_norm.weight"),
)
ATTENTION = (
    _rule(r"self_attention\.linear_qkv\.(?P<kind>weight|bias)", _qkv),
    _rows(r"self_attention\.linear_proj\.weight", "self_attn.o_proj.weight"),  # [hidden, heads / tp * head_dim]
)
MLP = (  # the dense-first layers' MLP and the shared experts (tensor parallel like a dense MLP)
    _gated(r"mlp\.linear_fc1\.weight", "mlp"),
    _rows(r"mlp\.linear_fc2\.weight", "mlp.down_proj.weight"),
    _gated(r"mlp\.shared_experts\.linear_fc1\.weight", "mlp.shared_experts"),
    _rows(r"mlp\.shared_experts\.linear_fc2\.weight", "mlp.shared_experts.down_proj.weight"),
)
ROUTER = (
    _replicated(r"mlp\.router\.weight", "mlp.gate.weight"),
    _replicated(r"mlp\.router\.expert_bias", "mlp.gate.e_score_correction_bias"),  # float32 on both sides
)
ROUTED = (
    *routed_expert_rules(
        TRANSFORMER_LAYER,
        lambda match, geometry, projection: hf_layer(match, geometry, f"mlp.experts.{{expert}}.{projection}.weight"),
        _per_expert,
    ),
    _fused_expert(1),
    _fused_expert(2),
)


def glm45_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of a GLM-4.5-style model (tied: the output layer copies the embedding)."""
    return [*vocabulary(tied), *NORMS, *ATTENTION, *MLP, *ROUTER, *ROUTED, *MTP]
