"""Llama-style decoders (Llama, Qwen2, Qwen3): explicit mappings, config tables and tiny fixtures.

The decoder's rules include MoE layers (router, experts, legacy GroupedMLP): Qwen3-MoE (`qwen3_moe.py`) is this
decoder with experts, and every architecture here maps the same Megatron names (local spec, TE spec and legacy
GroupedMLP names).
"""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.bridge03_bugs import QWEN3_HEAD_DIM_IGNORED, QWEN3_HEAD_DIM_IGNORED_IMPORT
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
from convcheck.models.fixture_spec import ENGINE_DIMS, tiny_spec

# ---- config tables -------------------------------------------------------------------------------------------------


OLD_ROPE_TYPE = ("rope_scaling.rope_type", "rope_scaling.type", "rope_scaling")
"""transformers 5 nests rope settings in rope_parameters; 4.57 (bridge 0.3.x) spells them rope_theta / rope_scaling."""


LINEAR_FACTOR = ("rope_parameters.factor", "rope_scaling.factor")
"""Linear RoPE scaling's factor: Megatron divides positions by `seq_len_interpolation_factor`."""


LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""Llama-3 frequency scaling as megatron-core computes it: only the factor is a parameter, these are fixed
(rotary_pos_embedding.py:84 passes the factor alone to _apply_scaling, whose defaults are at :96-98)."""
LLAMA3_FIELDS = tuple(f"{group}.{key}" for key in LLAMA3_FIXED for group in ("rope_parameters", "rope_scaling"))


def _rope_kind(c: HfView) -> str:
    return first(c, ("rope_parameters.rope_type", *OLD_ROPE_TYPE[:2]), "default")


def _rope_type(c: HfView, _m: MegatronGet) -> str:
    """`rope`, `yarn`, for linear scaling `rope / F` (positions divided by the factor F), for Llama-3 frequency
    scaling `rope x llama3 F`."""
    kind = _rope_kind(c)
    if kind == "linear":
        return f"rope / {float(first(c, LINEAR_FACTOR))}"
    if kind == "llama3":
        return f"rope x llama3 {float(first(c, LINEAR_FACTOR))}"
    return {"default": "rope", "yarn": "yarn"}.get(kind, unsupported(f"rope_type {kind!r}"))


def _rope_observed(value: Any, m: MegatronGet) -> str:
    """position_embedding_type, with `/ seq_len_interpolation_factor` where Megatron interpolates positions and
    `x llama3 rope_scaling_factor` where it applies Llama-3 frequency scaling."""
    factor = m("seq_len_interpolation_factor")
    out = str(value) if factor is None else f"{value} / {float(factor)}"
    try:
        llama3 = m("rope_scaling")
    except (AttributeError, KeyError):  # a Megatron config without the field applies no Llama-3 scaling
        llama3 = False
    return f"{out} x llama3 {float(m('rope_scaling_factor'))}" if llama3 else out


def _llama3_scaling(c: HfView, _m: MegatronGet) -> Any:
    """Megatron's rope_scaling is on exactly where HF's rope_type is llama3, with megatron-core's fixed settings."""
    if _rope_kind(c) != "llama3":
        return False
    given = {key: first(c, (f"rope_parameters.{key}", f"rope_scaling.{key}")) for key in LLAMA3_FIXED}
    if given != LLAMA3_FIXED:
        return unsupported(f"llama3 rope scaling with {given} (megatron-core fixes {LLAMA3_FIXED})")
    return True


def _window(c: HfView, _m: MegatronGet) -> Any:
    types = c.get("layer_types") or []
    if c.get("use_sliding_window") or any(t != "full_attention" for t in types):
        return unsupported("sliding-window attention layers")
    return None


SHAPES = (
    same("num_hidden_layers", "num_layers"),
    same("hidden_size", "hidden_size"),
    same("intermediate_size", "ffn_hidden_size"),
    *HEADS_AND_VOCAB,
    same("max_position_embeddings", "seq_length"),
)
NORM_ROPE_ACT = (
    same("rms_norm_eps", "layernorm_epsilon"),
    implied("normalization", "RMSNorm", "RMSNorm everywhere (input, post-attention, final, q/k norms)"),
    implied("layernorm_zero_centered_gamma", False, "HF RMSNorm multiplies by weight, not 1 + weight"),
    same("rope_parameters.rope_theta", "rotary_base", also=("rope_theta",)),
    FieldRule(
        megatron="position_embedding_type",
        hf=("rope_parameters.rope_type",),
        expect=_rope_type,
        observe=_rope_observed,
        also=(*OLD_ROPE_TYPE, *LINEAR_FACTOR, *LLAMA3_FIELDS),
        note="linear scaling: seq_len_interpolation_factor; llama3: rope_scaling_factor",
    ),
    FieldRule(
        megatron="rotary_percent",
        hf=("partial_rotary_factor", "rope_parameters.partial_rotary_factor"),
        expect=lambda c, _m: c.get("rope_parameters.partial_rotary_factor", c.get("partial_rotary_factor", 1.0)),
    ),
    implied("rotary_interleaved", False, "HF rotate_half pairs dimension i with i + d/2"),
    FieldRule(
        megatron="rope_scaling",
        expect=_llama3_scaling,
        missing=False,  # megatron-core 0.16.0's TransformerConfig has no such field (GPTModelProvider: Mistral)
        note="Llama-3 frequency scaling only where rope_type is llama3, with low / high frequency factors 1 / 4 and "
        "original length 8192, which megatron-core fixes",
    ),
    implied("softmax_scale", None, "attention scale 1/sqrt(head_dim) as in HF"),
    FieldRule(
        megatron="activation_func", hf=("hidden_act",), expect=lambda c, _m: c["hidden_act"], observe=function_name
    ),
    implied("gated_linear_unit", True, "MLP is down(act(gate(x)) * up(x))"),
    same("tie_word_embeddings", "share_embeddings_and_output_weights"),
    FieldRule(megatron="window_size", hf=("layer_types", "use_sliding_window", "sliding_window"), expect=_window),
    same("attention_dropout", "attention_dropout", absent=0.0),
    implied("hidden_dropout", 0.0, "HF decoder layers have no hidden dropout"),
)
"""Shapes, norms, rotary embedding and activation shared by every Llama-style decoder (Qwen3-MoE included)."""
NO_EXPERTS = (implied("num_moe_experts", None, "dense architecture: no MoE layers"),)

QWEN2_TABLE = (
    *SHAPES,
    *NORM_ROPE_ACT,
    *NO_EXPERTS,
    implied("add_qkv_bias", True, "Qwen2 q/k/v projections always carry a bias"),
    implied("add_bias_linear", False, "Qwen2 o_proj and MLP have no bias"),
    implied("qk_layernorm", False, "Qwen2 has no q/k norm"),
)
QWEN3_TABLE = (
    *SHAPES,
    *NORM_ROPE_ACT,
    *NO_EXPERTS,
    same("attention_bias", "add_qkv_bias"),
    implied("add_bias_linear", False, "Qwen3 o_proj and MLP have no bias"),
    implied("qk_layernorm", True, "Qwen3 attention always applies q_norm / k_norm"),
)
LLAMA_TABLE = (
    *SHAPES,
    *NORM_ROPE_ACT,
    *NO_EXPERTS,
    same("attention_bias", "add_qkv_bias"),
    FieldRule(
        megatron="add_bias_linear",
        hf=("mlp_bias", "attention_bias"),
        expect=lambda c, _m: (
            c["mlp_bias"] if c["mlp_bias"] == c["attention_bias"] else unsupported("o_proj bias != mlp bias")
        ),
    ),
    implied("qk_layernorm", False, "Llama has no q/k norm"),
)

# ---- the architectures ---------------------------------------------------------------------------------------------

QWEN2 = Architecture(
    hf_classes=("Qwen2ForCausalLM",),
    model_type="qwen2",
    mapping_rules="convcheck.models.dense_mappings:decoder_rules",
    config_rules=QWEN2_TABLE,
    fixtures=(
        tiny_spec("qwen2", "Qwen2Config", "Qwen2, GQA 4q/2kv heads, qkv bias", use_sliding_window=False),
        tiny_spec(
            "qwen2-tied",
            "Qwen2Config",
            "Qwen2, GQA, qkv bias, tied embeddings (no lm_head.weight on disk)",
            use_sliding_window=False,
            tie_word_embeddings=True,
        ),
        tiny_spec(
            "qwen2-tied-4l",
            "Qwen2Config",
            "tiny:qwen2-tied with 4 layers: virtual pipeline (PP2 x VPP2) and uneven stages (1 + 3)",
            use_sliding_window=False,
            tie_word_embeddings=True,
            num_hidden_layers=4,
        ),
        tiny_spec(
            "qwen2-vllm",
            "Qwen2Config",
            "tiny:qwen2 with hidden 64 and 2 heads / 2 KV (head_dim 32), which CPU vLLM's attention accepts",
            use_sliding_window=False,
            hidden_size=64,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=32,
        ),
    ),
)
QWEN3 = Architecture(
    hf_classes=("Qwen3ForCausalLM",),
    model_type="qwen3",
    mapping_rules="convcheck.models.dense_mappings:decoder_rules",
    config_rules=QWEN3_TABLE,
    fixtures=(
        tiny_spec("qwen3", "Qwen3Config", "Qwen3, GQA 4q/2kv heads, qk-norm"),
        tiny_spec(
            "qwen3-vllm",
            "Qwen3Config",
            "tiny:qwen3 with head_dim 32, which CPU vLLM's attention accepts",
            **ENGINE_DIMS,
        ),
    ),
    upstream_bugs=(QWEN3_HEAD_DIM_IGNORED, QWEN3_HEAD_DIM_IGNORED_IMPORT),
)
LLAMA = Architecture(
    hf_classes=("LlamaForCausalLM",),
    model_type="llama",
    mapping_rules="convcheck.models.dense_mappings:decoder_rules",
    config_rules=LLAMA_TABLE,
    fixtures=(
        tiny_spec("llama", "LlamaConfig", "Llama, GQA 4q/2kv heads, no biases"),
        tiny_spec(
            "llama-vllm",
            "LlamaConfig",
            "tiny:llama with head_dim 32, which CPU vLLM's attention accepts",
            **ENGINE_DIMS,
        ),
        tiny_spec(
            "llama-tied-vllm",
            "LlamaConfig",
            "tiny:llama-vllm with tied embeddings (no lm_head.weight on disk)",
            tie_word_embeddings=True,
            **ENGINE_DIMS,
        ),
        tiny_spec(
            "llama-tied-4l",
            "LlamaConfig",
            "Llama-3.2-style tied embeddings, 4 layers: virtual pipeline (PP2 x VPP2) and uneven stages (1 + 3)",
            tie_word_embeddings=True,
            num_hidden_layers=4,
        ),
    ),
)
