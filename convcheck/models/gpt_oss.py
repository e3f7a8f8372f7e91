"""GPT-OSS (GptOssForCausalLM, model_type gpt_oss): attention with q/k/v/o biases and per-head sinks, sliding-window
attention on every other layer, yarn RoPE, and an MoE of biased experts (router bias, clamped quick-GELU GLU with
gate and up interleaved) stored fused as transformers 5 holds them.

megatron-bridge 0.6.2 models/gpt_oss/gpt_oss_bridge.py builds it as a GPTModel with softmax_type "learnable" (the
sinks are core_attention.softmax_offset), window_attn_skip_freq 2 and moe_ffn_hidden_size = intermediate_size.
"""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.fixture_spec import FixtureSpec, engine_variant
from convcheck.models.gpt_oss_config import GPT_OSS_TABLE
from convcheck.models.upstream_bug import UpstreamBug

GPT_OSS_SHAPES: dict[str, Any] = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_hidden_layers": 4,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 152,
    "sliding_window": 4,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
"""Four layers (sliding, full, sliding, full: PP2 keeps both kinds per stage), 8 experts top-2 (EP2 and TP2xEP2 legal),
a 4-token window, so the window changes the logits oracle's 16-token logits."""

PUBLISHED: dict[str, Any] = {
    "attention_bias": True,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "swiglu_limit": 7.0,
}
"""As openai/gpt-oss-20b's config.json holds them (its rope_scaling spelt as transformers 5's rope_parameters)."""


def gpt_oss_spec(name: str, description: str, **overrides: Any) -> FixtureSpec:
    """A GPT-OSS fixture: GPT_OSS_SHAPES with the published knobs, `overrides` on top."""
    config = {**GPT_OSS_SHAPES, **PUBLISHED, **overrides}
    return FixtureSpec(name=name, config_class="GptOssConfig", description=description, config=config)


TINY_GPT_OSS = gpt_oss_spec(
    "gpt-oss",
    "GPT-OSS: sinks, q/k/v/o biases, sliding window 4 on every other layer, yarn RoPE, 8 biased experts top-2 stored "
    "fused with gate/up interleaved; intermediate 8 (no expert tensor is square)",
    intermediate_size=8,
)

TINY_GPT_OSS_SQUARE = gpt_oss_spec(
    "gpt-oss-square",
    "GPT-OSS with intermediate == hidden == 16, as both published sizes are: each expert's down_proj is square, so "
    "its orientation shows only in the values",
    hidden_size=16,
    intermediate_size=16,
)
TINY_GPT_OSS_VLLM = engine_variant(
    TINY_GPT_OSS,
    "tiny:gpt-oss with hidden 64, head_dim 32 and expert width 32, which CPU vLLM's kernels accept",
    hidden_size=64,
    head_dim=32,
    intermediate_size=32,
)

SLIDING_WINDOW_EXPORT = UpstreamBug(
    name="gpt-oss-sliding-window-export",
    summary="megatron_to_hf_config does not write sliding_window (the provider's window_size is (W - 1, 0)), so an "
    "exported config.json falls back to GptOssConfig's default 128 and a model with another window is rebuilt "
    "with the wrong one",
    where="megatron/bridge/models/gpt_oss/gpt_oss_bridge.py:56-104 (no megatron_to_hf_config; the generic one, "
    "conversion/model_bridge.py:453 table, has no sliding_window)",
    findings=(("config", "sliding_window (megatron_to_hf_config)", "roundtrip-mismatch"),),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
    fixed_in="",
)
"""#4800 (bf4eaa30a) added the export, but #4982 (78ee7ac5b, the revert of GPT-OSS's HybridModel migration) dropped
its GPT-OSS part before v0.6.0; megatron-bridge main (c335a9954, 2026-08-22) still lacks it."""

ATTENTION_BIAS_EXPORT = UpstreamBug(
    name="gpt-oss-attention-bias-export",
    summary="the provider sets add_qkv_bias False (the q/k/v biases come from add_bias_linear) and the generic "
    "megatron_to_hf_config exports attention_bias from add_qkv_bias: an exported config.json says attention_bias "
    "false, so transformers builds attention without the q/k/v/o biases the exported weights hold",
    where="megatron/bridge/models/gpt_oss/gpt_oss_bridge.py:63 with conversion/model_bridge.py:453",
    findings=(("config", "attention_bias (megatron_to_hf_config)", "roundtrip-mismatch"),),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
    fixed_in="not in a release; main 365a51fb4 (in #5397, 8a84d7166: add_qkv_bias from attention_bias and "
    "megatron_to_hf_config writing attention_bias true)",
)

WINDOW_OFF_BY_ONE = UpstreamBug(
    name="gpt-oss-window-hardcoded-128",
    summary="window_size is the constant (128, 0) whatever sliding_window says: one key more than HF's 128-token "
    "window on the published models, and the wrong window on any other",
    where="megatron/bridge/models/gpt_oss/gpt_oss_bridge.py provider_bridge and gpt_oss_provider.py:77 (0.3.x)",
    findings=(
        ("config", "sliding_window -> window_size", "mismatch"),
        ("logits", "logits", "logits-differ"),
        ("logits", "greedy-tokens", "greedy-differs"),
    ),
    seen_in=("0.3.1",),
    fixed_in="0.4.0 (#2656, 5fcab34f8: (sliding_window - 1, 0))",
)
"""Seen on 0.3.1 (the release smoke: logits differ); 0.3.0's GPT-OSS provider cannot be built without Transformer
Engine (gpt_oss_provider.py:87 compares get_te_version(), None, with a Version: exit 2)."""

CONFIG_EXPORT_RAISES = UpstreamBug(
    name="gpt-oss-config-export-raises",
    summary="megatron_to_hf_config raises on the provider's quick_gelu activation, which the activation map lacks: "
    "no config.json can be exported",
    where="megatron/bridge/models/conversion/model_bridge.py:424 (0.4.2, megatron_to_hf_activation)",
    findings=(("config", "<megatron_to_hf_config>", "roundtrip-failed"),),
    seen_in=("0.3.1", "0.4.0", "0.4.1", "0.4.2"),
    fixed_in="0.5.0 (#3696, 146bf52a0: quick_gelu in ACTIVATION_FUNC_MAP)",
)

TINY_GPT_OSS_2F_HIDDEN = gpt_oss_spec(
    "gpt-oss-2f-hidden",
    "GPT-OSS with 2 x intermediate == hidden (16, 32) and 4 experts: each expert's gate_up_proj [hidden, 2F] is "
    "square, so its orientation shows only in the values",
    intermediate_size=16,
    num_local_experts=4,
)

GATE_UP_SQUARE_ORIENTATION = UpstreamBug(
    name="gpt-oss-gate-up-square-orientation",
    summary="GPTOSSMLPGateUpProjMapping aligns each expert's gate_up_proj [hidden, 2F] to fc1 [2F, hidden] by shape; "
    "where 2 x intermediate == hidden the shapes agree, the slice is kept untransposed and de-interleaved along "
    "hidden: every expert's fc1 is wrong on import and the export does not restore the source",
    where="megatron/bridge/models/gpt_oss/gpt_oss_bridge.py:300 with conversion/param_mapping.py:2891 "
    "(_align_expert_weight_to_shape returns a tensor whose shape already matches)",
    findings=(
        ("roundtrip", "model.layers.*.mlp.experts.gate_up_proj", "bytes-differ"),
        ("layout", "model.layers.*.mlp.experts.gate_up_proj", "tp1-differs-from-source"),
        ("save", "model.layers.*.mlp.experts.gate_up_proj", "bytes-differ"),
    ),
    seen_in=("0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
    fixed_in="",
)
"""Only the fused tensor's findings are tagged: the mapping oracle's per-expert fc1 findings and the logits are the same
names a planted interleave bug gives on any GPT-OSS fixture, so they stay untagged. Published GPT-OSS (hidden ==
intermediate) is not affected. Source: in every release from 0.4.0 (the shape-based alignment #2685 brought,
ae1bec45a) and on megatron-bridge main c335a9954; 0.3.x transposed every 3-D expert tensor on load instead."""

GPT_OSS = Architecture(
    hf_classes=("GptOssForCausalLM",),
    model_type="gpt_oss",
    mapping_rules="convcheck.models.gpt_oss_mappings:gpt_oss_rules",
    config_rules=GPT_OSS_TABLE,
    fixtures=(TINY_GPT_OSS, TINY_GPT_OSS_SQUARE, TINY_GPT_OSS_2F_HIDDEN, TINY_GPT_OSS_VLLM),
    upstream_bugs=(
        SLIDING_WINDOW_EXPORT,
        ATTENTION_BIAS_EXPORT,
        GATE_UP_SQUARE_ORIENTATION,
        WINDOW_OFF_BY_ONE,
        CONFIG_EXPORT_RAISES,
    ),
)
