"""Known megatron-bridge and transformers bugs found by `convcheck support` (tiny checkpoints written by transformers
from each class's default config). REGISTERED_BUGS, keyed by HF class, holds those of architectures convcheck has no
family for (`convcheck.models.tag_upstream_bugs` reads them beside TE_SPEC_BUGS); a family's (NemotronH's) is listed
in its Architecture."""

from __future__ import annotations

from convcheck.models.upstream_bug import UpstreamBug

_EVERY_ORACLE = ("coverage", "roundtrip", "config", "logits", "differential", "elements", "layout", "mapping", "save")

DEEPSEEK_V4_ROPE_NEEDS_YARN = UpstreamBug(
    name="deepseek-v4-rope-needs-yarn",
    summary="the DeepSeek-V4 bridge reads rotary_scaling_factor and original_max_position_embeddings from the "
    "compress rope parameters unconditionally: a config whose rope is not YaRN (transformers' own DeepseekV4Config "
    "default, rope_type 'default') raises KeyError 'factor' and no model is built",
    where="megatron/bridge/models/deepseek/deepseek_v4_bridge.py:441 (and :442-444)",
    findings=tuple((oracle, "<build>", "build-failed") for oracle in _EVERY_ORACLE),
    seen_in=("0.6.2",),
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
        ("*", "<import>", "import-failed"),
        ("*", "<export>", "export-failed"),
        ("layout", "<export>", "tp1-export-failed"),
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
    seen_in=("0.6.2",),
)
"""Seen by `convcheck support` on Exaone4ForCausalLM built from transformers 5.12.1's default config (untied)."""

GLM45V_HEAD_DIM_REQUIRED = UpstreamBug(
    name="glm45v-head-dim-required",
    summary="the GLM-4.5V bridge reads text_config.head_dim, a field transformers' Glm4vMoeTextConfig does not "
    "define (published config.json files carry it as an extra key): a checkpoint whose config transformers wrote "
    "from its own class raises AttributeError and no model is built",
    where="megatron/bridge/models/glm_vl/glm_45v_bridge.py:51",
    findings=tuple((oracle, "<build>", "build-failed") for oracle in _EVERY_ORACLE),
    seen_in=("0.6.2",),
)
"""Seen by `convcheck support` on Glm4vMoeForConditionalGeneration built from transformers 5.12.1's default config."""

GLM5_INDEXER_ROPE_INTERLEAVE_REQUIRED = UpstreamBug(
    name="glm5-indexer-rope-interleave-required",
    summary="the GLM-5 (GlmMoeDsa) bridge reads hf_config.indexer_rope_interleave, a field transformers' "
    "GlmMoeDsaConfig does not define: a checkpoint whose config transformers wrote from its own class raises "
    "AttributeError and no model is built",
    where="megatron/bridge/models/glm_moe_dsa/glm5_bridge.py:135",
    findings=tuple((oracle, "<build>", "build-failed") for oracle in _EVERY_ORACLE),
    seen_in=("0.6.2",),
)
"""Seen by `convcheck support` on GlmMoeDsaForCausalLM built from transformers 5.12.1's default config."""

HYV3_FIRST_K_DENSE_REQUIRED = UpstreamBug(
    name="hy-v3-first-k-dense-required",
    summary="the HY-V3 bridge reads hf_config.first_k_dense_replace, a field transformers' HYV3Config does not "
    "define: a checkpoint whose config transformers wrote from its own class raises AttributeError and no model is "
    "built",
    where="megatron/bridge/models/hy_v3/hy_v3_bridge.py:98",
    findings=tuple((oracle, "<build>", "build-failed") for oracle in _EVERY_ORACLE),
    seen_in=("0.6.2",),
)
"""Seen by `convcheck support` on HYV3ForCausalLM built from transformers 5.12.1's default config."""

MINISTRAL3_LLAMA4_SCALING_BETA_REQUIRED = UpstreamBug(
    name="ministral3-llama4-scaling-beta-required",
    summary="the Ministral 3 attention reads text_config.rope_parameters['llama_4_scaling_beta'] unconditionally: a "
    "config without Llama-4 attention scaling (transformers' Mistral3Config default) raises KeyError while the "
    "model is built",
    where="megatron/bridge/models/ministral3/ministral3_provider.py:205",
    findings=tuple((oracle, "<build>", "build-failed") for oracle in _EVERY_ORACLE),
    seen_in=("0.6.2",),
)
"""Seen by `convcheck support` on Mistral3ForConditionalGeneration built from transformers 5.12.1's default config."""

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
    seen_in=("5.12.1",),
    project="transformers",
)
"""Seen by `convcheck support` on Qwen2AudioForConditionalGeneration written by transformers 5.12.1 (the logits'
Megatron forward failure on the same row is not explained by it)."""

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
    ),  # not the logits it leaves at the embedding's init values: the catalog's NemotronH mutants are caught there
    seen_in=("5.12.1",),
    project="transformers",
)
"""Seen by `convcheck support` on NemotronHForCausalLM written by transformers 5.12.1's save_pretrained at EP2."""

REGISTERED_BUGS: dict[str, tuple[UpstreamBug, ...]] = {
    "DeepseekV4ForCausalLM": (DEEPSEEK_V4_ROPE_NEEDS_YARN,),
    "Exaone4ForCausalLM": (EXAONE4_UNTIED_LM_HEAD_UNMAPPED,),
    "Glm4vMoeForConditionalGeneration": (GLM45V_HEAD_DIM_REQUIRED,),
    "GlmMoeDsaForCausalLM": (GLM5_INDEXER_ROPE_INTERLEAVE_REQUIRED,),
    "HYV3ForCausalLM": (HYV3_FIRST_K_DENSE_REQUIRED,),
    "Mistral3ForConditionalGeneration": (MINISTRAL3_LLAMA4_SCALING_BETA_REQUIRED,),
    "Qwen2AudioForConditionalGeneration": (TRANSFORMERS_QWEN2_AUDIO_SAVE_DOUBLE_PREFIX,),
}
"""HF class -> the known bugs its `convcheck support` row shows."""
