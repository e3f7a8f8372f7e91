"""Known megatron-bridge bugs of the 0.3.x releases' model bridges, found by `convcheck support` on the checkpoints
transformers 4.57.6 (the release's pin; bridge 0.3.x requires transformers < 5) writes from each class's default
config. Each family lists its own (Qwen3, Qwen3-MoE, Qwen3-VL, GLM-4.5, DeepSeek-V3); REGISTERED_BUGS lists Ministral
3's."""

from __future__ import annotations

from dataclasses import replace

from convcheck.models.upstream_bug import BUILD_FAILED, UpstreamBug

QWEN3_HEAD_DIM_IGNORED = UpstreamBug(
    name="qwen3-head-dim-ignored",
    summary="the 0.3.0 Qwen3 and Qwen3-MoE bridges pass no kv_channels to their providers, whose default is 128: a "
    "checkpoint whose head_dim is not 128 gets 128-wide heads (QKV, output projection, q / k norms) and the import "
    "raises on the first shape it meets (k_layernorm), so nothing is loaded",
    where="megatron/bridge/models/qwen/qwen3_bridge.py:48-67 and qwen3_moe_bridge.py:48 (no kv_channels), "
    "qwen_provider.py:266 and :373 (kv_channels = 128) in 0.3.0",
    findings=(("config", "head_dim -> kv_channels", "mismatch"),),
    consequences=(
        ("coverage", "*", "not-loaded"),
        ("*", "*", "shape"),
        ("roundtrip", "*", "bytes-differ"),
        ("logits", "logits", "logits-differ"),
        ("logits", "greedy-tokens", "greedy-differs"),
        ("layout", "*", "layout-differs"),
        ("layout", "*", "tp1-differs-from-source"),
        ("layout", "<layout>", "first-differing"),
        ("mapping", "*", "import-bytes-differ"),
        ("mapping", "*", "import-shape"),
        ("mapping", "*", "mapping-error"),
    ),
    seen_in=("0.3.0",),
    fixed_in="0.3.1 (both bridges build on the generic provider_bridge, whose CONFIG_MAPPING maps head_dim to "
    "kv_channels, conversion/model_bridge.py:251)",
)
"""Seen by `convcheck support` on bridge 0.3.0 (Qwen3ForCausalLM and Qwen3MoeForCausalLM from transformers 4.57.6's
default configs, head_dim 16 after the shrink) at TP2. Published Qwen3 checkpoints all have head_dim 128, which the
default matches. Every finding but the config mismatch follows from the import that stops at the first layer."""

QWEN3_HEAD_DIM_IGNORED_IMPORT = replace(
    QWEN3_HEAD_DIM_IGNORED,
    findings=(("*", "<import>", "import-failed"),),
    message_contains="Shape mismatch for megatron param decoder.layers.0.self_attention.k_layernorm.weight",
)
"""The same bug as the import sees it (the Qwen3-MoE row has no config finding): its own shape error only."""

QWEN3_VL_HEAD_DIM_AS_PROVIDER_FIELD = UpstreamBug(
    name="qwen3-vl-head-dim-as-provider-field",
    summary="the 0.3.0 Qwen3-VL and Qwen3-VL-MoE bridges hand text_config.head_dim to their providers' own head_dim "
    "field, which the language model never reads, and no kv_channels: the providers keep Qwen3's kv_channels 128, so "
    "a checkpoint whose head_dim is not 128 gets 128-wide heads and the import raises on the first shape it meets "
    "(k_layernorm); nothing is loaded",
    where="megatron/bridge/models/qwen_vl/qwen3_vl_bridge.py:88 and :254 (head_dim=, no kv_channels), "
    "qwen3_vl_provider.py:45 and :199 (the head_dim field), qwen/qwen_provider.py:266 and :373 (kv_channels = 128) "
    "in 0.3.0",
    findings=(("config", "text_config.head_dim -> kv_channels", "mismatch"),),
    consequences=QWEN3_HEAD_DIM_IGNORED.consequences,
    seen_in=("0.3.0",),
    fixed_in="0.3.1 (the bridges build their providers from hf_config_to_provider_kwargs(text_config), whose "
    "CONFIG_MAPPING maps head_dim to kv_channels: qwen3_vl_bridge.py:77, :198; conversion/model_bridge.py:251)",
)
"""Seen by `convcheck support` on bridge 0.3.0 (Qwen3VLForConditionalGeneration from transformers 4.57.6's default
config, head_dim 16 after the shrink, its mrope sections named under rope_scaling by a local change: bench/results/
cpu-support-bridge-0.3.0-qwen3-vl-diagnostic-2026-12-08.json) at TP2: k_layernorm built 128 wide. Published Qwen3-VL
checkpoints have head_dim 128, which the default matches."""

QWEN3_VL_HEAD_DIM_AS_PROVIDER_FIELD_IMPORT = replace(
    QWEN3_VL_HEAD_DIM_AS_PROVIDER_FIELD,
    findings=(("*", "<import>", "import-failed"),),
    message_contains="Shape mismatch for megatron param language_model.decoder.layers.0.self_attention.k_layernorm",
)
"""The same bug as the import sees it (a row whose config oracle is not covered): its own shape error only."""

GLM45_HEAD_DIM_REQUIRED = UpstreamBug(
    name="glm45-head-dim-required",
    summary="the 0.3.0 GLM-4.5 bridge reads hf_config.head_dim, a field transformers 4.57's Glm4MoeConfig does not "
    "define (published config.json files carry it as an extra key): a checkpoint whose config transformers wrote "
    "from its own class raises AttributeError and no model is built",
    where="megatron/bridge/models/glm/glm45_bridge.py:57 (0.3.0)",
    findings=BUILD_FAILED,
    message_contains="head_dim",
    seen_in=("0.3.0",),
    fixed_in="0.3.1 (the generic provider_bridge reads head_dim only where the config has it, "
    "conversion/model_bridge.py:363)",
)
"""Seen by `convcheck support` on Glm4MoeForCausalLM from transformers 4.57.6's default config, bridge 0.3.0."""

MINISTRAL3_ROPE_PARAMETERS_REQUIRED = UpstreamBug(
    name="ministral3-rope-parameters-required",
    summary="the 0.3.x Ministral 3 bridge reads text_config.rope_parameters['rope_theta'], a field only transformers "
    "5 configs have, while the release requires transformers < 5: a checkpoint whose config transformers 4.57 wrote "
    "from its own class (rope_theta at the top) raises AttributeError and no model is built",
    where="megatron/bridge/models/ministral3/ministral3_bridge.py:95 (0.3.x provider_bridge); "
    "megatron_bridge-0.3.x METADATA: Requires-Dist transformers<5.0.0",
    findings=BUILD_FAILED,
    message_contains="rope_parameters",
    seen_in=("0.3.0", "0.3.1"),
    fixed_in="0.4.0 (its transformers 5.3 writes rope_parameters; the build then stops on "
    "ministral3-llama4-scaling-beta-required)",
)
"""Seen by `convcheck support` on Mistral3ForConditionalGeneration from transformers 4.57.6's default config."""

DEEPSEEK_V3_SCORE_FUNCTION_UNSET = UpstreamBug(
    name="deepseek-v3-score-function-unset",
    summary="the 0.3.1 DeepSeek-V3 bridge turns the router's expert bias on but leaves the score function to "
    "CONFIG_MAPPING's scoring_func, a field of the remote-code config that transformers' DeepseekV3Config does not "
    "define: a checkpoint whose config transformers wrote keeps megatron-core's softmax default, which "
    "TransformerConfig refuses beside expert bias, and no model is built (0.3.0 set sigmoid itself)",
    where="megatron/bridge/models/deepseek/deepseek_v3_bridge.py:47-65 (0.3.1: expert bias on, no score function), "
    "conversion/model_bridge.py:272 (scoring_func); megatron-core transformer/transformer_config.py:1593",
    findings=BUILD_FAILED,
    message_contains="only supports sigmoid score function",
    seen_in=("0.3.1",),
    fixed_in="0.4.0 (deepseek_v3_bridge.py:65 sets moe_router_score_function = 'sigmoid')",
)
"""Seen by `convcheck support` on DeepseekV3ForCausalLM from transformers 4.57.6's default config, bridge 0.3.1, at
TP2 and EP2. Published DeepSeek-V3 config.json files (remote code) carry scoring_func 'sigmoid'."""

DEEPSEEK_KV_HEADS_AS_KV_CHANNELS = UpstreamBug(
    name="deepseek-kv-heads-as-kv-channels",
    summary="the 0.3.0 DeepSeek provider settings put num_key_value_heads into kv_channels (the per-head width) "
    "where num_query_groups was meant: the Megatron config's kv_channels is the KV head count (MLA's projections "
    "read qk_head_dim, qk_pos_emb_head_dim and v_head_dim and hand them to TE's attention, so the weights are "
    "unaffected; megatron-core's local DotProductAttention sizes its output by kv_channels)",
    where="megatron/bridge/models/deepseek/common.py:51 (0.3.0)",
    findings=(("config", "head_dim -> kv_channels", "mismatch"),),
    seen_in=("0.3.0",),
    fixed_in="0.3.1 (common.py:51 sets num_query_groups)",
)
"""Seen by `convcheck support` on DeepseekV3ForCausalLM from transformers 4.57.6's default config, bridge 0.3.0, at
TP2 and EP2: kv_channels 4 (its num_key_value_heads) for head_dim 16."""
