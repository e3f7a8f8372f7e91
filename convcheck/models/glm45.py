"""GLM-4.5 / 4.6 (Glm4MoeForCausalLM, model_type glm4_moe): GQA attention with q/k/v biases and optional q / k norms,
partial RoPE, dense-first MoE layers with a shared expert, a sigmoid router with an fp32 expert bias (noaux_tc), and
MTP layers stored as `model.layers.{L + k}`.

The bridge (megatron-bridge 0.6.2 glm/glm45_bridge.py) builds a GPTModel with megatron-core's decoder block spec
(dense-first layers from first_k_dense_replace); it reads the routed experts per expert or fused, whichever the
checkpoint holds (glm45_bridge.py:311-316). The explicit mappings are in `glm45_mappings.py`.
"""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.bridge03_bugs import GLM45_HEAD_DIM_REQUIRED
from convcheck.models.config_rules import FieldRule, implied, same
from convcheck.models.deepseek import DEEPSEEK_V3_TABLE, group_scores_rule
from convcheck.models.deepseek import MTP_ALIASES_DROPPED as DEEPSEEK_MTP_ALIASES_DROPPED
from convcheck.models.dense import NORM_ROPE_ACT, SHAPES
from convcheck.models.fixture_spec import FixtureSpec, engine_variant
from convcheck.models.upstream_bug import UpstreamBug

GLM45_SHAPES: dict[str, Any] = {
    "vocab_size": 152,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 12,
    "intermediate_size": 64,
    "moe_intermediate_size": 20,
    "num_hidden_layers": 4,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 4,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "attention_bias": True,
    "partial_rotary_factor": 0.5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
"""The published GLM-4.5 / 4.5-Air structure (head_dim apart from hidden / heads as published: 12 x 4 heads = 48 !=
32; q/k/v biases; partial rotary 0.5; one dense layer first, then MoE; ungrouped routing; one MTP layer) at widths
that all differ (hidden 32, q 48, kv 24, dense ffn 64, expert ffn 20, vocab 152); 4 layers so PP2 splits evenly."""

TINY_GLM45 = FixtureSpec(
    name="glm4.5",
    config_class="Glm4MoeConfig",
    description="GLM-4.5: GQA with q/k/v bias and q/k norms, partial RoPE 0.5, dense-first, 8 routed + 1 shared "
    "expert, sigmoid routing (scale 2.5), 1 MTP layer; per-expert tensors as save_pretrained writes them",
    config={**GLM45_SHAPES, "use_qk_norm": True, "routed_scaling_factor": 2.5},
    fp32_tensors=("e_score_correction_bias",),
    mtp_layers=1,
)
TINY_GLM45_AIR = FixtureSpec(
    name="glm4.5-air",
    config_class="Glm4MoeConfig",
    description="GLM-4.5-Air: GQA with q/k/v bias, no q/k norms, partial RoPE 0.5, dense-first, 8 routed + 1 "
    "shared expert, sigmoid routing, 1 MTP layer; experts stored fused (gate_up_proj / down_proj), the bridge's "
    "other expert path",
    config={**GLM45_SHAPES, "use_qk_norm": False, "routed_scaling_factor": 1.0, "moe_intermediate_size": 8},
    fp32_tensors=("e_score_correction_bias",),
    mtp_layers=1,
    packed_experts=True,
)
"""Expert width 8 so the fused gate_up_proj [8, 16, 32] holds at most 5120 distinct values."""

GLM45_MODELING = "modeling_glm4_moe.py"

_FROM_DEEPSEEK = {
    "n_routed_experts -> num_moe_experts",
    "num_experts_per_tok -> moe_router_topk",
    "moe_intermediate_size -> moe_ffn_hidden_size",
    "n_shared_experts -> moe_shared_expert_intermediate_size",
    "first_k_dense_replace -> moe_layer_freq",
    "routed_scaling_factor -> moe_router_topk_scaling_factor",
    "<implied> -> moe_router_score_function",
    "<implied> -> moe_router_enable_expert_bias",
    "norm_topk_prob -> moe_router_score_function",
    "num_nextn_predict_layers -> mtp_num_layers",
}
"""DeepSeek-V3's MoE / MTP rules that hold for Glm4MoeConfig as they are (same fields, same HF routing code)."""

GROUP_FIELDS = (("n_group", "moe_router_num_groups"), ("topk_group", "moe_router_group_topk"))


def _ungrouped(value: Any) -> Any:
    """One expert group (or none given) is ungrouped routing: both spell it None."""
    return None if value in (None, 1) else value


def _ungrouped_as_none(hf: str, megatron: str) -> FieldRule:
    """Group-limited routing, with 1 and None both meaning ungrouped (published GLM-4.5 configs say 1; megatron-bridge
    0.3.x's GLM provider leaves the Megatron fields None, 0.4.0 on copy the 1)."""
    return FieldRule(
        megatron=megatron,
        hf=(hf,),
        expect=lambda c, _m: _ungrouped(c.get(hf)),
        observe=lambda value, _m: _ungrouped(value),
        note="HF limits the top-k to the best topk_group of n_group groups; one group routes over all experts",
    )


GLM45_TABLE = (
    *SHAPES,
    *NORM_ROPE_ACT,
    same("attention_bias", "add_qkv_bias", note="q/k/v projections carry a bias (o_proj never does)"),
    implied("add_bias_linear", False, "GLM-4.5 o_proj, MLP and experts have no bias"),
    same("use_qk_norm", "qk_layernorm", note=f"q_norm / k_norm over head_dim ({GLM45_MODELING}:217-220)"),
    *(rule for rule in DEEPSEEK_V3_TABLE if rule.label in _FROM_DEEPSEEK),
    *(_ungrouped_as_none(hf, megatron) for hf, megatron in GROUP_FIELDS),
    group_scores_rule(f"{GLM45_MODELING}:392-402"),
    FieldRule(
        megatron="moe_router_dtype",
        expect=lambda _c, _m: "fp32",
        note=f"HF routes in float32 (router logits from fp32 weights and inputs, {GLM45_MODELING}:303)",
    ),
)
"""The config oracle's table for model_type glm4_moe (every field of a Glm4MoeConfig)."""
TINY_GLM45_VLLM = engine_variant(
    TINY_GLM45,
    "tiny:glm4.5 with hidden 64, head_dim 32 and expert width 32, which CPU vLLM's kernels accept (1 MTP layer)",
    hidden_size=64,
    head_dim=32,
    moe_intermediate_size=32,
)

MTP_ALIASES_DROPPED = UpstreamBug(
    name="glm45-mtp-aliases-dropped",
    summary="the GLM-4.5 bridge's export never writes the MTP layer's embed_tokens / shared_head.head, the copies of "
    "model.embed_tokens and lm_head that a GLM MTP checkpoint holds (the GLM-4.7-Flash bridge restores them, "
    "glm47_flash_bridge.py:116; the GLM-4.5 bridge has no such hook)",
    where="megatron/bridge/models/glm/glm45_bridge.py:280-300 (MTP mappings without the aliases, no "
    "maybe_modify_converted_hf_weight)",
    findings=DEEPSEEK_MTP_ALIASES_DROPPED.findings,
    seen_in=("0.3.0", "0.3.1", "0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Still on megatron-bridge main (067f987df, 2026-08-22); glm45_bridge.py is the same file in 0.5.0-0.6.2. Published
GLM-4.5 holds both copies in layer 92 (vLLM's deepseek_mtp drafter loads them from GLM-4.5 and names them missing
from GLM-4.6, which publishes none): a checkpoint without them gets no finding, the export matching its source."""

SEQUENTIAL_EXPERTS_UNMAPPED = UpstreamBug(
    name="glm45-sequential-experts-unmapped",
    summary="the GLM-4.5 bridge maps routed experts only in the grouped layout (experts.linear_fc*.weight*), not as "
    "SequentialMLP local_experts (what moe_grouped_gemm=False or a build without TE gives), in the decoder and the "
    "MTP layer; load_hf_weights and export_hf_weights crash on the empty conversion tasks",
    where="megatron/bridge/models/glm/glm45_bridge.py:166-192 (decoder), :238-278 (MTP); the crash at "
    "conversion/model_bridge.py:1100 (load) and :1340 (export)",
    findings=(("coverage", "*.mlp.experts.local_experts.*.linear_fc*.weight", "unmapped"),),
    consequences=(
        ("*", "<import>", "import-failed"),
        ("*", "<export>", "export-failed"),
    ),
    seen_in=("0.6.2",),
)
"""Every other finding of such a run follows from the two crashes (nothing is loaded or exported). No release maps
local_experts for GLM-4.5 (0.3.0's glm45_bridge.py:111-159 neither); still so on megatron-bridge main (067f987df)."""

MTP_FORWARD_NEEDS_LABELS = UpstreamBug(
    name="mtp-forward-needs-labels",
    summary="megatron-core 0.16's GPTModel.forward clones the labels whenever MTP layers exist, so a model with MTP "
    "cannot run an inference forward (no labels): the logits oracle's forward raises",
    where="megatron-core 0.16.x megatron/core/models/gpt/gpt_model.py:612 (mtp_labels = labels.clone())",
    findings=(("logits", "<megatron forward>", "forward-failed"),),
    seen_in=("0.3.0", "0.3.1"),
    fixed_in="megatron-core 0.17.0 (bridge 0.4.0): the forward runs without labels",
)

GLM45 = Architecture(
    hf_classes=("Glm4MoeForCausalLM",),
    model_type="glm4_moe",
    mapping_rules="convcheck.models.glm45_mappings:glm45_rules",
    config_rules=GLM45_TABLE,
    fixtures=(TINY_GLM45, TINY_GLM45_AIR, TINY_GLM45_VLLM),
    upstream_bugs=(MTP_ALIASES_DROPPED, SEQUENTIAL_EXPERTS_UNMAPPED, MTP_FORWARD_NEEDS_LABELS, GLM45_HEAD_DIM_REQUIRED),
)
