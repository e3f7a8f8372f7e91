"""The config oracle's table for GPT-OSS (gpt_oss), as megatron-bridge 0.6.2 builds it (gpt_oss/gpt_oss_bridge.py:
56-104) against transformers 5.12.1's modeling_gpt_oss.py (cited as HF)."""

from __future__ import annotations

from typing import Any

from convcheck.models.config_rules import (
    HEADS_AND_VOCAB,
    FieldRule,
    HfView,
    MegatronGet,
    first,
    function_name,
    implied,
    same,
    unsupported,
)
from convcheck.models.mistral import observed_window, window_size

HF_LIMIT, HF_ALPHA = 7.0, 1.702
"""GptOssExperts' clamp and quick-GELU slope, fixed in the module (HF:84-85) whatever the config says."""


def hf_window_layers(c: HfView, _m: MegatronGet) -> list[int]:
    """1 where HF's layer attends through the sliding window (layer_types[i] == sliding_attention, HF:308)."""
    kinds = c["layer_types"]
    unknown = sorted({k for k in kinds if k not in ("sliding_attention", "full_attention")})
    return unsupported(f"layer types {unknown}") if unknown else [int(k == "sliding_attention") for k in kinds]


def megatron_window_layers(freq: Any, m: MegatronGet) -> Any:
    """megatron-core's per-layer window flag (transformer/utils.py:495-506, layer numbers from 1): an int N windows
    every layer but each N-th, a list is the flag itself, None windows every layer; no window_size: none."""
    layers = m("num_layers")
    if not m("window_size"):
        return [0] * layers
    if freq is None:
        return [1] * layers
    if isinstance(freq, int) and not isinstance(freq, bool):
        return [int((i + 1) % freq != 0) for i in range(layers)]
    return [int(bool(v)) for v in freq]


def hf_window_size(c: HfView, m: MegatronGet) -> Any:
    """Mistral's rule (W keys: Megatron's (W - 1, 0)) where some layer is a sliding one; no sliding layer: None."""
    return window_size(c, m) if "sliding_attention" in (c.get("layer_types") or []) else None


def _rope(c: HfView, field: str, absent: Any = None) -> Any:
    """A RoPE field as transformers 5 spells it (rope_parameters.X) or, where absent, as transformers 4 does
    (rope_scaling.X, the yarn settings of bridge 0.3.x's transformers 4.57)."""
    return first(c, (f"rope_parameters.{field}", f"rope_scaling.{field}"), absent)


def _yarn(field: str, megatron: str) -> FieldRule:
    return FieldRule(
        megatron=megatron,
        hf=(f"rope_parameters.{field}",),
        expect=lambda c, _m: _rope(c, field),
        note="Yarn RoPE",
        also=(f"rope_scaling.{field}",),
    )


GPT_OSS_TABLE: tuple[FieldRule, ...] = (
    same("num_hidden_layers", "num_layers"),
    same("hidden_size", "hidden_size"),
    *HEADS_AND_VOCAB,
    same("max_position_embeddings", "seq_length"),
    same("rms_norm_eps", "layernorm_epsilon"),
    implied("normalization", "RMSNorm", "RMSNorm everywhere (input, post-attention, final)"),
    implied("layernorm_zero_centered_gamma", False, "HF RMSNorm multiplies by weight, not 1 + weight"),
    implied("qk_layernorm", False, "GPT-OSS has no q/k norm"),
    same("rope_parameters.rope_theta", "rotary_base", also=("rope_theta",)),
    FieldRule(
        megatron="position_embedding_type",
        hf=("rope_parameters.rope_type",),
        expect=lambda c, _m: "yarn" if _rope(c, "rope_type") == "yarn" else unsupported("non-yarn RoPE"),
        also=("rope_scaling.rope_type",),
    ),
    _yarn("factor", "yarn_rotary_scaling_factor"),
    _yarn("original_max_position_embeddings", "yarn_original_max_position_embeddings"),
    _yarn("beta_fast", "yarn_beta_fast"),
    _yarn("beta_slow", "yarn_beta_slow"),
    FieldRule(
        megatron="yarn_correction_range_round_to_int",
        hf=("rope_parameters.truncate",),
        expect=lambda c, _m: bool(_rope(c, "truncate", True)),
        also=("rope_scaling.truncate",),
        note="HF truncate floors / ceils the correction range, as Megatron's round_to_int",
    ),
    _yarn("mscale", "yarn_mscale"),
    _yarn("mscale_all_dim", "yarn_mscale_all_dim"),
    implied("rotary_interleaved", False, "HF rotates halves (_apply_rotary_emb chunks the last dim in two)"),
    implied("rotary_percent", 1.0, "RoPE on every channel of a head"),
    FieldRule(
        megatron="softmax_type",
        expect=lambda _c, _m: "learnable",
        note="each head's learned sink joins its softmax (HF self_attn.sinks, eager_attention_forward)",
    ),
    FieldRule(megatron="window_size", hf=("sliding_window",), expect=hf_window_size, observe=observed_window),
    FieldRule(
        megatron="window_attn_skip_freq",
        hf=("layer_types",),
        expect=hf_window_layers,
        observe=megatron_window_layers,
        note="per-layer sliding-window pattern",
    ),
    FieldRule(
        megatron="add_bias_linear",
        hf=("attention_bias",),
        expect=lambda c, _m: True if c["attention_bias"] else unsupported("attention_bias false with biased experts"),
        note="q/k/v/o biases; the router and experts always carry biases (HF:81-83, :129)",
    ),
    FieldRule(
        megatron="activation_func",
        hf=("hidden_act",),
        expect=lambda _c, _m: "quick_gelu",
        observe=function_name,
        note=f"GptOssExperts computes x * sigmoid({HF_ALPHA} x) whatever hidden_act says (HF:91)",
    ),
    implied("gated_linear_unit", True, "experts are down(act(gate) * (up + 1))"),
    implied("glu_linear_offset", 1.0, "HF multiplies by (up + 1) (HF:92)"),
    FieldRule(
        megatron="activation_func_clamp_value",
        hf=("swiglu_limit",),
        expect=lambda c, _m: HF_LIMIT,
        note=f"HF clamps gate above and up on both sides at {HF_LIMIT} (HF:85-90), a constant; the published "
        "config's swiglu_limit is not read by transformers",
    ),
    same("tie_word_embeddings", "share_embeddings_and_output_weights"),
    same("attention_dropout", "attention_dropout", absent=0.0),
    implied("hidden_dropout", 0.0, "HF decoder layers have no hidden dropout"),
    same("num_local_experts", "num_moe_experts", also=("num_experts",)),
    same("num_experts_per_tok", "moe_router_topk"),
    same("intermediate_size", "moe_ffn_hidden_size", note="GPT-OSS's experts are intermediate_size wide"),
    implied("moe_router_pre_softmax", False, "HF softmaxes the top-k logits (GptOssTopKRouter, HF:133-134)"),
    implied("moe_router_score_function", "softmax", "HF router: softmax over the chosen experts' logits"),
    implied("moe_router_topk_scaling_factor", None, "HF applies no routed scaling factor"),
    implied("moe_router_enable_expert_bias", False, "the router's bias is a linear bias (add_bias_linear)"),
    implied("moe_shared_expert_intermediate_size", None, "GPT-OSS has no shared expert"),
    FieldRule(
        megatron="moe_layer_freq",
        expect=lambda c, _m: [1] * c["num_hidden_layers"],
        observe=lambda v, m: [int(i % v == 0) for i in range(m("num_layers"))] if isinstance(v, int) else list(v),
        note="every layer is MoE",
    ),
    same("router_aux_loss_coef", "moe_aux_loss_coeff", note="training only"),
)
