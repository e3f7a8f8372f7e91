"""GLM-4.7-Flash (Glm4MoeLiteForCausalLM, model_type glm4_moe_lite): DeepSeek-V3's MLA, dense-first MoE with a shared
expert, sigmoid router with an fp32 expert bias, and MTP, under a config class of its own.

A module of its own, not part of deepseek.py: the HF class differs where the config oracle looks (it builds MoE layers
from `mlp_layer_types` where DeepseekV3 reads `first_k_dense_replace`, uses plain RoPE in the published config, and
cites its own modeling file), while the bridge (megatron-bridge 0.6.2 glm/glm47_flash_bridge.py) reuses DeepSeek's
mapping list: the table below is DeepSeek-V3's with those rules replaced, and the explicit mappings are DeepSeek's
(convcheck/models/deepseek_mappings.py; the tensor names are the same)."""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.config_rules import FieldRule, HfView, MegatronGet, first, unsupported
from convcheck.models.deepseek import (
    DEEPSEEK_V3_TABLE,
    MLA_SHAPES,
    MTP_ALIASES_DROPPED,
    fixed_qa_kv_eps,
    group_scores_rule,
)
from convcheck.models.fixture_spec import FixtureSpec
from convcheck.models.qwen3_moe import megatron_moe_layers
from convcheck.models.upstream_bug import UpstreamBug

TINY_GLM47_FLASH = FixtureSpec(
    name="glm4.7-flash",
    config_class="Glm4MoeLiteConfig",
    description="GLM-4.7-Flash: MLA (q LoRA), dense-first, 8 routed + 1 shared expert, ungrouped sigmoid routing, "
    "plain RoPE, 1 MTP layer",
    config={
        **MLA_SHAPES,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.8,
        "topk_method": "noaux_tc",
        "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "partial_rotary_factor": 1.0,
    },  # fmt: skip
    fp32_tensors=("e_score_correction_bias",),
    mtp_layers=1,
)
"""The published GLM-4.7-Flash config's structure (n_group / topk_group 1, routed_scaling_factor 1.8, topk_method
noaux_tc, first_k_dense_replace 1, one MTP layer, rope_theta 1e6 without scaling, partial_rotary_factor 1.0) at
MLA_SHAPES' widths; rms_norm_eps 1e-6 (the published 1e-5 is what GLM_TABLE names as not representable)."""

GLM_MODELING = "modeling_glm4_moe_lite.py"


def _sparse_layers(c: HfView, _m: MegatronGet) -> list[int]:
    """1 where HF builds an MoE block: `mlp_layer_types[i] == "sparse"` (Glm4MoeLiteDecoderLayer, modeling :507)."""
    return [int(kind == "sparse") for kind in c["mlp_layer_types"]]


def _plain_rope(rope_type: Any, factor: Any) -> str:
    """The rotary as a canonical name: Yarn with factor 1 scales nothing and is plain RoPE (frequencies and mscale
    unchanged), so both spell it "rope"."""
    return "rope" if rope_type in ("default", "rope") or (rope_type == "yarn" and factor == 1.0) else rope_type


def _rope_type(c: HfView, _m: MegatronGet) -> str:
    rope_type = c.get("rope_parameters.rope_type", "default")
    canonical = _plain_rope(rope_type, c.get("rope_parameters.factor"))
    return canonical if canonical in ("rope", "yarn") else unsupported(f"rope_type {rope_type!r}")


def _rotated_fraction(value: Any, m: MegatronGet) -> Any:
    """The fraction of qk_pos_emb_head_dim Megatron's MLA rotates: all of it with Yarn (YarnRotaryEmbedding takes no
    rotary_percent, multi_latent_attention.py:190), rotary_percent with plain RoPE (:182)."""
    return 1.0 if m("rope_type") == "yarn" else value


GLM_RULES = (
    fixed_qa_kv_eps(f"{GLM_MODELING}:253,261", "the published GLM-4.7-Flash says 1e-5"),
    FieldRule(
        megatron="moe_layer_freq",
        hf=("mlp_layer_types", "first_k_dense_replace"),
        expect=_sparse_layers,
        observe=megatron_moe_layers,
        note="HF builds an MoE block where mlp_layer_types says sparse; the GLM bridge builds moe_layer_freq from "
        "first_k_dense_replace alone (default 1, glm47_flash_bridge.py:106-107), which HF never reads, and its "
        "megatron_to_hf_config writes neither field: they agree only when mlp_layer_types is first_k_dense_replace "
        "dense layers, then sparse ones (the published config: one dense layer)",
    ),
    FieldRule(
        megatron="rope_type",
        hf=("rope_parameters.rope_type",),
        expect=_rope_type,
        observe=lambda value, m: _plain_rope(value, m("rotary_scaling_factor")),
        note="the bridge leaves an MLA model without rope scaling on Megatron's Yarn rotary with factor 1 "
        "(model_bridge.py:603-613), which is plain RoPE",
    ),
    FieldRule(
        megatron="rotary_percent",
        hf=("rope_parameters.partial_rotary_factor",),
        also=("partial_rotary_factor",),
        expect=lambda c, _m: first(c, ("rope_parameters.partial_rotary_factor", "partial_rotary_factor"), 1.0),
        observe=_rotated_fraction,
        note="the fraction of qk_rope_head_dim that is rotated (HF: head_dim, which Glm4MoeLiteConfig maps to "
        "qk_rope_head_dim, times partial_rotary_factor)",
    ),
    FieldRule(
        megatron="moe_router_enable_expert_bias",
        hf=("topk_method",),
        expect=lambda _c, _m: True,
        note="HF Glm4MoeLite reads no topk_method: it always picks experts by sigmoid score + "
        f"e_score_correction_bias (noaux_tc, {GLM_MODELING}:465-482)",
    ),
    group_scores_rule(f"{GLM_MODELING}:470"),
)
"""The rules where GLM-4.7-Flash differs from DeepSeek-V3 (each replaces the DeepSeek rule of the same label, or of
the same Megatron field for the layer pattern and rope type)."""

_REPLACED = {
    "rms_norm_eps -> layernorm_epsilon",
    "first_k_dense_replace -> moe_layer_freq",
    "rope_parameters.rope_type -> rope_type",
    "num_experts_per_tok+topk_group -> moe_router_group_topk",
}

GLM_TABLE = (*(rule for rule in DEEPSEEK_V3_TABLE if rule.label not in _REPLACED), *GLM_RULES)
"""The config oracle's table for model_type glm4_moe_lite (every field of a Glm4MoeLiteConfig, plus the
first_k_dense_replace, num_nextn_predict_layers, topk_method and partial_rotary_factor published configs carry)."""

GLM_MTP_ALIASES_DROPPED = UpstreamBug(
    name="glm47-flash-mtp-aliases-dropped",
    summary="the GLM-4.7-Flash bridge has no export hook yet: its export never writes the MTP layer's embed_tokens / "
    "shared_head.head copies of model.embed_tokens and lm_head",
    where="megatron/bridge/models/glm/glm47_flash_bridge.py (0.5.x: no maybe_modify_converted_hf_weight)",
    findings=MTP_ALIASES_DROPPED.findings,
    seen_in=("0.5.0", "0.5.1"),
    fixed_in="0.6.0 (glm47_flash_bridge.py:116 restores them)",
)

QKV_A_NORM_EPS = UpstreamBug(
    name="glm47-flash-q-kv-a-norm-eps",
    summary="transformers' GLM-4.7-Flash builds its q_a / kv_a layernorms with eps 1e-6 whatever rms_norm_eps says; "
    "the bridge sets one layernorm_epsilon = rms_norm_eps for every Megatron norm, so a config with rms_norm_eps "
    "other than 1e-6 (the published 1e-5, transformers' default) converts to a model whose MLA down-projection "
    "norms compute with another epsilon: the logits differ",
    where="megatron/bridge/models/glm/glm47_flash_bridge.py (rms_norm_eps -> layernorm_epsilon for all norms); "
    "transformers models/glm4_moe_lite/modeling_glm4_moe_lite.py:253,261 (eps=1e-6)",
    findings=(
        ("config", "rms_norm_eps -> layernorm_epsilon", "mismatch"),
        ("logits", "logits", "logits-differ"),
        ("logits", "greedy-tokens", "greedy-differs"),
    ),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on Glm4MoeLiteForCausalLM from transformers' default config (rms_norm_eps 1e-5) at TP2
and EP2: logits differ by 1.9e-2; the same checkpoint with rms_norm_eps 1e-6 passes logits and config (2.7e-7)."""

GLM47_FLASH = Architecture(
    hf_classes=("Glm4MoeLiteForCausalLM",),
    model_type="glm4_moe_lite",
    mapping_rules="convcheck.models.deepseek_mappings:deepseek_rules",
    config_rules=GLM_TABLE,
    fixtures=(TINY_GLM47_FLASH,),
    upstream_bugs=(GLM_MTP_ALIASES_DROPPED, QKV_A_NORM_EPS),
)
