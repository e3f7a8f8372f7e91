"""Qwen3-MoE: the Llama-style decoder of `dense.py` with expert layers; its config table and tiny fixture."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.bridge03_bugs import QWEN3_HEAD_DIM_IGNORED, QWEN3_HEAD_DIM_IGNORED_IMPORT
from convcheck.models.config_rules import FieldRule, HfView, MegatronGet, first, implied, same
from convcheck.models.dense import NORM_ROPE_ACT, SHAPES
from convcheck.models.fixture_spec import ENGINE_DIMS, tiny_spec
from convcheck.models.upstream_bug import UpstreamBug

NUM_EXPERTS = ("num_local_experts", "num_experts")
"""transformers 5 calls the expert count num_local_experts; 4.57 (bridge 0.3.x) and published configs: num_experts."""


def _moe_layers(c: HfView, _m: MegatronGet) -> list[int]:
    """1 where HF builds a sparse MoE block (Qwen3MoeDecoderLayer's rule), else 0."""
    step, dense = c.get("decoder_sparse_step", 1), set(c.get("mlp_only_layers") or [])
    experts = first(c, NUM_EXPERTS)
    return [int(i not in dense and experts > 0 and (i + 1) % step == 0) for i in range(c["num_hidden_layers"])]


def megatron_moe_layers(freq: Any, m: MegatronGet) -> Any:
    """Megatron's moe_layer_freq as a per-layer 0/1 list (an int N means every N-th layer from 0)."""
    return [int(i % freq == 0) for i in range(m("num_layers"))] if isinstance(freq, int) else list(freq)


SOFTMAX_ROUTER = (
    FieldRule(
        megatron="moe_router_pre_softmax",
        hf=("norm_topk_prob",),
        expect=lambda c, _m: not c["norm_topk_prob"],
        note="HF softmaxes all experts then renormalises the top-k iff norm_topk_prob; Megatron softmaxes the "
        "top-k (same result) unless pre_softmax",
    ),
    implied("moe_router_score_function", "softmax", "HF router: softmax over expert logits"),
    implied("moe_router_topk_scaling_factor", None, "HF applies no routed scaling factor"),
    implied("moe_router_enable_expert_bias", False, "HF router has no expert bias"),
)
"""A softmax router without expert bias or scaling, renormalising the top-k iff norm_topk_prob (Qwen3-MoE, OLMoE)."""

QWEN3_MOE_TABLE = (
    *SHAPES,
    *NORM_ROPE_ACT,
    same("attention_bias", "add_qkv_bias"),
    implied("add_bias_linear", False, "Qwen3-MoE o_proj and experts have no bias"),
    implied("qk_layernorm", True, "Qwen3-MoE attention always applies q_norm / k_norm"),
    same(NUM_EXPERTS[0], "num_moe_experts", also=NUM_EXPERTS[1:]),
    same("num_experts_per_tok", "moe_router_topk"),
    same("moe_intermediate_size", "moe_ffn_hidden_size"),
    *SOFTMAX_ROUTER,
    implied("moe_shared_expert_intermediate_size", None, "Qwen3-MoE has no shared expert"),
    FieldRule(
        megatron="moe_layer_freq",
        hf=("decoder_sparse_step", "mlp_only_layers", NUM_EXPERTS[0]),
        also=NUM_EXPERTS[1:],
        expect=_moe_layers,
        observe=megatron_moe_layers,
        note="per-layer MoE pattern",
    ),
    same("router_aux_loss_coef", "moe_aux_loss_coeff", note="training only"),
)

TINY_MOE = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
"""The MoE fields both tiny Qwen3-MoE fixtures share (they differ in norm_topk_prob only)."""

NORM_TOPK_PROB_IGNORED = UpstreamBug(
    name="qwen3-moe-norm-topk-prob-ignored",
    summary="the Qwen3-MoE bridge ignores the checkpoint's norm_topk_prob: the import always builds top-k-normalised "
    "routing (moe_router_pre_softmax False, right only for norm_topk_prob true) and the export always writes "
    "norm_topk_prob false; a checkpoint with norm_topk_prob false (transformers' Qwen3MoeConfig default) routes with "
    "other weights in Megatron, and a published one (true) comes back false",
    where="megatron/bridge/models/qwen/qwen3_moe_bridge.py:66 (import) and :48 (export) in 0.5.1; :58 in 0.4.2 and "
    ":59 in 0.3.1 (their generic export writes no norm_topk_prob, read back as transformers' default false); 0.3.0 "
    "never reads it (qwen3_moe_bridge.py:48-70; qwen_provider.py:394, moe_router_pre_softmax False) and exports "
    "nothing; 0.6.0 reads and writes the field at :66 / :48",
    findings=(
        ("config", "norm_topk_prob*", "roundtrip-mismatch"),
        ("config", "norm_topk_prob*", "mismatch"),
    ),
    consequences=(("logits", "logits", "logits-differ"), ("logits", "greedy-tokens", "greedy-differs")),
    seen_in=("0.3.0", "0.3.1", "0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1"),
    fixed_in="0.6.0",
)
"""Seen by the release smoke (tiny:qwen3-moe, norm_topk_prob true: the export) and by `convcheck support` on 0.4.2 /
0.5.1 (transformers' default config, false: the routing, logits off by 2.5e-2)."""

QWEN3_MOE = Architecture(
    hf_classes=("Qwen3MoeForCausalLM",),
    model_type="qwen3_moe",
    mapping_rules="convcheck.models.dense_mappings:decoder_rules",
    config_rules=QWEN3_MOE_TABLE,
    fixtures=(
        tiny_spec(
            "qwen3-moe",
            "Qwen3MoeConfig",
            "Qwen3-MoE, 8 experts top-2, qk-norm",
            **TINY_MOE,
            norm_topk_prob=True,
        ),
        tiny_spec(
            "qwen3-moe-vllm",
            "Qwen3MoeConfig",
            "tiny:qwen3-moe with head_dim 32 and expert width 32, which CPU vLLM's kernels accept",
            **{**TINY_MOE, **ENGINE_DIMS, "moe_intermediate_size": 32},
            norm_topk_prob=True,
        ),
        tiny_spec(
            "qwen3-moe-unnorm",
            "Qwen3MoeConfig",
            "Qwen3-MoE with norm_topk_prob false (top-k weights not renormalised: Megatron's pre-softmax router)",
            **TINY_MOE,
            norm_topk_prob=False,
        ),
        tiny_spec(
            "qwen3-moe-4l",
            "Qwen3MoeConfig",
            "tiny:qwen3-moe with 4 layers: virtual pipeline with experts (PP2 x VPP2 x EP2)",
            **TINY_MOE,
            norm_topk_prob=True,
            num_hidden_layers=4,
        ),
        replace(
            tiny_spec(
                "qwen3-moe-fp8",
                "Qwen3MoeConfig",
                "Qwen3-MoE, 16 experts top-2, every quantized width a multiple of 128 (hidden, head_dim, "
                "moe_intermediate) and an amax of its own in every 128x128 block: the quant oracle's FP8 blocks",
                **{**TINY_MOE, "moe_intermediate_size": 128, "num_experts": 16},
                norm_topk_prob=True,
                hidden_size=128,
                head_dim=128,
                intermediate_size=128,
            ),
            block_amax=128,
        ),
        replace(
            tiny_spec(
                "qwen3-moe-fp8-wide",
                "Qwen3MoeConfig",
                "tiny:qwen3-moe-fp8 with hidden 256 and 4 experts: the attention weights span 2 x 2 grids of "
                "128x128 blocks (the quant-import oracle's transposed-grid case)",
                **{**TINY_MOE, "moe_intermediate_size": 128, "num_experts": 4},
                norm_topk_prob=True,
                hidden_size=256,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=128,
                intermediate_size=128,
            ),
            block_amax=128,
        ),
    ),
    upstream_bugs=(NORM_TOPK_PROB_IGNORED, QWEN3_HEAD_DIM_IGNORED, QWEN3_HEAD_DIM_IGNORED_IMPORT),
)
