"""Known megatron-bridge bugs of architectures whose bridge spec exists only on Transformer Engine
(convcheck.models.te_only) and that convcheck has no explicit mappings or config table for; keyed by HF class.
`convcheck.models.tag_upstream_bugs` reads them beside each family's own."""

from __future__ import annotations

from convcheck.models.upstream_bug import WRONG_DTYPE, UpstreamBug

POST_LAYERNORM_DEFAULT_EPS = UpstreamBug(
    name="te-post-layernorm-default-eps",
    summary="TERowParallelLinearLayerNorm builds its post norm as TENorm(config, output_size) without eps, so TE's "
    "default 1e-5 replaces the model's layernorm_epsilon (Gemma 3's rms_norm_eps 1e-6): the post-attention and "
    "post-MLP RMSNorms of every layer compute with another epsilon than HF's (import, export and mappings agree; the "
    "forward differs)",
    where="megatron/bridge/models/common/te_layers.py:47 (0.4.2 / 0.5.1: gemma/gemma2_provider.py:272, "
    "gemma3_provider.py:425 / :359; 0.3.x: gemma2_provider.py:272, gemma3_provider.py:426) (megatron-core "
    "extensions/transformer_engine.py:815, "
    "TENorm's eps default); used by Gemma 2 / Gemma 3 (gemma3_provider.py:163, :168) and EXAONE 4",
    findings=(("logits", "logits", "logits-differ"), ("logits", "greedy-tokens", "greedy-differs")),
    seen_in=("0.3.0", "0.3.1", "0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen on a tiny Gemma3ForCausalLM written by transformers 5.12.1 (rms_norm_eps 1e-6) at TP1 and TP2: with the post
norms built with eps=config.layernorm_epsilon the logits agree with HF's to 9e-7 (tests/test_te_families.py). Seen by
`convcheck support` on Gemma2ForCausalLM from transformers' default Gemma2Config at TP2: logits differ by 5.1e-4, and
with the same fix (tests/support/hooks_te_families.py:post_norm_eps_fixed) agree to 1.2e-6; on
Gemma3ForConditionalGeneration (its language model built from the same spec) at TP2: 3.6e-4, and 2.5e-6 with the fix."""

QWEN3_VL_DTYPE_FROM_TEXT_CONFIG = UpstreamBug(
    name="qwen3-vl-dtype-from-text-config",
    summary="the Qwen3-VL bridges read params_dtype from text_config alone, where transformers keeps the "
    "checkpoint's dtype on the top-level config only (transformers 5's save_pretrained writes no text_config dtype, "
    "nor does 4.57's for a text_config that names none): a bf16 checkpoint builds an fp32 model and exports every "
    "tensor as fp32",
    where="megatron/bridge/models/qwen_vl/qwen3_vl_bridge.py:73, :232 (hf_config_to_provider_kwargs(text_config)); "
    "conversion/model_bridge.py:621 (dtype_from_hf, default float32); 0.3.0: qwen3_vl_bridge.py:73, :240 "
    "(dtype_from_hf(text_config, default=torch.float32)), model_bridge.py:726",
    findings=WRONG_DTYPE,
    seen_in=("0.3.0", "0.4.0", "0.4.1", "0.4.2", "0.6.2"),
)
"""Seen on tiny Qwen3-VL and Qwen3-VL-MoE checkpoints written by transformers 5.12.1's save_pretrained (bf16); the
mapping oracle (convcheck.models.qwen3_vl's explicit mappings) sees every fp32 shard against the bf16 checkpoint.
convcheck's tiny:qwen3-vl fixtures repeat the dtype in text_config, as published checkpoints do."""

TE_SPEC_BUGS: dict[str, tuple[UpstreamBug, ...]] = {
    "Gemma2ForCausalLM": (POST_LAYERNORM_DEFAULT_EPS,),
    "Qwen3VLForConditionalGeneration": (QWEN3_VL_DTYPE_FROM_TEXT_CONFIG,),
    "Qwen3VLMoeForConditionalGeneration": (QWEN3_VL_DTYPE_FROM_TEXT_CONFIG,),
}
"""HF class -> the known bugs its runs show (architectures without a convcheck.models family)."""
