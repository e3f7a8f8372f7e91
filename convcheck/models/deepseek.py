"""DeepSeek-V3-style models (multi-latent attention, dense-first layers, routed + shared experts with a sigmoid router
and an fp32 expert bias, MTP): DeepSeek-V3 and the Moonlight / DeepSeek-V2-Lite shape (no q LoRA).

The tiny fixtures build and run every oracle through the real bridge on CPU (convcheck.compat shims 15-18). The
explicit mappings are in `deepseek_mappings.py` (MLA projections: convcheck.mappings.mla); the config table (below)
covers every MLA, MoE, Yarn and MTP knob of DeepseekV3Config."""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.bridge03_bugs import DEEPSEEK_KV_HEADS_AS_KV_CHANNELS, DEEPSEEK_V3_SCORE_FUNCTION_UNSET
from convcheck.models.config_rules import (
    HEADS_AND_VOCAB,
    FieldRule,
    HfView,
    MegatronGet,
    function_name,
    implied,
    same,
    unsupported,
)
from convcheck.models.fixture_spec import FixtureSpec, engine_variant
from convcheck.models.qwen3_moe import megatron_moe_layers
from convcheck.models.upstream_bug import UpstreamBug

MLA_SHAPES: dict[str, Any] = {
    "vocab_size": 152,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 20,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 12,
    "qk_rope_head_dim": 8,
    "v_head_dim": 10,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 4,
    "norm_topk_prob": True,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
"""Every width distinct where a swap could hide (hidden 32, dense ffn 64, expert ffn 20, q LoRA 24, kv LoRA 16, nope
12, rope 8, v 10), every tensor at most 5120 elements; 4 layers (one dense, three MoE) so PP2 splits evenly, 8 experts
(EP2) and 4 heads (TP2)."""

GROUPED_ROUTING: dict[str, Any] = {"n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5}
"""Group-limited routing with top-k / topk_group = 2: megatron-core scores a group by its top (topk // topk_group)
experts (moe_utils.py:656), HF by its top 2 (modeling_deepseek_v3.py:219); both agree only when that is 2."""

YARN: dict[str, Any] = {
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
    "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
}  # fmt: skip

TINY_DEEPSEEK_V3 = FixtureSpec(
    name="deepseek-v3",
    config_class="DeepseekV3Config",
    description="DeepSeek-V3: MLA (q LoRA), dense-first, 8 routed + 1 shared expert, grouped sigmoid routing, yarn, "
    "1 MTP layer",
    config={
        **MLA_SHAPES,
        **GROUPED_ROUTING,
        "first_k_dense_replace": 1,
        "rope_parameters": YARN,
        "num_nextn_predict_layers": 1,
    },  # fmt: skip
    fp32_tensors=("e_score_correction_bias",),
    mtp_layers=1,
)
TINY_MOONLIGHT = FixtureSpec(
    name="moonlight",
    config_class="DeepseekV3Config",
    description="Moonlight / DeepSeek-V2-Lite shape: DeepseekV3ForCausalLM without q LoRA (q_proj), yarn, no MTP",
    config={**MLA_SHAPES, **GROUPED_ROUTING, "q_lora_rank": None, "first_k_dense_replace": 1, "rope_parameters": YARN},
    fp32_tensors=("e_score_correction_bias",),
)
KIMI_K2_YARN: dict[str, Any] = {
    "rope_type": "yarn", "rope_theta": 50000.0, "factor": 32.0, "original_max_position_embeddings": 4096,
    "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
}  # fmt: skip
"""moonshotai/Kimi-K2-Instruct's rope_scaling (beta_fast 1, not DeepSeek-V3's 32) with its rope_theta 50000."""

TINY_KIMI_K2 = FixtureSpec(
    name="kimi-k2",
    config_class="DeepseekV3Config",
    description="Kimi-K2: DeepSeek-V3's structure (MLA with q LoRA, dense-first, 8 routed + 1 shared expert, sigmoid "
    "routing with expert bias) with Kimi's knobs: one expert group, routed_scaling_factor 2.827, yarn x32 (beta 1/1, "
    "theta 5e4), no MTP",
    config={
        **MLA_SHAPES,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 2.827,
        "first_k_dense_replace": 1,
        "rope_parameters": KIMI_K2_YARN,
        "max_position_embeddings": 131072,
        "num_nextn_predict_layers": 0,
    },  # fmt: skip
    fp32_tensors=("e_score_correction_bias",),
)
"""The published Kimi-K2-Instruct config (model_type kimi_k2, DeepseekV3ForCausalLM: transformers' DeepseekV3Config
builds it) at MLA_SHAPES' widths: 384 experts top-8 in one group -> 8 top-4 (EP2), 61 layers (1 dense-first) -> 4,
vocab 163840 -> 152; rms_norm_eps 1e-6, norm_topk_prob, the shared expert and max_position_embeddings 131072 (32 x
the yarn original 4096, so transformers takes the factor without a warning) as published."""
TINY_DEEPSEEK_V3_VLLM = engine_variant(
    TINY_DEEPSEEK_V3,
    "tiny:deepseek-v3 with the MLA widths CPU vLLM's MLA kernel takes (kv LoRA 512 + rope 64 = 576), nope / v 32, "
    "expert width 32, noaux_tc routing spelt out (vLLM reads topk_method), 1 MTP layer",
    hidden_size=64,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=32,
    v_head_dim=32,
    q_lora_rank=32,
    moe_intermediate_size=32,
    topk_method="noaux_tc",
)
HF_QA_KV_NORM_EPS = 1e-6
"""HF builds q_a_layernorm and kv_a_layernorm with a fixed eps (modeling_deepseek_v3.py:388,396 -> RMSNorm's default
1e-6), whatever rms_norm_eps says; Megatron's MLA q/kv norms use layernorm_epsilon."""


def fixed_qa_kv_eps(where: str = "", published: str = "") -> FieldRule:
    """rms_norm_eps vs Megatron's one layernorm_epsilon: equal only at HF's fixed q_a / kv_a norm eps (1e-6).
    `where`: the HF modeling file:lines building those norms; `published`: what a published config says."""
    return FieldRule(
        megatron="layernorm_epsilon",
        hf=("rms_norm_eps",),
        expect=lambda c, _m: (
            HF_QA_KV_NORM_EPS
            if c["rms_norm_eps"] == HF_QA_KV_NORM_EPS
            else unsupported(
                f"HF's q_a / kv_a layernorms use eps {HF_QA_KV_NORM_EPS} whatever rms_norm_eps "
                f"({c['rms_norm_eps']}) says" + (f" ({where})" if where else "")
            )
        ),
        note="Megatron uses one layernorm_epsilon for every norm, MLA's q / kv norms included, and HF's q_a / kv_a "
        "norms always use 1e-6: the two agree only when rms_norm_eps is 1e-6"
        + (f" ({published})" if published else ""),
    )


def group_scores_rule(hf_where: str) -> FieldRule:
    """Group-limited routing: Megatron scores a group by its top (top-k // topk_group) experts, HF (at `hf_where`) by
    its top 2; the two agree with one group or where that quotient is 2."""
    return FieldRule(
        megatron="moe_router_group_topk",
        hf=("num_experts_per_tok", "topk_group"),
        expect=lambda c, m: (
            m("moe_router_group_topk")
            if (c["n_group"] or 1) == 1 or c["num_experts_per_tok"] // c["topk_group"] == 2
            else unsupported(
                "group scores from the top num_experts_per_tok // topk_group experts (Megatron, moe_utils.py:656) "
                f"where HF takes the top 2 ({hf_where})"
            )
        ),
        note="with more than one group, both score a group by the sum of its top 2 experts only when top-k / "
        "topk_group is 2",
    )


def _dense_first(c: HfView, _m: MegatronGet) -> list[int]:
    """1 where HF builds an MoE block: layers from first_k_dense_replace on (every moe_layer_freq-th, here 1)."""
    first_dense = c["first_k_dense_replace"]
    return [int(i >= first_dense) for i in range(c["num_hidden_layers"])]


def _rope(c: HfView) -> str:
    return c.get("rope_parameters.rope_type", "default")


def _rope_kind(c: HfView, _m: MegatronGet) -> str:
    """`rope` or `yarn`; Yarn with factor 1 is plain RoPE (no frequency change, mscale 1), so it reads `rope`."""
    kind = {"yarn": "yarn", "default": "rope"}.get(_rope(c), unsupported(f"rope_type {_rope(c)!r}"))
    return "rope" if kind == "yarn" and float(c.get("rope_parameters.factor", 1.0)) == 1.0 else kind


def _megatron_rope_kind(value: Any, m: MegatronGet) -> str:
    """Megatron's MLA rope_type, `rope` for Yarn with rotary_scaling_factor 1: the bridge keeps MLA's yarn and sets
    factor 1 for a model without rope scaling (conversion/model_bridge.py:604-613), which is plain RoPE."""
    return "rope" if value == "yarn" and float(m("rotary_scaling_factor")) == 1.0 else value


def _yarn(field: str) -> FieldRule:
    """One Yarn parameter: Megatron's field of the same name (rope_parameters.factor: rotary_scaling_factor)."""
    megatron = "rotary_scaling_factor" if field == "factor" else field
    return FieldRule(
        megatron=megatron,
        hf=(f"rope_parameters.{field}",),
        expect=lambda c, m: (
            c[f"rope_parameters.{field}"] if c.get("rope_parameters.rope_type") == "yarn" else m(megatron)
        ),
        note="Yarn RoPE (only read with rope_type yarn)",
    )


MTP_LAYERS = FieldRule(
    megatron="mtp_num_layers",
    hf=("num_nextn_predict_layers",),
    expect=lambda c, _m: c.get("num_nextn_predict_layers") or None,
    observe=lambda value, _m: value or None,
    note="MTP layers model.layers.{L + k}",
)
"""num_nextn_predict_layers <-> mtp_num_layers (0 and absent both mean none): the DeepSeek-V3 and GLM-5 tables."""

DEEPSEEK_V3_TABLE = (
    same("num_hidden_layers", "num_layers"),
    same("hidden_size", "hidden_size"),
    same("intermediate_size", "ffn_hidden_size", note="the dense-first layers' MLP"),
    *HEADS_AND_VOCAB,
    same("max_position_embeddings", "seq_length"),
    fixed_qa_kv_eps(),
    implied("normalization", "RMSNorm", "RMSNorm everywhere (input, post-attention, final, q_a / kv_a norms)"),
    implied("multi_latent_attention", True, "DeepSeek-V3 attention is MLA"),
    same("q_lora_rank", "q_lora_rank", note="None: q_proj without a q LoRA (Moonlight, DeepSeek-V2-Lite)"),
    same("kv_lora_rank", "kv_lora_rank"),
    same("qk_nope_head_dim", "qk_head_dim", note="Megatron's qk_head_dim is the no-RoPE part"),
    same("qk_rope_head_dim", "qk_pos_emb_head_dim"),
    same("v_head_dim", "v_head_dim"),
    FieldRule(
        megatron="qk_layernorm",
        hf=("qk_head_dim",),
        expect=lambda c, _m: (
            c["qk_head_dim"] == c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
            or unsupported("qk_head_dim other than qk_nope_head_dim + qk_rope_head_dim")
        ),
        note="HF derives qk_head_dim; Megatron's MLA applies the q_a / kv_a norms (qk_layernorm)",
    ),
    FieldRule(
        megatron="multi_latent_attention",
        hf=("rope_interleave",),
        expect=lambda c, _m: (
            bool(c.get("rope_interleave", True))
            or unsupported("rope_interleave false (Megatron's MLA applies RoPE to interleaved pairs)")
        ),
        note="HF's rope_interleave pairs adjacent dimensions, as Megatron's MLA does",
    ),
    same("rope_parameters.rope_theta", "rotary_base", also=("rope_theta",)),
    FieldRule(
        megatron="rope_type",
        hf=("rope_parameters.rope_type",),
        expect=_rope_kind,
        observe=_megatron_rope_kind,
        note="Yarn with factor 1 is plain RoPE on both sides",
    ),
    *(
        _yarn(f)
        for f in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
    ),  # fmt: skip
    FieldRule(
        megatron="activation_func", hf=("hidden_act",), expect=lambda c, _m: c["hidden_act"], observe=function_name
    ),
    implied("gated_linear_unit", True, "MLP and experts are down(act(gate(x)) * up(x))"),
    same("attention_bias", "add_qkv_bias"),
    implied("add_bias_linear", False, "DeepSeek-V3 projections and experts have no bias"),
    same("tie_word_embeddings", "share_embeddings_and_output_weights"),
    same("attention_dropout", "attention_dropout", absent=0.0),
    same("n_routed_experts", "num_moe_experts"),
    same("num_experts_per_tok", "moe_router_topk"),
    same("moe_intermediate_size", "moe_ffn_hidden_size"),
    FieldRule(
        megatron="moe_shared_expert_intermediate_size",
        hf=("n_shared_experts",),
        expect=lambda c, _m: (c["n_shared_experts"] or 0) * c["moe_intermediate_size"] or None,
        note="the shared experts fused into one MLP of n_shared_experts x moe_intermediate_size",
    ),
    FieldRule(
        megatron="moe_layer_freq",
        hf=("first_k_dense_replace",),
        expect=_dense_first,
        observe=megatron_moe_layers,
        note="dense-first layers, MoE after",
    ),
    same("n_group", "moe_router_num_groups"),
    same("topk_group", "moe_router_group_topk"),
    group_scores_rule("modeling_deepseek_v3.py:219"),
    same("routed_scaling_factor", "moe_router_topk_scaling_factor"),
    implied("moe_router_score_function", "sigmoid", "HF DeepseekV3TopkRouter: sigmoid scores"),
    implied("moe_router_enable_expert_bias", True, "HF adds e_score_correction_bias for the top-k choice"),
    FieldRule(
        megatron="moe_router_score_function",
        hf=("norm_topk_prob",),
        expect=lambda c, _m: (
            "sigmoid"
            if c["norm_topk_prob"] or c["num_experts_per_tok"] == 1
            else unsupported("norm_topk_prob false (Megatron renormalises sigmoid top-k weights)")
        ),
        note="Megatron divides the chosen sigmoid scores by their sum, as HF does with norm_topk_prob",
    ),
    MTP_LAYERS,
    implied("hidden_dropout", 0.0, "HF decoder layers have no hidden dropout"),
    FieldRule(
        megatron="num_layers",
        hf=("pretraining_tp",),
        expect=lambda c, m: m("num_layers") if c.get("pretraining_tp", 1) == 1 else unsupported("pretraining_tp > 1"),
        note="pretraining_tp > 1 splits HF's linear layers into slices (an HF-only forward variant)",
    ),
)
"""The config oracle's table for model_type deepseek_v3 (every field of a DeepseekV3Config)."""

RELEASES_0_4_TO_0_6 = ("0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2")
"""Releases the DeepSeek fixtures ran on (make test-release; 0.3.x cannot build them, see releases.toml)."""

FIRST_K_DENSE_EXPORT_DROPPED = UpstreamBug(
    name="deepseek-v3-config-export-drops-first-k-dense",
    summary="megatron_to_hf_config writes no first_k_dense_replace (the import turns it into moe_layer_freq and the "
    "export never turns it back): the exported config reads transformers' default 3 dense layers",
    where="megatron/bridge/models/deepseek/deepseek_v3_bridge.py:86-88 (0.4.2, the import only)",
    findings=(("config", "first_k_dense_replace*", "roundtrip-mismatch"),),
    seen_in=("0.4.0", "0.4.1", "0.4.2"),
    fixed_in="0.5.0 (deepseek_v3_bridge.py:111, rebuilt from moe_layer_freq)",
)
"""Seen by the release smoke (tiny:deepseek-v3, tiny:moonlight) and `convcheck support` on 0.4.2."""

YARN_DROPPED = UpstreamBug(
    name="deepseek-yarn-dropped",
    summary="megatron_to_hf_config reads the provider's yarn_rotary_scaling_factor, which the MLA provider leaves "
    "None (its factor is rotary_scaling_factor), so an exported config.json loses the Yarn RoPE scaling",
    where="megatron/bridge/models/conversion/model_bridge.py:732",
    findings=(("config", "rope_parameters.rope_type (megatron_to_hf_config)", "roundtrip-mismatch"),),
    seen_in=RELEASES_0_4_TO_0_6,
)
MTP_ALIASES_DROPPED = UpstreamBug(
    name="deepseek-mtp-aliases-dropped",
    summary="the export never writes an MTP layer's embed_tokens / shared_head.head, the copies of "
    "model.embed_tokens and lm_head that published DeepSeek-V3 checkpoints hold (the GLM-4.7-Flash bridge restores "
    "them, glm/glm47_flash_bridge.py:116)",
    where="megatron/bridge/models/deepseek/common.py:117 (get_common_mapping_list maps no MTP alias)",
    findings=tuple(
        (oracle, f"model.layers.*.{alias}.weight", kind)
        for alias in ("embed_tokens", "shared_head.head")
        for oracle, kind in (
            ("coverage", "not-exported"),
            ("roundtrip", "missing"),
            ("elements", "never-written"),
            ("layout", "missing"),
            ("mapping", "not-exported"),
            ("distckpt", "missing"),
            ("receiver", "not-delivered"),
            ("receiver", "missing"),
            ("save", "missing"),
            ("quant", "missing"),
            ("engine", "not-delivered"),
        )
    ),  # fmt: skip
    seen_in=RELEASES_0_4_TO_0_6,
)

SEQ_LENGTH_4096 = UpstreamBug(
    name="deepseek-seq-length-4096",
    summary="the DeepSeek-V3 bridge sets seq_length = 4096 whatever max_position_embeddings says, and exports it back "
    "as max_position_embeddings",
    where="megatron/bridge/models/deepseek/deepseek_v3_bridge.py:91 (0.5.1)",
    findings=(
        ("config", "max_position_embeddings -> seq_length", "mismatch"),
        ("config", "max_position_embeddings (megatron_to_hf_config)", "roundtrip-mismatch"),
    ),
    seen_in=("0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1"),
    fixed_in="0.6.0",
)

Q_PROJ_NORM_UNMAPPED = UpstreamBug(
    name="mla-q-proj-norm-unmapped",
    summary="without q LoRA (DeepSeek-V2-Lite, Moonlight) megatron-core's MLA qk-norm resolver builds linear_q_proj as "
    "the backend's fused norm + linear (Transformer Engine's LayerNormColumnParallelLinear: a q norm HF's q_proj does "
    "not have), whose layer_norm_weight the DeepSeek bridge does not map; the unmapped parameter leaves an empty "
    "conversion task on which load_hf_weights and export_hf_weights crash (seen with `--spec te`: the local spec "
    "builds a plain linear, compat shim 17)",
    where="megatron-core transformer/mla_qk_norm_config.py:148 (fused linear_q_proj); "
    "megatron/bridge/models/deepseek/common.py:61 (linear_q_proj.weight only); the crash at "
    "conversion/model_bridge.py:1100 (load) and :1340 (export) in 0.6.2",
    findings=(
        ("coverage", "decoder.layers.*.self_attention.linear_q_proj.layer_norm_weight", "unmapped"),
        ("mapping", "decoder.layers.*.self_attention.linear_q_proj.layer_norm_weight", "uncovered"),
    ),
    consequences=(
        ("*", "<import>", "import-failed"),
        ("*", "<export>", "export-failed"),
    ),
    seen_in=("0.6.2",),
)
"""Every other finding of such a run follows from the two crashes (what the import and export never reach)."""

DEEPSEEK_V3 = Architecture(
    hf_classes=("DeepseekV3ForCausalLM",),
    model_type="deepseek_v3",
    mapping_rules="convcheck.models.deepseek_mappings:deepseek_rules",
    config_rules=DEEPSEEK_V3_TABLE,
    fixtures=(TINY_DEEPSEEK_V3, TINY_MOONLIGHT, TINY_KIMI_K2, TINY_DEEPSEEK_V3_VLLM),
    upstream_bugs=(
        YARN_DROPPED,
        MTP_ALIASES_DROPPED,
        SEQ_LENGTH_4096,
        Q_PROJ_NORM_UNMAPPED,
        FIRST_K_DENSE_EXPORT_DROPPED,
        DEEPSEEK_V3_SCORE_FUNCTION_UNSET,
        DEEPSEEK_KV_HEADS_AS_KV_CHANNELS,
    ),
)
