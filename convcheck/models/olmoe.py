"""OLMoE (OlmoeForCausalLM): a Llama-style MoE decoder whose q/k norms span all heads; config table, tiny fixture and
the bridge bugs convcheck names."""

from __future__ import annotations

from convcheck.models.architecture import Architecture
from convcheck.models.config_rules import HEADS_AND_VOCAB, FieldRule, HfView, MegatronGet, implied, same, unsupported
from convcheck.models.dense import NORM_ROPE_ACT
from convcheck.models.fixture_spec import TINY_SHAPES, FixtureSpec, engine_variant
from convcheck.models.qwen3_moe import SOFTMAX_ROUTER, megatron_moe_layers
from convcheck.models.upstream_bug import UpstreamBug


def _clip_qkv(c: HfView, m: MegatronGet) -> object:
    """Any num_layers where clip_qkv is null; HF clamps q, k and v to [-clip_qkv, clip_qkv] after the projections
    and q/k norms otherwise, which Megatron cannot represent."""
    clip = c.get("clip_qkv")
    return m("num_layers") if clip is None else unsupported(f"clip_qkv {clip} (Megatron has no q/k/v clamp)")


OLMOE_TABLE = (
    same("num_hidden_layers", "num_layers"),
    same("hidden_size", "hidden_size"),
    *HEADS_AND_VOCAB,
    same("max_position_embeddings", "seq_length"),
    *NORM_ROPE_ACT,
    same("attention_bias", "add_qkv_bias"),
    implied("add_bias_linear", False, "OLMoE o_proj and experts have no bias"),
    implied("qk_layernorm", True, "OLMoE attention always applies q_norm / k_norm (over all heads, not per head)"),
    FieldRule(megatron="num_layers", hf=("clip_qkv",), expect=_clip_qkv, note="clip_qkv must be null"),
    same("num_experts", "num_moe_experts", also=("num_local_experts",)),
    same("num_experts_per_tok", "moe_router_topk"),
    same("intermediate_size", "moe_ffn_hidden_size", note="OLMoE's intermediate_size is the expert width"),
    *SOFTMAX_ROUTER,
    implied("moe_shared_expert_intermediate_size", None, "OLMoE has no shared expert"),
    FieldRule(
        megatron="moe_layer_freq",
        hf=(),
        expect=lambda c, _m: [1] * c["num_hidden_layers"],
        observe=megatron_moe_layers,
        note="every OLMoE decoder layer is an MoE layer",
    ),
    same("router_aux_loss_coef", "moe_aux_loss_coeff", note="training only"),
)
"""Every OlmoeConfig knob; clip_qkv must be null (Megatron cannot clamp q/k/v)."""

TINY_OLMOE = FixtureSpec(
    name="olmoe",
    config_class="OlmoeConfig",
    description="OLMoE (published 1B-7B-0125 structure): 8 experts top-2, full-width q/k norms, 4 heads / 4 KV",
    config={
        **{key: value for key, value in TINY_SHAPES.items() if key not in ("head_dim", "intermediate_size")},
        "num_key_value_heads": 4,
        "intermediate_size": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": False,
        "clip_qkv": None,
        "pad_token_id": 1,
        "eos_token_id": 150,
        "rms_norm_eps": 1e-5,
    },
)
"""Published OLMoE configs have no head_dim (hidden / heads = 8 here) and as many KV heads as query heads: the
bridge's k_layernorm is num_attention_heads wide: a GQA config does not import (olmoe-k-norm-width-ignores-kv-heads)."""

TINY_OLMOE_VLLM = engine_variant(
    TINY_OLMOE,
    "tiny:olmoe with hidden 64, 2 heads (head_dim 32) and expert width 32, which CPU vLLM's kernels accept",
    hidden_size=64,
    num_attention_heads=2,
    num_key_value_heads=2,
    intermediate_size=32,
)

QK_NORM_FULL_WIDTH_UNDER_TP = UpstreamBug(
    name="olmoe-qk-norm-full-width-under-tp",
    summary="OLMoESelfAttention builds q_layernorm / k_layernorm num_attention_heads * head_dim wide and applies them "
    "to this TP rank's local query / key partition: at TP > 1 the forward raises a shape error (the import and export "
    "are consistent and pass); no split of the weight would be right either, the RMS over all heads needs every TP "
    "rank's heads (an all-reduce the attention lacks)",
    where="megatron/bridge/models/olmoe/olmoe_provider.py:121-135 (built full width), :177-180 (applied to the "
    "local partition); the same code since 0.3.0 (c8bd1e84c, #952)",
    findings=(("logits", "decoder.layers.*.self_attention.q_layernorm.weight", "forward-failed"),),
    seen_in=("0.3.0", "0.3.1", "0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""TP1, EP2 and PP2 pass; TP2 and TP2xEP2 fail logits on the first layer's q_layernorm (weight [32], input [.., 16]):
the forward reaches q_layernorm first, so a k_layernorm forward failure is the GQA width bug below."""

SEQUENTIAL_EXPERTS_UNMAPPED = UpstreamBug(
    name="olmoe-sequential-experts-unmapped",
    summary="the OLMoE bridge maps routed experts only in the grouped layout (experts.linear_fc*.weight*), not as "
    "SequentialMLP local_experts (moe_grouped_gemm off, or a build without TE); the unmapped parameters leave empty "
    "conversion tasks on which load_hf_weights and export_hf_weights crash",
    where="megatron/bridge/models/olmoe/olmoe_bridge.py:115, :138-142 (grouped names only); the crash at "
    "conversion/model_bridge.py:1100 (load) and :1340 (export) in 0.6.2; the same mapping table since 0.3.0",
    findings=(("coverage", "decoder.layers.*.mlp.experts.local_experts.*.linear_fc*.weight", "unmapped"),),
    consequences=(
        ("*", "<import>", "import-failed"),
        ("*", "<export>", "export-failed"),
    ),
    seen_in=("0.3.1", "0.5.1", "0.6.2"),
)
"""Every other finding of such a run follows from the two crashes (layer 1 and every expert are never loaded)."""

K_NORM_WIDTH_IGNORES_KV_HEADS = UpstreamBug(
    name="olmoe-k-norm-width-ignores-kv-heads",
    summary="OLMoESelfAttention builds k_layernorm num_attention_heads * head_dim wide where HF's k_norm is "
    "num_key_value_heads * head_dim: a GQA OLMoE checkpoint fails to import (shape mismatch) and its forward raises; "
    "published OLMoE configs have as many KV heads as heads",
    where="megatron/bridge/models/olmoe/olmoe_provider.py:129-135 (transformers olmoe/modeling_olmoe.py OlmoeAttention "
    "k_norm); the same code since 0.3.0",
    findings=(
        ("mapping", "decoder.layers.*.self_attention.k_layernorm.weight", "import-shape"),
        ("logits", "decoder.layers.*.self_attention.k_layernorm.weight", "forward-failed"),
        ("elements", "model.layers.*.self_attn.k_norm.weight", "shape"),
    ),
    seen_in=("0.6.2",),
)

HARD_CODED_KNOBS = UpstreamBug(
    name="olmoe-provider-hard-codes-knobs",
    summary="the OLMoE bridge sets share_embeddings_and_output_weights False and moe_router_pre_softmax True whatever "
    "tie_word_embeddings and norm_topk_prob say, and accepts a clip_qkv Megatron cannot apply (its exported config "
    "loses all three); published OLMoE configs hold the values it assumes",
    where="megatron/bridge/models/olmoe/olmoe_bridge.py:79 (share_embeddings_and_output_weights), :89 "
    "(moe_router_pre_softmax); clip_qkv is read nowhere",
    findings=(
        ("config", "tie_word_embeddings -> share_embeddings_and_output_weights", "mismatch"),
        ("config", "norm_topk_prob -> moe_router_pre_softmax", "mismatch"),
        ("config", "clip_qkv -> num_layers", "mismatch"),
        ("config", "tie_word_embeddings (megatron_to_hf_config)", "roundtrip-mismatch"),
        ("config", "norm_topk_prob (megatron_to_hf_config)", "roundtrip-mismatch"),
        ("config", "clip_qkv (megatron_to_hf_config)", "roundtrip-mismatch"),
    ),
    seen_in=("0.6.2",),
)


OLMOE = Architecture(
    hf_classes=("OlmoeForCausalLM",),
    model_type="olmoe",
    mapping_rules="convcheck.models.olmoe_mappings:olmoe_rules",
    config_rules=OLMOE_TABLE,
    fixtures=(TINY_OLMOE, TINY_OLMOE_VLLM),
    upstream_bugs=(
        QK_NORM_FULL_WIDTH_UNDER_TP,
        SEQUENTIAL_EXPERTS_UNMAPPED,
        K_NORM_WIDTH_IGNORES_KV_HEADS,
        HARD_CODED_KNOBS,
    ),
)
