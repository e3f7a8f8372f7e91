"""DeepSeek-V3-style models (multi-latent attention, dense-first layers, routed + shared experts with a sigmoid router
and an fp32 expert bias, MTP): DeepSeek-V3 and the Moonlight / DeepSeek-V2-Lite shape (no q LoRA).

The tiny fixtures build and run every generic oracle through the real bridge on CPU (convcheck.compat shims 15-18).
convcheck has no explicit mappings and no config table for these families yet: the mapping and config oracles report
`not-covered`, never a pass."""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.fixture_spec import FixtureSpec

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
DEEPSEEK_V3 = Architecture(
    hf_classes=("DeepseekV3ForCausalLM",),
    model_type="deepseek_v3",
    mapping_rules=None,
    config_rules=(),
    fixtures=(TINY_DEEPSEEK_V3, TINY_MOONLIGHT),
)
