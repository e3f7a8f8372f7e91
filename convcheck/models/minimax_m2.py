"""MiniMax-M2 (MiniMaxM2ForCausalLM, model_type minimax_m2; also M2.5 / M2.7): config table, tiny fixture and the
bridge bugs convcheck names. The bridge builds it only on Transformer Engine (convcheck.models.te_only); its mappings
are minimax_m2_mappings.

The table is megatron-bridge 0.6.2's minimax_m2/minimax_m2_bridge.py provider_bridge (cited as bridge) against
transformers 5.12.1's models/minimax_m2/modeling_minimax_m2.py (cited as HF)."""

from __future__ import annotations

from convcheck.models.architecture import Architecture
from convcheck.models.config_rules import (
    HEADS_AND_VOCAB,
    FieldRule,
    HfView,
    MegatronGet,
    built_qk_norms,
    implied,
    same,
)
from convcheck.models.dense import NORM_ROPE_ACT
from convcheck.models.fixture_spec import TINY_SHAPES, FixtureSpec
from convcheck.models.qwen3_moe import megatron_moe_layers
from convcheck.models.upstream_bug import UpstreamBug

PARTIAL = "rope_parameters.partial_rotary_factor"


def _rotary_percent(c: HfView, _m: MegatronGet) -> float:
    """HF rotates rope_parameters.partial_rotary_factor of each head (HF:187-189); transformers 5.12.1 does not read
    the published config's rotary_dim, the bridge reads only rotary_dim (bridge:148-152)."""
    return float(c.get(PARTIAL, 1.0))


def _rotary_dim_share(c: HfView, _m: MegatronGet) -> float:
    """rotary_dim / head_dim where the config gives rotary_dim (what MiniMax's own code and the bridge rotate), else
    the partial_rotary_factor rule's value."""
    rotary = c.get("rotary_dim")
    if rotary is None:
        return float(c.get(PARTIAL, 1.0))
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return rotary / head_dim


MINIMAX_M2_TABLE: tuple[FieldRule, ...] = (
    same("num_hidden_layers", "num_layers"),
    same("hidden_size", "hidden_size"),
    *HEADS_AND_VOCAB,
    same("max_position_embeddings", "seq_length"),
    *(rule for rule in NORM_ROPE_ACT if rule.megatron not in ("rotary_percent", "window_size")),
    FieldRule(
        megatron="rotary_percent",
        hf=(PARTIAL,),
        expect=_rotary_percent,
        note="partial RoPE as transformers computes it: the first partial_rotary_factor x head_dim channels rotate",
    ),
    FieldRule(
        megatron="rotary_percent",
        hf=("rotary_dim",),
        expect=_rotary_dim_share,
        note="partial RoPE as the checkpoint's rotary_dim gives it (MiniMax's code): rotary_dim of head_dim channels",
    ),
    implied("window_size", None, "MiniMax-M2 attends to every position"),
    implied("add_qkv_bias", False, "MiniMax-M2 q/k/v projections have no bias"),
    implied("add_bias_linear", False, "MiniMax-M2 o_proj and experts have no bias"),
    built_qk_norms("q_norm / k_norm over all heads at once (num_heads x head_dim wide, HF:311-312)"),
    same("num_local_experts", "num_moe_experts", also=("num_experts",)),
    same("num_experts_per_tok", "moe_router_topk"),
    same("intermediate_size", "moe_ffn_hidden_size", note="MiniMax-M2's intermediate_size is the expert width"),
    implied("moe_router_score_function", "sigmoid", "HF MiniMaxM2TopKRouter: sigmoid scores (HF:58)"),
    implied("moe_router_enable_expert_bias", True, "HF adds e_score_correction_bias for the top-k choice (HF:59)"),
    implied(
        "moe_router_pre_softmax", False, "HF divides the chosen sigmoid scores by their sum (HF:62), as Megatron does"
    ),
    implied("moe_router_topk_scaling_factor", None, "HF applies no routed scaling factor"),
    implied("moe_router_num_groups", None, "HF routes over all experts (no group-limited routing)"),
    implied("moe_shared_expert_intermediate_size", None, "MiniMax-M2 has no shared expert"),
    FieldRule(
        megatron="moe_layer_freq",
        hf=(),
        expect=lambda c, _m: [1] * c["num_hidden_layers"],
        observe=megatron_moe_layers,
        note="every MiniMax-M2 decoder layer is an MoE layer",
    ),
    same("router_aux_loss_coef", "moe_aux_loss_coeff", note="training only"),
    implied("moe_input_jitter_eps", None, "HF's router_jitter_noise is training-time input noise"),
)
"""Every MiniMaxM2Config knob and the published config's rotary_dim. The published MTP knobs (use_mtp,
num_mtp_modules, mtp_transformer_layers) describe modules transformers 5.12.1 builds none of and the bridge maps none
of (minimax_m2_bridge.py docstring: "MTP modules are not mapped"): not covered."""


TINY_MINIMAX_M2 = FixtureSpec(
    name="minimax-m2",
    config_class="MiniMaxM2Config",
    description="MiniMax-M2 (published structure): 8 experts top-2 with sigmoid routing and an fp32 expert bias, "
    "full-width q/k norms, partial RoPE 0.5 (rotary_dim 4 of head_dim 8), 4 heads / 2 KV, every layer MoE",
    config={
        **{key: value for key, value in TINY_SHAPES.items() if key not in ("intermediate_size",)},
        "intermediate_size": 16,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "rotary_dim": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5},
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": 1,
    },
    fp32_tensors=("e_score_correction_bias",),
)
"""rotary_dim and partial_rotary_factor agree (the bridge reads the first, transformers the second); the published
MTP modules are not built (see MINIMAX_M2_TABLE)."""


ROTARY_DIM_IGNORED = UpstreamBug(
    name="transformers-minimax-m2-rotary-dim-ignored",
    summary="transformers' MiniMax-M2 rotates rope_parameters.partial_rotary_factor x head_dim channels and declares "
    "no rotary_dim: the published config.json (tests/data/minimax-m2.config.json), which gives rotary_dim 64 of "
    "head_dim 128 and no partial_rotary_factor, runs in transformers with RoPE on every channel, where MiniMax's own "
    "code and the bridge (rotary_percent = rotary_dim / head_dim) rotate half",
    where="transformers 5.12.1 models/minimax_m2/modeling_minimax_m2.py:187-189 (configuration_minimax_m2.py has no "
    "rotary_dim); megatron-bridge minimax_m2_bridge.py:148-152 reads rotary_dim",
    findings=(
        ("config", "rope_parameters.partial_rotary_factor -> rotary_percent", "mismatch"),
        ("config", "rope_parameters.partial_rotary_factor (megatron_to_hf_config)", "roundtrip-mismatch"),
        ("logits", "logits", "logits-differ"),
        ("logits", "greedy-tokens", "greedy-differs"),
    ),
    seen_in=("5.12.1",),
    project="transformers",
)
"""Seen with `verify --model config:tests/data/minimax-m2.config.json` at TP2xEP2: config names rotary_percent against
partial_rotary_factor (HF 1.0, Megatron 0.5; the rotary_dim rule holds) and the logits differ by 4.4e-3; every weight
oracle passes. tiny:minimax-m2 gives both knobs, agreeing, and passes. A Megatron rotary_percent that breaks the
rotary_dim rule is no finding of this bug."""


MINIMAX_M2 = Architecture(
    hf_classes=("MiniMaxM2ForCausalLM",),
    model_type="minimax_m2",
    mapping_rules="convcheck.models.minimax_m2_mappings:minimax_m2_rules",
    config_rules=MINIMAX_M2_TABLE,
    fixtures=(TINY_MINIMAX_M2,),
    upstream_bugs=(ROTARY_DIM_IGNORED,),
)
