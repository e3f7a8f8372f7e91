"""GLM-5 (GlmMoeDsaForCausalLM, model_type glm_moe_dsa; also GLM-5.1 / 5.2): DeepSeek-V3's multi-latent attention
with the DSA indexer (DeepSeek Sparse Attention: a small per-layer scorer whose top-k key positions the attention
keeps), dense-first MoE with a shared expert, sigmoid routing with an fp32 expert bias, and one MTP layer.

The bridge (megatron-bridge 0.6.2 glm_moe_dsa/glm5_bridge.py, cited as bridge) builds an MLAModelProvider GPTModel
with megatron-core's experimental DSA attention spec; its explicit mappings are glm5_mappings. The table below is
GLM-4.7-Flash's (DeepSeek-V3's with GLM's mlp_layer_types and plain RoPE) plus the indexer's knobs, against
transformers 5.12.1's models/glm_moe_dsa/modeling_glm_moe_dsa.py (cited as HF)."""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.config_rules import FieldRule, HfView, MegatronGet, implied, same, unsupported
from convcheck.models.deepseek import MLA_SHAPES, MTP_LAYERS, fixed_qa_kv_eps, group_scores_rule
from convcheck.models.fixture_spec import FixtureSpec
from convcheck.models.glm import GLM_TABLE
from convcheck.models.registered_bugs import GLM5_INDEXER_ROPE_INTERLEAVE_REQUIRED
from convcheck.models.upstream_bug import BUILD_FAILED, UpstreamBug

HF = "modeling_glm_moe_dsa.py"

GLM5_INDEXER: dict[str, Any] = {"index_n_heads": 2, "index_head_dim": 14, "index_topk": 8}
"""The indexer at tiny widths: 2 scoring heads (not the attention's 4) of 14 channels (apart from every MLA width;
the first qk_rope_head_dim = 8 rotate), top 8 of the logits oracle's 16 positions, so the sparse selection masks."""

TINY_GLM5 = FixtureSpec(
    name="glm5",
    config_class="GlmMoeDsaConfig",
    description="GLM-5: MLA (q LoRA) with the DSA indexer (2 heads x 14, k LayerNorm, top 8), dense-first, 8 routed "
    "+ 1 shared expert, ungrouped sigmoid routing with expert bias, plain RoPE, 1 MTP layer",
    config={
        **MLA_SHAPES,
        **GLM5_INDEXER,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "indexer_rope_interleave": False,
    },  # fmt: skip
    fp32_tensors=("e_score_correction_bias",),
    mtp_layers=1,
)
"""The published GLM-5 structure (tests/data/glm-5.config.json: n_group / topk_group 1, routed_scaling_factor 2.5,
3 dense-first of 78 layers -> 1 of 4, 256 experts top-8 -> 8 top-4, indexer 32 heads x 128 top 2048 -> 2 x 14 top 8,
one MTP layer) at MLA_SHAPES' widths; rms_norm_eps 1e-6 (HF's q_a / kv_a norms use 1e-6 whatever it says);
`indexer_rope_interleave` false spelt out: the bridge reads it with no default (glm5-indexer-rope-interleave-required)
and transformers' indexer rotates half-split (HF:238)."""


def _indexer_schedule(c: HfView, _m: MegatronGet) -> list[str]:
    """HF's per-layer indexer kind: `full` runs its own indexer, `shared` reuses the previous full layer's top-k."""
    return list(c["indexer_types"])


def _megatron_schedule(_value: Any, m: MegatronGet) -> list[str]:
    """Megatron's per-layer kind from dsa_indexer_topk_freq / skip_topk_offset, as megatron-core's
    is_dsa_skip_topk_layer computes it (dsa.py:37-47, 1-based layer numbers, the offset clamped to at least 1)."""
    freq, offset = m("dsa_indexer_topk_freq"), max(m("dsa_indexer_skip_topk_offset"), 1)
    return ["shared" if max(n - offset, 0) % freq else "full" for n in range(1, m("num_layers") + 1)]


def _half_split(c: HfView, _m: MegatronGet) -> Any:
    """False: transformers' indexer rotates half-split pairs whatever indexer_rope_interleave says (HF:238)."""
    flag = c.get("indexer_rope_interleave")
    return False if not flag else unsupported(f"indexer_rope_interleave true (transformers' indexer rotates "
                                              f"half-split pairs, {HF}:238)")  # fmt: skip


GLM5_RULES: tuple[FieldRule, ...] = (
    fixed_qa_kv_eps(f"{HF}:377,385", "the published GLM-5 says 1e-5"),
    implied("experimental_attention_variant", "dsa", "every GLM-5 layer is DSA (HF layer_types)"),
    same("index_n_heads", "dsa_indexer_n_heads"),
    same("index_head_dim", "dsa_indexer_head_dim"),
    same("index_topk", "dsa_indexer_topk", note="key positions each query keeps"),
    FieldRule(
        megatron="dsa_indexer_rope_interleaved",
        hf=("indexer_rope_interleave",),
        expect=_half_split,
        note="the indexer's RoPE on its first qk_rope_head_dim channels: half-split in transformers",
    ),
    FieldRule(
        megatron="dsa_indexer_topk_freq",
        hf=("indexer_types", "index_topk_freq", "index_skip_topk_offset", "index_topk_pattern"),
        expect=_indexer_schedule,
        observe=_megatron_schedule,
        note="which layers run their own indexer (HF builds indexer_types from index_topk_freq / "
        "index_skip_topk_offset or index_topk_pattern, configuration_glm_moe_dsa.py:135-146)",
    ),
    implied("dsa_indexer_k_norm_epsilon", 1e-6, f"HF's indexer k_norm is nn.LayerNorm(eps=1e-6) ({HF}:193)"),
    implied(
        "dsa_indexer_rotate_activation", False, f"HF skips the reference indexer's Hadamard rotation ({HF}:210-213)"
    ),
    implied("dsa_indexer_scoring_relu", True, f"HF scores relu(q . k) per head ({HF}:245)"),
    MTP_LAYERS,
    implied("qk_layernorm", True, "MLA's q_a / kv_a norms"),
    group_scores_rule(f"{HF}:595"),
    FieldRule(
        megatron="moe_router_enable_expert_bias",
        hf=("topk_method",),
        expect=lambda _c, _m: True,
        note=f"HF GlmMoeDsa reads no topk_method: it always picks experts by sigmoid score + e_score_correction_bias "
        f"(noaux_tc, {HF}:591-592)",
    ),
    same("mlp_bias", "add_bias_linear", note="GLM-5's MLPs and experts have no bias"),
    FieldRule(
        megatron="qk_pos_emb_head_dim",
        hf=("head_dim", "layer_types"),
        expect=lambda c, _m: (
            c["qk_rope_head_dim"]
            if all(kind == "deepseek_sparse_attention" for kind in c["layer_types"])
            else unsupported("layer_types other than deepseek_sparse_attention")
        ),
        note="GlmMoeDsaConfig sets head_dim to qk_rope_head_dim (the rotary's width); every layer is DSA",
    ),
    FieldRule(
        megatron="num_moe_experts",
        hf=("num_experts",),
        expect=lambda c, _m: c["n_routed_experts"],
        note="transformers 5.12.1's GlmMoeDsaConfig declares num_experts (default 256) beside n_routed_experts; its "
        "modeling builds n_routed_experts experts and never reads num_experts (the bridge skips it, bridge:65)",
    ),
)
"""GLM-5's rules beyond GLM-4.7-Flash's (the q_a / kv_a eps rule replaces GLM's, which cites another file)."""

_REPLACED = {
    "rms_norm_eps -> layernorm_epsilon",
    "num_nextn_predict_layers -> mtp_num_layers",
    "num_experts_per_tok+topk_group -> moe_router_group_topk",
    "topk_method -> moe_router_enable_expert_bias",
}
GLM5_TABLE = (*(rule for rule in GLM_TABLE if rule.label not in _REPLACED), *GLM5_RULES)
"""The config oracle's table for model_type glm_moe_dsa (every field of a GlmMoeDsaConfig, plus the indexer knobs
published configs carry: indexer_rope_interleave, index_topk_freq, index_skip_topk_offset, index_topk_pattern)."""

GLM5_BRIDGE = "megatron/bridge/models/glm_moe_dsa/glm5_bridge.py"
MTP_LAYER_TENSORS = ("model.layers.4.*", "model.layers.78.*")
"""The MTP layer's HF tensors in a 4-layer model (tiny:glm5, a published config shrunk by `--from-config`) and in the
published 78-layer GLM-5: model.layers.{num_hidden_layers}.* (the same names as a decoder layer's, so the pattern
names the layer index)."""

MTP_DROPPED = UpstreamBug(
    name="glm5-mtp-dropped",
    summary="the GLM-5 bridge disables MTP (provider.mtp_num_layers = None) although its mapping registry maps "
    "the MTP layer: a checkpoint's MTP layer (model.layers.{L}.*, the published GLM-5's layer 78, indexer "
    "included) is never loaded into Megatron and never exported, and the exported config says "
    "num_nextn_predict_layers None",
    where=f"{GLM5_BRIDGE}:90-92 (MTP off); :239-309 (the MTP mappings it then never uses)",
    findings=(
        ("config", "num_nextn_predict_layers -> mtp_num_layers", "mismatch"),
        ("config", "num_nextn_predict_layers (megatron_to_hf_config)", "roundtrip-mismatch"),
        *(
            (oracle, tensors, kind)
            for tensors in MTP_LAYER_TENSORS
            for oracle, kind in (
                ("coverage", "not-exported"),
                ("coverage", "not-loaded"),
                ("roundtrip", "missing"),
                ("elements", "never-written"),
                ("layout", "missing"),
                ("mapping", "uncovered"),
                ("mapping", "not-exported"),
                ("distckpt", "missing"),
                ("receiver", "not-delivered"),
                ("receiver", "missing"),
                ("save", "missing"),
                ("engine", "not-delivered"),
            )
        ),
    ),
    seen_in=("0.6.2",),
)
"""Seen on tiny:glm5 (one MTP layer, 49 tensors) at TP1, TP2 and EP2."""

CONFIG_EXPORT_DROPS_DSA = UpstreamBug(
    name="glm5-config-export-drops-indexer-and-dense-layers",
    summary="the GLM-5 bridge sets the indexer's widths and top-k and the dense-first layer pattern on the provider "
    "outside CONFIG_MAPPING and has no megatron_to_hf_config of its own: the exported config.json carries none of "
    "them, so transformers fills GlmMoeDsaConfig's defaults (index_n_heads 32, index_head_dim 128, index_topk 2048, "
    "first_k_dense_replace 3) and the exported config describes another model than the weights",
    where=f"{GLM5_BRIDGE}:112-115 and :132-134 (set outside CONFIG_MAPPING); conversion/model_bridge.py:695-765 (the "
    "generic megatron_to_hf_config GLM5Bridge inherits)",
    findings=tuple(
        ("config", f"{field} (megatron_to_hf_config)", "roundtrip-mismatch")
        for field in (
            "index_n_heads",
            "index_head_dim",
            "index_topk",
            "mlp_layer_types+first_k_dense_replace",
            "indexer_types+index_topk_freq+index_skip_topk_offset+index_topk_pattern",
        )
    ),  # fmt: skip
    seen_in=("0.6.2",),
)
"""Seen on tiny:glm5 at TP1, TP2 and EP2 (the published GLM-5's own values are the class defaults except the
dense-first layer count, so a published checkpoint's export keeps them by accident)."""


QKV_A_NORM_EPS = UpstreamBug(
    name="glm5-q-kv-a-norm-eps",
    summary="transformers' GLM-5 builds its q_a / kv_a layernorms with eps 1e-6 whatever rms_norm_eps says; the "
    "bridge sets one layernorm_epsilon = rms_norm_eps for every Megatron norm, so the published config (rms_norm_eps "
    "1e-5) converts to a model whose MLA down-projection norms compute with another epsilon: the logits differ",
    where="megatron/bridge/models/conversion/model_bridge.py:447 (rms_norm_eps -> layernorm_epsilon for all norms; "
    "glm5_bridge.py sets no MLA norm eps); transformers models/glm_moe_dsa/modeling_glm_moe_dsa.py:377,385 "
    "(GlmMoeDsaRMSNorm's default eps 1e-6)",
    findings=(("config", "rms_norm_eps -> layernorm_epsilon", "mismatch"),),
    consequences=(("logits", "logits", "logits-differ"), ("logits", "greedy-tokens", "greedy-differs")),
    seen_in=("0.6.2",),
)
"""Seen on the published GLM-5 config.json shrunk by `--from-config` (with indexer_rope_interleave false added so it
builds) at TP1: logits differ by 0.19; the same checkpoint with rms_norm_eps 1e-6 agrees to 4.8e-7."""

FIRST_K_DENSE_REQUIRED = UpstreamBug(
    name="glm5-first-k-dense-required",
    summary="the 0.5.x GLM-5 bridge reads hf_config.first_k_dense_replace, which transformers' GlmMoeDsaConfig (5.8.1) "
    "does not define: a checkpoint whose config transformers wrote from its own class raises AttributeError and "
    "no model is built",
    where="megatron/bridge/models/glm_moe_dsa/glm5_bridge.py:97-98 (0.5.1)",
    findings=BUILD_FAILED,
    message_contains="first_k_dense_replace",
    seen_in=("0.5.0", "0.5.1"),
)
"""Seen by `convcheck support` on bridge 0.5.1 (GlmMoeDsaForCausalLM from transformers 5.8.1's default config)."""

GLM5 = Architecture(
    hf_classes=("GlmMoeDsaForCausalLM",),
    model_type="glm_moe_dsa",
    mapping_rules="convcheck.models.glm5_mappings:glm5_rules",
    config_rules=GLM5_TABLE,
    fixtures=(TINY_GLM5,),
    upstream_bugs=(
        GLM5_INDEXER_ROPE_INTERLEAVE_REQUIRED,
        MTP_DROPPED,
        CONFIG_EXPORT_DROPS_DSA,
        QKV_A_NORM_EPS,
        FIRST_K_DENSE_REQUIRED,
    ),
)
