"""Gemma 4 text, the MoE variant (Gemma4ForCausalLM, model_type gemma4_text, enable_moe_block true: 26B-A4B): tiny
fixture and the bridge bugs convcheck names. The bridge builds it with Gemma4ModelProvider on megatron-core's TE MoE
spec patched by `_gemma4_block_spec` (megatron-bridge 0.6.2 gemma/modeling_gemma4.py:1517): the router's scaleless
norm, scale and per-expert scale (Gemma4TopKRouter, :1375), the dense MLP beside the experts as the MoE layer's shared
expert with its own pre- and post-norm (Gemma4TransformerLayer, Gemma4MoELayer, :1276-1476). The config table rows of
both variants are one table (convcheck.models.gemma4); the mappings of both are gemma4_mappings."""

from __future__ import annotations

from dataclasses import replace

from convcheck.models.fixture_spec import TINY_SHAPES, FixtureSpec
from convcheck.models.te_spec_bugs import POST_LAYERNORM_DEFAULT_EPS

SLIDING, FULL = "sliding_attention", "full_attention"

TINY_GEMMA4_MOE = FixtureSpec(
    name="gemma4-moe",
    config_class="Gemma4TextConfig",
    description="Gemma 4 text, MoE (26B-A4B knobs): (2 sliding, 1 full) x2, window 8, head_dim 8 / 16 full, 4 KV "
    "heads sliding / 2 full, keys as values on full layers, proportional partial RoPE 0.25, 8 experts top-2 of 8 "
    "beside a dense MLP of 64, router scale and per-expert scale, sandwich norms, softcap 0.5, tied",
    config={
        **{key: value for key, value in TINY_SHAPES.items() if key != "tie_word_embeddings"},
        "num_hidden_layers": 6,
        "num_key_value_heads": 4,
        "layer_types": [SLIDING, SLIDING, FULL] * 2,
        "sliding_window": 8,
        "global_head_dim": 16,
        "num_global_key_value_heads": 2,
        "attention_k_eq_v": True,
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
        "hidden_size_per_layer_input": 0,
        "vocab_size": 128,
        "vocab_size_per_layer_input": 128,
        "enable_moe_block": True,
        "num_experts": 8,
        "top_k_experts": 2,
        "moe_intermediate_size": 8,
        "final_logit_softcapping": 0.5,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
            FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    },
    near_one_tensors=("router.scale", "router.per_expert_scale"),
)
"""The published 26B-A4B (30 layers as (5 sliding, 1 full) x5, window 1024, 16 heads, 8 KV heads of 256 on the
sliding layers and 2 of 512 on the full ones, keys as values there, 128 experts top-8 of 704 beside a dense MLP of
2112, no per-layer inputs, no KV sharing, softcap 30, tied, vocabulary 262144) shrunk: six layers in two
(sliding, sliding, full) periods (the bridge's MoE provider reads layer_types as one (sliding, full) period,
gemma4_bridge.py:83), 8 experts top-2. The softcap is 0.5 for tiny:gemma4's reason (the logits oracle sees it). The
router's scale and per-expert scale are drawn from [0.5, 2) as trained ones are near one (the routing weights they
multiply stay of the order of one)."""


MOE_POST_LAYERNORM_DEFAULT_EPS = replace(
    POST_LAYERNORM_DEFAULT_EPS,
    where="megatron/bridge/models/common/te_layers.py:47 (megatron-core extensions/transformer_engine.py:815, TENorm's "
    "eps default); Gemma 4 MoE's linear_proj is TERowParallelLinearLayerNorm (gemma/modeling_gemma4.py:1530)",
    config_holds=(("enable_moe_block", True),),
)
"""te-post-layernorm-default-eps on the MoE variant only (the dense variant's local spec builds its own norms): the
post-attention norm of every layer computes with TE's default 1e-5 for HF's rms_norm_eps 1e-6. Seen on tiny:gemma4-moe
at TP1: logits differ by 2.7e-4; with the post norm built with eps=config.layernorm_epsilon (the hook
tests.support.hooks_te_families:post_norm_eps_fixed) they agree to 2.2e-8."""
