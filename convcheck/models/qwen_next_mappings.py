"""Qwen3-Next / Qwen3.5 (dense and MoE) explicit mappings: every Megatron parameter of the gated-DeltaNet and
gated-attention decoder layers, the dense MLP or MoE (router, routed experts, shared expert and its [1, H] gate),
and the MTP layer.

The MTP layer is stored under HF's `mtp.*`: megatron-core's `mtp.layers.0.{enorm, hnorm, eh_proj,
final_layernorm}` are `mtp.{pre_fc_norm_embedding, pre_fc_norm_hidden, fc, norm}` (enorm normalises the token
embedding, hnorm the previous hidden state, and eh_proj reads `[enorm(embedding); hnorm(hidden)]`:
megatron/core/transformer/multi_token_prediction.py:1132-1138; the bridge pairs them the same way,
qwen3_next_bridge.py:106-109 and qwen35_bridge.py:324-327), and its transformer layer
`mtp.layers.k.mtp_model_layer.*` carries HF's decoder-layer names under `mtp.layers.k.*`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Gated, Replicated, Split
from convcheck.mappings.gdn import GDNInProj, GDNWidths, ZeroCentered, gdn_conv1d
from convcheck.mappings.registry import MappingRule
from convcheck.models.dense_mappings import EMBEDDING_AND_FINAL_NORM, output_layer
from convcheck.models.shared_mappings import (
    fused_expert_rules,
    fused_qkv_rule,
    routed_expert_rules,
    stored_per_expert,
)

TRANSFORMER_LAYER = r"(decoder\.layers\.(?P<layer>\d+)|mtp\.layers\.(?P<mtp>\d+)\.mtp_model_layer)\."
"""A decoder layer (`layer`: its global number) or MTP layer k's transformer layer (`mtp`: k)."""
MTP_LAYER = r"mtp\.layers\.0\."
"""HF holds one set of MTP projection and norms (`mtp.fc`, ...), so only MTP layer 0 has them."""


def hf_layer(match: re.Match[str], suffix: str) -> str:
    """HF name of `suffix` in the matched layer: model.layers.N.<suffix>, or mtp.layers.k.<suffix>."""
    layer = match.groupdict().get("layer")
    return f"model.layers.{layer}.{suffix}" if layer is not None else f"mtp.layers.{match['mtp']}.{suffix}"


def widths(geometry: Geometry) -> GDNWidths:
    return GDNWidths(
        key_heads=geometry.linear_key_heads,
        value_heads=geometry.linear_value_heads,
        key_dim=geometry.linear_key_dim,
        value_dim=geometry.linear_value_dim,
    )


def _replicated(pattern: str, suffix: str) -> MappingRule:
    """A norm, router or shared-expert gate every rank holds whole."""
    return MappingRule(TRANSFORMER_LAYER + pattern, lambda m, _g: Replicated(megatron=m[0], hf=hf_layer(m, suffix)))


def _rows(pattern: str, suffix: str, dim: int) -> MappingRule:
    """Split over TP along `dim` (0: column parallel or heads, 1: row parallel)."""
    return MappingRule(TRANSFORMER_LAYER + pattern, lambda m, _g: Split(megatron=m[0], hf=hf_layer(m, suffix), dim=dim))


def _gated(pattern: str, mlp: str) -> MappingRule:
    """fc1 `[2F/tp, hidden]` = `[gate_r; up_r]` of the dense MLP or the shared expert (`mlp`: its HF prefix)."""
    return MappingRule(
        TRANSFORMER_LAYER + pattern,
        lambda m, _g: Gated(
            megatron=m[0], gate=hf_layer(m, f"{mlp}.gate_proj.weight"), up=hf_layer(m, f"{mlp}.up_proj.weight")
        ),
    )


NORMS = (
    # TE names (shim 20): the input norm fused into linear_qkv (attention) or in_proj (GDN); local: input_layernorm
    _replicated(
        r"(input_layernorm\.weight|self_attention\.(linear_qkv|in_proj)\.layer_norm_weight)",
        "input_layernorm.weight",
    ),
    _replicated(r"(pre_mlp_layernorm\.weight|mlp\.linear_fc1\.layer_norm_weight)", "post_attention_layernorm.weight"),
)
GATED_ATTENTION = (
    fused_qkv_rule(TRANSFORMER_LAYER, hf_layer),  # with the output gate: per group [q heads; gate heads; k; v]
    _replicated(r"self_attention\.q_layernorm\.weight", "self_attn.q_norm.weight"),
    _replicated(r"self_attention\.k_layernorm\.weight", "self_attn.k_norm.weight"),
    _rows(r"self_attention\.linear_proj\.weight", "self_attn.o_proj.weight", dim=1),
)


def _in_proj(fused: bool) -> MappingRule:
    """in_proj `[(2Hk*dk + 2Hv*dv + 2Hv) / tp, hidden]` from in_proj_qkvz + in_proj_ba, or from qkv, z, b, a."""
    parts = ("qkvz", "ba") if fused else ("qkv", "z", "b", "a")
    return MappingRule(
        TRANSFORMER_LAYER + r"self_attention\.in_proj\.weight",
        lambda m, g: GDNInProj(
            megatron=m[0], hf=tuple(hf_layer(m, f"linear_attn.in_proj_{p}.weight") for p in parts), widths=widths(g)
        ),
    )


GATED_DELTA_NET = (
    MappingRule(  # [(2Hk*dk + Hv*dv) / tp, 1, kernel]: [q_r; k_r; v_r]
        TRANSFORMER_LAYER + r"self_attention\.conv1d\.weight",
        lambda m, g: gdn_conv1d(megatron=m[0], hf=hf_layer(m, "linear_attn.conv1d.weight"), widths=widths(g)),
    ),
    _rows(r"self_attention\.A_log", "linear_attn.A_log", dim=0),  # [Hv / tp]
    _rows(r"self_attention\.dt_bias", "linear_attn.dt_bias", dim=0),
    MappingRule(  # [dv], replicated; Megatron's norm is zero-centered, HF's RMSNormGated a plain scale
        TRANSFORMER_LAYER + r"self_attention\.out_norm\.weight",
        lambda m, _g: ZeroCentered(megatron=m[0], hf=hf_layer(m, "linear_attn.norm.weight")),
    ),
    _rows(r"self_attention\.out_proj\.weight", "linear_attn.out_proj.weight", dim=1),  # [hidden, Hv*dv / tp]
)
MLP = (
    _gated(r"mlp\.linear_fc1\.weight", "mlp"),
    _rows(r"mlp\.linear_fc2\.weight", "mlp.down_proj.weight", dim=1),
)
MOE = (
    _replicated(r"mlp\.router\.weight", "mlp.gate.weight"),
    _gated(r"mlp\.shared_experts\.linear_fc1\.weight", "mlp.shared_expert"),
    _rows(r"mlp\.shared_experts\.linear_fc2\.weight", "mlp.shared_expert.down_proj.weight", dim=1),
    _replicated(r"mlp\.shared_experts\.gate_weight", "mlp.shared_expert_gate.weight"),  # [1, hidden]
    *routed_expert_rules(
        TRANSFORMER_LAYER,
        lambda m, _g, projection: hf_layer(m, f"mlp.experts.{{expert}}.{projection}.weight"),
        stored_per_expert(lambda m, projection: hf_layer(m, f"mlp.experts.{projection}")),
    ),
    # Qwen3.6: experts fused as transformers 5 holds them (qwen35_bridge.py:104-140, 363-377)
    *fused_expert_rules(TRANSFORMER_LAYER, lambda m, projection: hf_layer(m, f"mlp.experts.{projection}")),
)


def _mtp(suffix: str, hf: str) -> MappingRule:
    return MappingRule(MTP_LAYER + suffix, lambda m, _g: Replicated(megatron=m[0], hf=hf))


MTP = (
    _mtp(r"enorm\.weight", "mtp.pre_fc_norm_embedding.weight"),
    _mtp(r"hnorm\.weight", "mtp.pre_fc_norm_hidden.weight"),
    _mtp(r"final_layernorm\.weight", "mtp.norm.weight"),
    # column parallel: [hidden / tp, 2 * hidden]
    MappingRule(MTP_LAYER + r"eh_proj\.weight", lambda m, _g: Split(megatron=m[0], hf="mtp.fc.weight")),
)


def gdn_rules(fused: bool) -> Callable[[bool], list[MappingRule]]:
    """The family's rule table (tied -> rules); fused: Qwen3-Next's in_proj_qkvz / in_proj_ba, else Qwen3.5's four."""

    def rules(tied: bool) -> list[MappingRule]:
        return [
            *EMBEDDING_AND_FINAL_NORM,
            output_layer(tied),
            *NORMS,
            *GATED_ATTENTION,
            _in_proj(fused),
            *GATED_DELTA_NET,
            *MLP,
            *MOE,
            *MTP,
        ]

    return rules


qwen3_next_rules = gdn_rules(fused=True)
qwen35_rules = gdn_rules(fused=False)
