"""Known megatron-bridge and transformers bugs found by `convcheck support` (tiny checkpoints written by transformers
from each class's default config). REGISTERED_BUGS, keyed by HF class, holds those of architectures convcheck has no
family for (`convcheck.models.tag_upstream_bugs` reads them beside TE_SPEC_BUGS); a family's (NemotronH's) is listed
in its Architecture."""

from __future__ import annotations

from convcheck.models.bridge03_bugs import MINISTRAL3_ROPE_PARAMETERS_REQUIRED
from convcheck.models.ernie_vl_bugs import ERNIE45_VL_BUGS
from convcheck.models.upstream_bug import BUILD_FAILED, WRONG_DTYPE, UpstreamBug

DEEPSEEK_V4_ROPE_NEEDS_YARN = UpstreamBug(
    name="deepseek-v4-rope-needs-yarn",
    summary="the DeepSeek-V4 bridge reads rotary_scaling_factor and original_max_position_embeddings from the "
    "compress rope parameters unconditionally: a config whose rope is not YaRN (transformers' own DeepseekV4Config "
    "default, rope_type 'default') raises KeyError 'factor' and no model is built",
    where="megatron/bridge/models/deepseek/deepseek_v4_bridge.py:441 (and :442-444)",
    findings=BUILD_FAILED,
    message_contains="'factor'",
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on DeepseekV4ForCausalLM built from transformers 5.12.1's default config."""

EXAONE4_UNTIED_LM_HEAD_UNMAPPED = UpstreamBug(
    name="exaone4-untied-lm-head-unmapped",
    summary="the EXAONE 4 bridge maps no lm_head.weight (it assumes tied embeddings); with tie_word_embeddings false "
    "(transformers' Exaone4Config default) output_layer.weight has no mapping, its conversion task stays None and "
    "load_hf_weights / export_hf_weights raise AttributeError on it: nothing is loaded or exported",
    where="megatron/bridge/models/exaone/exaone4/exaone4_bridge.py:176 (no lm_head mapping); "
    "conversion/model_bridge.py:1762-1764 (a parameter without mapping leaves its task None), :1100 and :1340 (the "
    "None task dereferenced)",
    findings=(
        ("coverage", "output_layer.weight", "unmapped"),
        ("coverage", "decoder.*", "not-loaded"),
        ("coverage", "output_layer.weight", "not-loaded"),
        ("coverage", "model.*", "not-exported"),
        ("coverage", "lm_head.weight", "not-exported"),
        ("roundtrip", "*", "missing"),
        ("layout", "*", "missing"),
        ("elements", "lm_head.weight", "never-written"),
        ("logits", "logits", "logits-differ"),
        ("logits", "greedy-tokens", "greedy-differs"),
    ),
    consequences=(
        ("*", "<import>", "import-failed"),
        ("*", "<export>", "export-failed"),
        ("layout", "<export>", "tp1-export-failed"),
    ),
    seen_in=(
        "0.6.0",
        "0.6.2",
    ),
)
"""Seen by `convcheck support` on Exaone4ForCausalLM built from transformers 5.12.1's default config (untied)."""

GLM45V_HEAD_DIM_REQUIRED = UpstreamBug(
    name="glm45v-head-dim-required",
    summary="the GLM-4.5V bridge reads text_config.head_dim, a field transformers' Glm4vMoeTextConfig does not "
    "define (published config.json files carry it as an extra key): a checkpoint whose config transformers wrote "
    "from its own class raises AttributeError and no model is built",
    where="megatron/bridge/models/glm_vl/glm_45v_bridge.py:51 (:47 in 0.3.x, whose transformers 4.57.6 "
    "Glm4vMoeTextConfig lacks it too)",
    findings=BUILD_FAILED,
    message_contains="head_dim",
    seen_in=("0.3.0", "0.3.1", "0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on Glm4vMoeForConditionalGeneration built from transformers 5.12.1's default config."""

GLM5_INDEXER_ROPE_INTERLEAVE_REQUIRED = UpstreamBug(
    name="glm5-indexer-rope-interleave-required",
    summary="the GLM-5 (GlmMoeDsa) bridge reads hf_config.indexer_rope_interleave, a field transformers' "
    "GlmMoeDsaConfig does not define: a checkpoint whose config transformers wrote from its own class raises "
    "AttributeError and no model is built",
    where="megatron/bridge/models/glm_moe_dsa/glm5_bridge.py:135",
    findings=BUILD_FAILED,
    seen_in=(
        "0.6.0",
        "0.6.2",
    ),
    message_contains="indexer_rope_interleave",
)
"""Seen by `convcheck support` on GlmMoeDsaForCausalLM built from transformers 5.12.1's default config; listed in the
GLM-5 family (convcheck.models.glm5), tagging only a build failure that names the field."""

HYV3_FIRST_K_DENSE_REQUIRED = UpstreamBug(
    name="hy-v3-first-k-dense-required",
    summary="the HY-V3 bridge reads hf_config.first_k_dense_replace, a field transformers' HYV3Config does not "
    "define: a checkpoint whose config transformers wrote from its own class raises AttributeError and no model is "
    "built",
    where="megatron/bridge/models/hy_v3/hy_v3_bridge.py:98",
    findings=BUILD_FAILED,
    message_contains="first_k_dense_replace",
    seen_in=(
        "0.6.0",
        "0.6.2",
    ),
)
"""Seen by `convcheck support` on HYV3ForCausalLM built from transformers 5.12.1's default config."""

MINISTRAL3_LLAMA4_SCALING_BETA_REQUIRED = UpstreamBug(
    name="ministral3-llama4-scaling-beta-required",
    summary="the Ministral 3 attention reads text_config.rope_parameters['llama_4_scaling_beta'] unconditionally: a "
    "config without Llama-4 attention scaling (transformers' Mistral3Config default) raises KeyError while the "
    "model is built",
    where="megatron/bridge/models/ministral3/ministral3_provider.py:205",
    findings=BUILD_FAILED,
    message_contains="llama_4_scaling_beta",
    seen_in=("0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on Mistral3ForConditionalGeneration built from transformers 5.12.1's default config."""

ERNIE45_SIGMOID_ROUTER = UpstreamBug(
    name="ernie45-moe-sigmoid-router",
    summary="the ERNIE 4.5 MoE bridge sets moe_router_score_function 'sigmoid' (\"same as DeepSeek V3\"), where "
    "transformers' Ernie4_5_MoeTopKRouter takes a softmax over the experts, picks the top k and renormalizes them: "
    "Megatron weighs each token's experts by normalized sigmoids instead of the renormalized softmax (2.8e-2 apart "
    "on random router logits; 'softmax' with pre-softmax off gives HF's weights to 6e-8)",
    where="megatron/bridge/models/ernie/ernie_45_bridge.py:225; transformers models/ernie4_5_moe/"
    "modeling_ernie4_5_moe.py:370-376 (the softmax routing)",
    findings=(("logits", "logits", "logits-differ"), ("logits", "greedy-tokens", "greedy-differs")),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on Ernie4_5_MoeForCausalLM built from transformers 5.12.1's default config (logits
9.6e-4 apart at TP2); tests/test_upstream_bugs.py recomputes both routings."""

ERNIE45_ROUTER_GATE_BF16 = UpstreamBug(
    name="ernie45-router-gate-bf16",
    summary="transformers keeps the ERNIE 4.5 MoE router gate.weight in float32 (_keep_in_fp32_modules_strict) and "
    "writes it so; the bridge loads it into megatron-core's TopKRouter weight, which megatron-core casts to "
    "params_dtype (bf16), and exports that: the gate comes back bf16-rounded, dtype bfloat16 where the checkpoint "
    "holds float32 (the MiniMax-M3 bridge promotes its routers to fp32 for this; the ERNIE one does not)",
    where="megatron/bridge/models/ernie/ernie_45_bridge.py:322-325 (the router mapping, no fp32 kept); megatron-core "
    "transformer/moe/router.py:81 (the weight cast to params_dtype); transformers models/ernie4_5_moe/"
    "modeling_ernie4_5_moe.py:482",
    findings=(
        ("roundtrip", "model.layers.*.mlp.gate.weight", "dtype"),
        ("layout", "model.layers.*.mlp.gate.weight", "tp1-differs-from-source"),
    ),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on Ernie4_5_MoeForCausalLM written by transformers 5.12.1 (the gate float32)."""

MINIMAX_M3_FP32_EXPORT = UpstreamBug(
    name="minimax-m3-fp32-params-exported-fp32",
    summary="the MiniMax-M3 bridge keeps the routers' weights and the vision patch embedding in float32 inside "
    "Megatron and exports them in float32 whatever dtype the checkpoint holds them in: a checkpoint written by "
    "transformers (whose MiniMaxM3 class keeps no module in fp32: bf16 throughout, as the bridge says the released "
    "ones are) comes back with these tensors float32 (the values an exact upcast, the dtype and bytes not the "
    "checkpoint's)",
    where="megatron/bridge/models/minimax_m3/minimax_m3_bridge.py:99-112 and :134 (routers promoted to fp32), "
    "modeling_minimax_m3_vl.py:80 (patch embedding kept fp32); :399-402 (released checkpoints bf16)",
    findings=(
        ("roundtrip", "language_model.model.layers.*.block_sparse_moe.gate.weight", "dtype"),
        ("roundtrip", "vision_tower.vision_model.embeddings.patch_embedding.weight", "dtype"),
        ("layout", "language_model.model.layers.*.block_sparse_moe.gate.weight", "tp1-differs-from-source"),
        ("layout", "vision_tower.vision_model.embeddings.patch_embedding.weight", "tp1-differs-from-source"),
    ),
    seen_in=(
        "0.6.0",
        "0.6.2",
    ),
)
"""Seen by `convcheck support` on MiniMaxM3SparseForConditionalGeneration written by transformers 5.12.1 (bf16)."""

GEMMA3_VL_POOLING_HEAD_DROPPED = UpstreamBug(
    name="gemma3-vl-pooling-head-dropped",
    summary="the Gemma 3 VL bridge sets vision_config.vision_use_head False whatever the checkpoint holds; a "
    "checkpoint whose SigLIP config names no vision_use_head (transformers' Gemma3Config default) has the pooling "
    "head (transformers builds it then, modeling_siglip.py:572), and the bridge neither loads nor exports its "
    "vision_tower.head.* tensors: the export drops them",
    where="megatron/bridge/models/gemma_vl/gemma3_vl_bridge.py:86, modeling_gemma3_vl.py:97; transformers "
    "models/siglip/modeling_siglip.py:572",
    findings=(
        ("coverage", "vision_tower.*head.*", "not-exported"),
        ("roundtrip", "vision_tower.*head.*", "missing"),
        ("elements", "vision_tower.*head.*", "never-written"),
        ("layout", "vision_tower.*head.*", "missing"),
        ("mapping", "vision_tower.*head.*", "uncovered"),
        ("config", "vision_config.vision_use_head -> model.vision_tower", "mismatch"),
    ),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on Gemma3ForConditionalGeneration built from transformers 5.12.1's default config, and on
the published gemma-3-4b-it config shrunk without its vision_use_head (the head's 11 tensors, named
`vision_tower.vision_model.head.*` as published checkpoints name them; the config table's head rule)."""

FALCON_H1_NORM_BEFORE_GATE = UpstreamBug(
    name="falcon-h1-norm-before-gate-unsupported",
    summary="the Falcon-H1 bridge passes mamba_norm_before_gate (True in transformers' FalconH1Config default) to "
    "megatron-core's MambaMixer, which asserts it False (it has no norm-before-gate path): the build raises "
    "AssertionError and no model is built",
    where="megatron/bridge/models/falcon_h1/falconh1_bridge.py:67 (the field mapped through); megatron-core "
    "ssm/mamba_mixer.py:276 (assert not self.norm_before_gate)",
    findings=BUILD_FAILED,
    message_contains="FalconH1MambaMixer",
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on FalconH1ForCausalLM built from transformers 5.12.1's default config."""

QWEN25_OMNI_TALKER_TOKEN2WAV_DROPPED = UpstreamBug(
    name="qwen25-omni-talker-token2wav-dropped",
    summary="the Qwen2.5-Omni bridge converts the thinker only: its mappings name no talker.* or token2wav.* tensor, "
    "so the export of a Qwen2.5-Omni checkpoint lacks the speech talker and the token-to-wave decoder (557 tensors "
    "of the tiny checkpoint)",
    where="megatron/bridge/models/qwen_omni/qwen25_omni_bridge.py:97 (mapping_registry: thinker.* only)",
    findings=(
        ("coverage", "talker.*", "not-exported"),
        ("coverage", "token2wav.*", "not-exported"),
        ("roundtrip", "talker.*", "missing"),
        ("roundtrip", "token2wav.*", "missing"),
        ("elements", "talker.*", "never-written"),
        ("elements", "token2wav.*", "never-written"),
        ("layout", "talker.*", "missing"),
        ("layout", "token2wav.*", "missing"),
    ),
    seen_in=("0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on Qwen2_5OmniForConditionalGeneration built from transformers 5.12.1's default
config."""

QWEN3_OMNI_TALKER_CODE2WAV_DROPPED = UpstreamBug(
    name="qwen3-omni-talker-code2wav-dropped",
    summary="the Qwen3-Omni bridge converts the thinker only (it says so in a warning when enable_audio_output is "
    "set): its mappings name no talker.* or code2wav.* tensor, so the export of a Qwen3-Omni checkpoint lacks the "
    "speech talker and the code-to-wave decoder (310 tensors of the tiny checkpoint)",
    where="megatron/bridge/models/qwen_omni/qwen3_omni_bridge.py:47-51 (the warning), :110 (mapping_registry: "
    "thinker.* only)",
    findings=(
        ("coverage", "talker.*", "not-exported"),
        ("coverage", "code2wav.*", "not-exported"),
        ("roundtrip", "talker.*", "missing"),
        ("roundtrip", "code2wav.*", "missing"),
        ("elements", "talker.*", "never-written"),
        ("elements", "code2wav.*", "never-written"),
        ("layout", "talker.*", "missing"),
        ("layout", "code2wav.*", "missing"),
    ),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on Qwen3OmniMoeForConditionalGeneration built from transformers 5.12.1's default config
(the talker fields its config class lacks named: support_shrink.READ_NOT_DEFAULTED) on 0.6.2, 0.6.0 and 0.5.0; 0.5.1's
qwen3_omni_bridge.py is 0.5.0's byte for byte."""

QWEN25_OMNI_TIE_FROM_TEXT_CONFIG = UpstreamBug(
    name="qwen25-omni-tie-from-text-config",
    summary="the Qwen2.5-Omni bridge ties the thinker's output layer to its embedding by "
    "thinker_config.text_config.tie_word_embeddings, where transformers ties the thinker by its own "
    "thinker_config.tie_word_embeddings (transformers' defaults: text True, thinker False): the untied "
    "thinker.lm_head.weight is neither loaded nor exported, the export writes the embedding in its place",
    where="megatron/bridge/models/qwen_omni/qwen25_omni_bridge.py:75; transformers models/qwen2_5_omni/"
    "modeling_qwen2_5_omni.py:1725 (the thinker's tie, under its own config)",
    findings=(
        ("roundtrip", "thinker.lm_head.weight", "bytes-differ"),
        ("elements", "thinker.lm_head.weight", "never-written"),
        ("layout", "thinker.lm_head.weight", "tp1-differs-from-source"),
        ("coverage", "thinker.lm_head.weight", "not-exported"),  # 0.4.2 / 0.5.1: the tied export writes no lm_head
        ("roundtrip", "thinker.lm_head.weight", "missing"),
        ("layout", "thinker.lm_head.weight", "missing"),
        ("mapping", "thinker.lm_head.weight", "not-exported"),
    ),
    consequences=(  # the Megatron thinker's logits come from the embedding, transformers' from the untied lm_head
        ("logits", "logits", "logits-differ"),
        ("logits", "greedy-tokens", "greedy-differs"),
    ),
    seen_in=("0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` on Qwen2_5OmniForConditionalGeneration built from transformers 5.12.1's default
config (the thinker untied, its text config tied), and on 0.4.2 / 0.5.1 (the same line 75). The logits are its
consequence alone: with the checkpoint's lm_head set to its embedding the TP2 logits agree to 8.9e-8."""

QWEN25_VL_MROPE_SECTION_FIXED = UpstreamBug(
    name="qwen25-vl-mrope-section-fixed",
    summary="the Qwen2.5-VL bridge never reads the config's mrope_section: the provider keeps its default [16, 24, 24] "
    "(the 128-wide heads of the published checkpoints), so a model with other heads (or another section) gets a "
    "multimodal RoPE split that does not fit: the Megatron forward raises (split_with_sizes: [16, 24, 24] * 2 on "
    "16-wide heads) or rotates by the wrong sections",
    where="megatron/bridge/models/qwen_vl/qwen25_vl_provider.py:35 (the default); qwen25_vl_bridge.py:51-80 (no "
    "mrope_section read, where qwen3_vl_bridge.py:107 reads it)",
    findings=(("logits", "<megatron forward>", "forward-failed"),),
    seen_in=("0.6.2",),
)
"""Seen by `convcheck support` on Qwen2_5_VLForConditionalGeneration built from transformers 5.12.1's default config
(head_dim 16)."""

TRANSFORMERS_QWEN2_AUDIO_SAVE_DOUBLE_PREFIX = UpstreamBug(
    name="transformers-qwen2-audio-save-double-prefix",
    summary="transformers' save_pretrained reverses both the qwen2_audio and the Qwen2AudioModel key renamings, so "
    "the language model is written as language_model.model.model.* instead of the published "
    "language_model.model.*: the bridge (which reads the published names) finds none of it",
    where="transformers conversion_mapping.py:567-575 (the two rules for one prefix); megatron-bridge "
    "qwen_audio/qwen2_audio_bridge.py:111-115 reads the published names",
    findings=(
        ("coverage", "language_model.decoder.*", "hf-missing"),
        ("coverage", "language_model.decoder.*", "not-loaded"),
        ("coverage", "language_model.embedding.*", "hf-missing"),
        ("coverage", "language_model.embedding.*", "not-loaded"),
        ("coverage", "language_model.model.model.*", "not-exported"),
        ("roundtrip", "language_model.model.model.*", "missing"),
        ("layout", "language_model.model.model.*", "missing"),
        ("elements", "language_model.model.model.*", "never-written"),
    ),
    consequences=(("logits", "logits", "logits-differ"), ("logits", "greedy-tokens", "greedy-differs")),
    seen_in=("5.12.1",),
    project="transformers",
)
"""Seen by `convcheck support` on Qwen2AudioForConditionalGeneration written by transformers 5.12.1; the logits of a
language model the import never wrote differ from HF's as a consequence (tagged only beside its coverage findings)."""

TRANSFORMERS_EMBEDDING_SAVED_SINGULAR = UpstreamBug(
    name="transformers-nemotron-h-embedding-saved-singular",
    summary="transformers' NemotronH key renaming maps embedding.weight to embeddings.weight on load, and its reverse "
    "on save writes backbone.embedding.weight where published checkpoints hold backbone.embeddings.weight: the "
    "bridge, which maps the published name, loads no embedding from a checkpoint transformers wrote",
    where="transformers conversion_mapping.py:1076 (reversed by save_pretrained); megatron-bridge "
    "nemotronh/nemotron_h_bridge.py:399",
    findings=(
        ("coverage", "backbone.embedding.weight", "not-exported"),
        ("coverage", "embedding.word_embeddings.weight", "hf-missing"),
        ("coverage", "embedding.word_embeddings.weight", "not-loaded"),
        ("elements", "backbone.embedding.weight", "never-written"),
        ("layout", "backbone.embedding.weight", "missing"),
        ("roundtrip", "backbone.embedding.weight", "missing"),
        ("mapping", "backbone.embedding.weight", "uncovered"),
        ("mapping", "backbone.embeddings.weight", "not-exported"),
        ("mapping", "backbone.embeddings.weight", "uncovered"),
        ("mapping", "embedding.word_embeddings.weight", "mapping-error"),
    ),
    consequences=(("logits", "logits", "logits-differ"), ("logits", "greedy-tokens", "greedy-differs")),
    seen_in=("5.3.0", "5.8.1", "5.12.1"),
    project="transformers",
)
"""Seen by `convcheck support` on NemotronHForCausalLM written by transformers 5.12.1's save_pretrained at EP2; the
logits of a model whose embedding the import never wrote (NaN) differ as a consequence, tagged only beside the
embedding's coverage findings (a planted NemotronH bug the logits catch stays untagged). transformers 5.3.0 renames
the same way (conversion_mapping.py:294); with bridge 0.4.x the export then raises as well
(export-raises-on-a-tensor-the-checkpoint-lacks)."""

QWEN25_VL_DTYPE_FROM_TEXT_CONFIG = UpstreamBug(
    name="qwen25-vl-dtype-from-text-config",
    summary="the 0.4.x Qwen2.5-VL bridge reads params_dtype from text_config alone, where transformers 5 keeps the "
    "checkpoint's dtype on the top-level config only: a bf16 checkpoint builds an fp32 model and exports every "
    "tensor as fp32 (qwen3-vl-dtype-from-text-config's twin)",
    where="megatron/bridge/models/qwen_vl/qwen25_vl_bridge.py:55 (0.4.2; hf_config_to_provider_kwargs(text_config))",
    findings=WRONG_DTYPE,
    seen_in=("0.4.0", "0.4.1", "0.4.2"),
)
"""Seen by `convcheck support` on bridge 0.4.2 (Qwen2_5_VLForConditionalGeneration written by transformers 5.3.0, bf16);
0.5.1's passes those oracles."""

GEMMA_EXACT_GELU = UpstreamBug(
    name="gemma-exact-gelu",
    summary="the Gemma (1) bridge sets the activation from the literal 'gelu', whatever the config's hidden_act: "
    "Megatron computes exact GELU where HF Gemma computes the tanh approximation (gelu_pytorch_tanh, the config's "
    "default and what published checkpoints run); import, export and mappings agree, the forward differs",
    where='megatron/bridge/models/gemma/gemma_bridge.py:64 (0.5.0 / 0.5.1: hf_to_megatron_activation("gelu")); '
    "0.4.x and 0.6.x set fast_gelu (gemma_bridge.py:65 / :69)",
    findings=(("logits", "logits", "logits-differ"), ("logits", "greedy-tokens", "greedy-differs")),
    seen_in=("0.5.0", "0.5.1"),
    fixed_in="0.6.0",
)
"""Seen by `convcheck support` on bridge 0.5.1: GemmaForCausalLM from transformers 5.8.1's default config (hidden_act
gelu_pytorch_tanh) at TP2, logits 6.8e-4 off (the row passes on 0.4.2 and 0.6.2); the source line is the same in
0.5.0."""

QWEN2_AUDIO_LEARNED_POSITIONS = UpstreamBug(
    name="qwen2-audio-learned-position-embeddings",
    summary="the 0.4.x Qwen2-Audio bridge never sets position_embedding_type, so its language model is built with "
    "GPTModelProvider's default learned absolute position embeddings instead of RoPE: the extra "
    "embedding.position_embeddings.weight has no mapping, import and export raise on its None task (nothing loads), "
    "and the forward has no position ids for it",
    where="megatron/bridge/models/qwen_audio/qwen2_audio_bridge.py:83-99 (0.4.2 provider_bridge; no "
    "position_embedding_type); gpt_provider.py:137 (default learned_absolute); conversion/model_bridge.py:948 (the "
    "None task); 0.5.0 sets rope (qwen2_audio_bridge.py:88)",
    findings=(
        ("coverage", "language_model.embedding.position_embeddings.weight", "unmapped"),
        ("logits", "language_model.embedding.position_embeddings.weight", "forward-failed"),
    ),
    consequences=(
        ("*", "<import>", "import-failed"),
        ("*", "<export>", "export-failed"),
        ("layout", "<export>", "tp1-export-failed"),
        ("coverage", "*", "not-loaded"),
        ("roundtrip", "*", "missing"),
        ("layout", "*", "missing"),
    ),
    seen_in=("0.4.0", "0.4.1", "0.4.2"),
    fixed_in="0.5.0",
)
"""Seen by `convcheck support` on bridge 0.4.2 (Qwen2AudioForConditionalGeneration written by transformers 5.3.0, which
saves the published names) at TP1 and TP2; the bridge file is the same in 0.4.0."""

QWEN2_AUDIO_DTYPE_FROM_TEXT_CONFIG = UpstreamBug(
    name="qwen2-audio-dtype-from-text-config",
    summary="the 0.4.x Qwen2-Audio bridge reads params_dtype from text_config alone, where transformers 5 keeps the "
    "checkpoint's dtype on the top-level config only: a bf16 checkpoint builds an fp32 model and exports fp32 "
    "(qwen25-vl-dtype-from-text-config's twin)",
    where="megatron/bridge/models/qwen_audio/qwen2_audio_bridge.py:83 (0.4.2; "
    "hf_config_to_provider_kwargs(text_config)); conversion/model_bridge.py:515 (dtype_from_hf, default float32)",
    findings=WRONG_DTYPE,
    seen_in=("0.4.0", "0.4.1", "0.4.2"),
)
"""Seen by `convcheck support` on bridge 0.4.2 beside qwen2-audio-learned-position-embeddings (the layout oracle's TP1
and TP2 exports, fp32 for the bf16 source); 0.5.1's row passes."""

QWEN25_OMNI_DTYPE_FROM_THINKER_CONFIG = UpstreamBug(
    name="qwen25-omni-dtype-from-thinker-config",
    summary="the Qwen2.5-Omni bridge reads params_dtype from thinker_config alone (default float32), which the "
    "checkpoints transformers 5.3.0 writes leave without a dtype (it is on the top-level config): a bf16 checkpoint "
    "builds an fp32 thinker and exports every tensor as fp32",
    where="megatron/bridge/models/qwen_omni/qwen25_omni_bridge.py:55 (dtype_from_hf(thinker_config, "
    "default=torch.float32))",
    findings=WRONG_DTYPE,
    seen_in=("0.4.0", "0.4.1", "0.4.2"),
)
"""Seen by `convcheck support` on bridge 0.4.2 and 0.4.0 (Qwen2_5OmniForConditionalGeneration written by transformers
5.3.0) at TP2; the line is the same in 0.5.1 and 0.6.2, whose transformers write the thinker's dtype."""

REGISTERED_BUGS: dict[str, tuple[UpstreamBug, ...]] = {
    "DeepseekV4ForCausalLM": (DEEPSEEK_V4_ROPE_NEEDS_YARN,),
    "Ernie4_5_MoeForCausalLM": (ERNIE45_SIGMOID_ROUTER, ERNIE45_ROUTER_GATE_BF16),
    "Ernie4_5_VLMoeForConditionalGeneration": ERNIE45_VL_BUGS,
    "FalconH1ForCausalLM": (FALCON_H1_NORM_BEFORE_GATE,),
    "GemmaForCausalLM": (GEMMA_EXACT_GELU,),
    "Exaone4ForCausalLM": (EXAONE4_UNTIED_LM_HEAD_UNMAPPED,),
    "Glm4vMoeForConditionalGeneration": (GLM45V_HEAD_DIM_REQUIRED,),
    "HYV3ForCausalLM": (HYV3_FIRST_K_DENSE_REQUIRED,),
    "MiniMaxM3SparseForConditionalGeneration": (MINIMAX_M3_FP32_EXPORT,),
    "Mistral3ForConditionalGeneration": (MINISTRAL3_LLAMA4_SCALING_BETA_REQUIRED, MINISTRAL3_ROPE_PARAMETERS_REQUIRED),
    "Qwen2AudioForConditionalGeneration": (
        TRANSFORMERS_QWEN2_AUDIO_SAVE_DOUBLE_PREFIX,
        QWEN2_AUDIO_LEARNED_POSITIONS,
        QWEN2_AUDIO_DTYPE_FROM_TEXT_CONFIG,
    ),
    "Qwen2_5OmniForConditionalGeneration": (
        QWEN25_OMNI_TALKER_TOKEN2WAV_DROPPED,
        QWEN25_OMNI_TIE_FROM_TEXT_CONFIG,
        QWEN25_OMNI_DTYPE_FROM_THINKER_CONFIG,
    ),
    "Qwen2_5_VLForConditionalGeneration": (QWEN25_VL_MROPE_SECTION_FIXED, QWEN25_VL_DTYPE_FROM_TEXT_CONFIG),
    "Qwen3OmniMoeForConditionalGeneration": (QWEN3_OMNI_TALKER_CODE2WAV_DROPPED,),
}
"""HF class -> the known bugs its `convcheck support` row shows."""
