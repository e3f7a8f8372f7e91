"""The config oracle's tables for the gated-DeltaNet hybrids: Qwen3-Next (qwen3_next), Qwen3.5 (qwen3_5_text) and
Qwen3.5-MoE (qwen3_5_moe_text), as megatron-bridge 0.6.2 builds them (qwen/qwen3_next_bridge.py:53-100,
qwen/qwen35_bridge.py:39-101) against transformers 5.12.1's modeling files (cited as NEXT, QWEN35, QWEN35_MOE)."""

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
from convcheck.models.qwen3_moe import megatron_moe_layers
from convcheck.models.upstream_bug import UpstreamBug

NEXT, QWEN35, QWEN35_MOE = "modeling_qwen3_next.py", "modeling_qwen3_5.py", "modeling_qwen3_5_moe.py"
KINDS = {"linear_attention": 1, "full_attention": 0}
"""HF layer_types entry -> megatron-core's per-layer linear-attention flag (1: GatedDeltaNet, 0: attention)."""


def hf_linear_layers(c: HfView, _m: MegatronGet) -> Any:
    """1 where HF builds a GatedDeltaNet (layer_types[i] == linear_attention), 0 for gated attention."""
    types = c.get("layer_types")
    if not types:  # a config of transformers < 5.5: HF derived the schedule from the interval
        interval = c.get("full_attention_interval", 4)
        return [int(bool((i + 1) % interval)) for i in range(c["num_hidden_layers"])]
    unknown = sorted({t for t in types if t not in KINDS})
    return unsupported(f"layer types {unknown}") if unknown else [KINDS[t] for t in types]


def megatron_linear_layers(freq: Any, m: MegatronGet) -> Any:
    """megatron-core's per-layer pattern for linear_attention_freq: an int N makes every N-th layer attention, the
    others linear (experimental_attention_variant_module_specs.py:408-412); a list is the pattern itself."""
    if isinstance(freq, int) and not isinstance(freq, bool):
        return [0 if (i + 1) % freq == 0 else 1 for i in range(m("num_layers"))]
    return list(freq) if isinstance(freq, list | tuple) else freq


def _qwen_next_moe_layers(c: HfView, _m: MegatronGet) -> list[int]:
    """1 where Qwen3NextDecoderLayer builds the sparse block (NEXT:830-833), else its dense MLP (:835)."""
    step, dense = c.get("decoder_sparse_step") or 1, set(c.get("mlp_only_layers") or [])
    experts = c.get("num_experts") or 0
    return [int(i not in dense and experts > 0 and (i + 1) % step == 0) for i in range(c["num_hidden_layers"])]


def _no_attention_bias(where: str) -> FieldRule:
    """HF's attention_bias puts a bias on q / k / v and on o_proj (`where`); Megatron's add_qkv_bias covers q / k / v
    only and add_bias_linear would add MLP biases too, so only attention_bias false is representable."""
    return FieldRule(
        megatron="add_qkv_bias",
        hf=("attention_bias",),
        expect=lambda c, _m: (
            False if not c["attention_bias"] else unsupported(f"attention_bias true also biases o_proj ({where})")
        ),
        note="q / k / v without bias; HF's attention_bias would bias o_proj too",
    )


def _rope_kind(c: HfView, _m: MegatronGet) -> str:
    kind = c.get("rope_parameters.rope_type", "default")
    return "rope" if kind == "default" else unsupported(f"rope_type {kind!r}")


def _mtp(primary: str, other: str) -> FieldRule:
    """MTP layer count: HF never builds them (it drops `mtp.*` on load, `_keys_to_ignore_on_load_unexpected`); the
    bridge builds mtp_num_layers from the count published configs carry (model_bridge.py:477-478)."""
    return FieldRule(
        megatron="mtp_num_layers",
        hf=(primary,),
        also=(other,),
        expect=lambda c, _m: first(c, (primary, other)) or None,
        observe=lambda value, _m: value or None,
        note="the checkpoint's mtp.* layers (HF skips them on load)",
    )


DEDICATED_MTP_EMBEDDINGS = FieldRule(
    megatron="mtp_num_layers",
    hf=("mtp_use_dedicated_embeddings",),
    expect=lambda c, m: (
        m("mtp_num_layers")
        if not c.get("mtp_use_dedicated_embeddings")
        else unsupported("an MTP embedding of its own (Megatron's MTP layers share the decoder's embedding)")
    ),
    note="published Qwen3.5 configs say false: the MTP layer reads the decoder's embedding",
)


def _common(modeling: str) -> tuple[FieldRule, ...]:
    """Rules every GDN hybrid shares; `modeling` is the HF modeling file the notes cite."""
    return (
        same("num_hidden_layers", "num_layers"),
        same("hidden_size", "hidden_size"),
        *HEADS_AND_VOCAB,
        same("max_position_embeddings", "seq_length"),
        same("rms_norm_eps", "layernorm_epsilon", note="every norm, the GDN gated output norm included"),
        implied("normalization", "RMSNorm", "RMSNorm everywhere (input, post-attention, q/k, GDN output, final)"),
        implied(
            "layernorm_zero_centered_gamma",
            True,
            f"HF RMSNorms scale by 1 + weight ({modeling} Qwen3*RMSNorm); the GDN gated norm scales by weight and the "
            "bridge stores it minus 1 (RMSNorm2ZeroCenteredRMSNormMapping)",
        ),
        same("rope_parameters.rope_theta", "rotary_base", also=("rope_theta",)),
        FieldRule(
            megatron="position_embedding_type",
            hf=("rope_parameters.rope_type", "rope_parameters.mrope_section", "rope_parameters.mrope_interleaved"),
            also=("rope_scaling",),
            expect=_rope_kind,
            note="plain RoPE; Qwen3.5's multimodal RoPE sections rotate text positions as plain RoPE (the three "
            "position rows are equal for text, modeling_qwen3_5*.py:150-151)",
        ),
        FieldRule(
            megatron="rotary_percent",
            hf=("rope_parameters.partial_rotary_factor",),
            also=("partial_rotary_factor",),
            expect=lambda c, _m: first(c, ("rope_parameters.partial_rotary_factor", "partial_rotary_factor"), 1.0),
            note="the rotated share of head_dim (HF reads rope_parameters.partial_rotary_factor)",
        ),
        implied("rotary_interleaved", False, "HF rotate_half pairs dimension i with i + d/2"),
        implied("softmax_scale", None, f"attention scale head_dim ** -0.5 as in HF ({modeling})"),
        FieldRule(
            megatron="activation_func",
            hf=("hidden_act",),
            expect=lambda c, _m: (
                c["hidden_act"]
                if c["hidden_act"] in ("silu", "swish")
                else unsupported(
                    f"hidden_act {c['hidden_act']!r} as the GDN conv activation (megatron-core gdn.py applies silu)"
                )  # fmt: skip
            ),
            observe=function_name,
            note="HF applies hidden_act in the MLPs and after the GDN conv1d; Megatron's GDN conv always uses silu",
        ),
        implied("gated_linear_unit", True, "MLPs are down(act(gate(x)) * up(x))"),
        same("tie_word_embeddings", "share_embeddings_and_output_weights"),
        same("attention_dropout", "attention_dropout", absent=0.0),
        implied("hidden_dropout", 0.0, "HF decoder layers have no hidden dropout"),
        implied("add_bias_linear", False, "o_proj, GDN out_proj and MLPs have no bias"),
        implied("qk_layernorm", True, "gated attention always applies q_norm / k_norm"),
        implied("attention_output_gate", True, "HF q_proj holds each head's query and its sigmoid output gate"),
        implied("experimental_attention_variant", "gated_delta_net", "linear_attention layers are gated DeltaNets"),
        FieldRule(
            megatron="linear_attention_freq",
            hf=("layer_types",),
            also=("full_attention_interval",),
            expect=hf_linear_layers,
            observe=megatron_linear_layers,
            note="per-layer schedule (1: GatedDeltaNet, 0: gated attention); an interval reproduces only a periodic "
            "schedule",
        ),
        same("linear_conv_kernel_dim", "linear_conv_kernel_dim"),
        same("linear_num_key_heads", "linear_num_key_heads"),
        same("linear_num_value_heads", "linear_num_value_heads"),
        same("linear_key_head_dim", "linear_key_head_dim"),
        same("linear_value_head_dim", "linear_value_head_dim"),
    )


def _routed(router_where: str) -> tuple[FieldRule, ...]:
    """Routed experts and the gated shared expert; `router_where` cites HF's top-k router."""
    return (
        same("num_experts", "num_moe_experts"),
        same("num_experts_per_tok", "moe_router_topk"),
        same("moe_intermediate_size", "moe_ffn_hidden_size"),
        same("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"),
        implied("moe_shared_expert_gate", True, "HF scales the shared expert by sigmoid(shared_expert_gate(x))"),
        implied("moe_router_score_function", "softmax", f"HF router: softmax over every expert ({router_where})"),
        implied("moe_router_topk_scaling_factor", None, "HF applies no routed scaling factor"),
        implied("moe_router_enable_expert_bias", False, "HF router has no expert bias"),
        FieldRule(
            megatron="moe_router_dtype",
            expect=lambda _c, m: m("moe_router_dtype") if m("moe_router_dtype") in (None, "fp32") else "None or fp32",
            note=f"HF computes router logits in the model dtype and softmaxes in fp32 ({router_where}); Megatron's "
            "None / fp32 router differ from it only by rounding",
        ),
        same("router_aux_loss_coef", "moe_aux_loss_coeff", note="training only"),
    )


QWEN3_NEXT_TABLE = (
    *_common(NEXT),
    same("intermediate_size", "ffn_hidden_size", note=f"the dense MLP of mlp_only_layers ({NEXT}:835)"),
    _no_attention_bias(f"{NEXT}:276-278"),
    *_routed(f"{NEXT}:787"),
    FieldRule(
        megatron="moe_router_pre_softmax",
        hf=("norm_topk_prob",),
        expect=lambda c, _m: not c["norm_topk_prob"],
        note=f"HF softmaxes every expert then renormalises the top-k iff norm_topk_prob ({NEXT}:787-790); Megatron "
        "softmaxes the top-k logits (the same weights) unless pre_softmax; the bridge fixes pre_softmax False "
        "(qwen3_next_bridge.py:71)",
    ),
    FieldRule(
        megatron="moe_layer_freq",
        hf=("decoder_sparse_step", "mlp_only_layers", "num_experts"),
        expect=_qwen_next_moe_layers,
        observe=megatron_moe_layers,
        note="per-layer MoE pattern; the Qwen3-Next bridge never sets moe_layer_freq (every layer MoE)",
    ),
    _mtp("num_nextn_predict_layers", "mtp_num_hidden_layers"),
)
"""model_type qwen3_next: every Qwen3NextConfig field plus full_attention_interval and num_nextn_predict_layers."""

_QWEN35_EXTRA = (
    _mtp("mtp_num_hidden_layers", "num_nextn_predict_layers"),
    DEDICATED_MTP_EMBEDDINGS,
    FieldRule(
        megatron="attention_output_gate",
        hf=("attn_output_gate",),
        expect=lambda _c, _m: True,
        note="published Qwen3.5 configs carry attn_output_gate; transformers reads no such field and always gates",
    ),
)

QWEN35_TABLE = (
    *_common(QWEN35),
    same("intermediate_size", "ffn_hidden_size"),
    _no_attention_bias(f"{QWEN35}:666-668"),
    implied("num_moe_experts", None, "dense architecture: no MoE layers"),
    *_QWEN35_EXTRA,
)
"""model_type qwen3_5_text: every Qwen3_5TextConfig field plus the MTP and gate fields published configs carry."""

QWEN35_MOE_TABLE = (
    *_common(QWEN35_MOE),
    _no_attention_bias(f"{QWEN35_MOE}:664-666"),
    *_routed(f"{QWEN35_MOE}:787"),
    FieldRule(
        megatron="moe_router_pre_softmax",
        hf=("norm_topk_prob",),
        expect=lambda _c, _m: False,
        note=f"HF Qwen3.5-MoE reads no norm_topk_prob: it always renormalises the top-k ({QWEN35_MOE}:789), "
        "which Megatron's softmax over the top-k logits gives",
    ),
    FieldRule(
        megatron="moe_layer_freq",
        hf=("decoder_sparse_step", "mlp_only_layers"),
        expect=lambda c, _m: [1] * c["num_hidden_layers"],
        observe=megatron_moe_layers,
        note=f"every HF Qwen3.5-MoE layer is sparse ({QWEN35_MOE}:846: it reads neither field)",
    ),
    *_QWEN35_EXTRA,
)
"""model_type qwen3_5_moe_text: every Qwen3_5MoeTextConfig field plus the MoE, MTP and gate fields published configs
carry."""

_GDN_EXPORT_FIELDS = ("layer_types", "linear_*", "shared_expert_intermediate_size")

GDN_CONFIG_EXPORT_LOSES_SCHEDULE = UpstreamBug(
    name="gdn-config-export-loses-schedule",
    summary="the Qwen3-Next / Qwen3.5 bridges inherit the generic megatron_to_hf_config, which writes neither "
    "layer_types nor the GDN head counts / dims nor shared_expert_intermediate_size: a config exported from a "
    "Megatron provider gets the HF class defaults for them",
    where="megatron/bridge/models/conversion/model_bridge.py:695-758 (qwen3_next_bridge.py / qwen35_bridge.py do not "
    "override it; auto_bridge.py:401 builds the HF config from it)",
    findings=tuple(
        ("config", f"{field} (megatron_to_hf_config)", "roundtrip-mismatch") for field in _GDN_EXPORT_FIELDS
    ),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""What the roundtrip half of the config oracle names for a schedule or GDN geometry that is not the class default."""
