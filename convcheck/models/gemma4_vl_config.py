"""The config oracle's table for Gemma 4 VL (model_type gemma4), as megatron-bridge 0.6.2 builds it
(gemma_vl/gemma4_vl_bridge.py:78-140 provider_bridge, :177-193 _build_dense_vl_provider): the Gemma 4 text table
(convcheck.models.gemma4, both variants) read under `text_config`, the tied flag from the top level, the multimodal
token ids and soft-token count the provider copies, and the vision / audio sub-configs, which the provider keeps as
transformers' own config objects and builds the towers from (AutoModel.from_config): each of their published fields
must reach the tower unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from convcheck.models.config_rules import FieldRule, HfView, MegatronGet, same
from convcheck.models.gemma4 import GEMMA4_TABLE
from convcheck.models.qwen3_vl_config import TEXT, _ignored, in_text

VISION, AUDIO = "vision_config", "audio_config"

VISION_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "global_head_dim",
    "hidden_activation",
    "rms_norm_eps",
    "patch_size",
    "pooling_kernel_size",
    "position_embedding_size",
    "rope_parameters",
    "use_clipped_linears",
    "standardize",
    "attention_bias",
    "attention_dropout",
    "max_position_embeddings",
    "default_output_length",
)
"""Published E4B / 31B / 26B-A4B vision_config fields that shape the tower's forward."""

AUDIO_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_act",
    "subsampling_conv_channels",
    "conv_kernel_size",
    "residual_weight",
    "attention_chunk_size",
    "attention_context_left",
    "attention_context_right",
    "attention_logit_cap",
    "attention_invalid_logits_value",
    "use_clipped_linears",
    "rms_norm_eps",
    "gradient_clipping",
    "output_proj_dims",
)
"""Published E2B / E4B audio_config fields that shape the audio tower's forward."""


def _sub(section: str, field: str, note: str = "") -> FieldRule:
    """`section.field` equals the provider's sub-config object's attribute (the tower is built from that object)."""
    name = f"{section}.{field}"

    def expect(c: HfView, _m: MegatronGet) -> Any:
        return c.get(name)

    def observe(value: Any, _m: MegatronGet) -> Any:
        return value

    note = note or f"the {section.split('_')[0]} tower is transformers' own, built from this object"
    return FieldRule(
        megatron=f"model.config.{name}", hf=(name,), expect=expect, observe=observe, missing=None, note=note
    )


def _tokens() -> tuple[FieldRule, ...]:
    """The ids the provider copies from the top level (image / video / audio tokens, bos / eos) and the soft tokens
    per image."""
    rules = tuple(same(name, name, note="the provider's copy") for name in ("image_token_id", "video_token_id"))
    ends = tuple(  # Gemma4Config keeps no top-level bos / eos: a config without them has text_config's
        same(
            name,
            name,
            note="the provider's copy (text_config's where the top level has none)",
            also=(f"text_config.{name}",),
        )
        for name in ("bos_token_id", "eos_token_id")
    )
    audio = replace(  # a model with no audio tower (26B-A4B) needs no audio token in Megatron
        same("audio_token_id", "audio_token_id", note="the provider's copy, for a model with an audio tower"),
        when=lambda c: c.get("audio_config") is not None,
    )
    soft = replace(  # Gemma4Config declares no such field and HF's model never reads it: checked where a config sets it
        same("vision_soft_tokens_per_image", "vision_soft_tokens_per_image"),
        when=lambda c: c.get("vision_soft_tokens_per_image") is not None,
    )
    return (*rules, *ends, audio, soft)


REPLACED = ("share_embeddings_and_output_weights",)
BIDIRECTIONAL = "use_bidirectional_attention"
"""Text rules the VL table replaces: the tied flag is the top level's; bidirectional attention over images, which the
text model refuses, is the VL model's own mask."""

TEXT_IGNORED = ("initializer_range", "dtype", "use_cache", "tie_word_embeddings", "bos_token_id", "eos_token_id",
                "pad_token_id", "expert_intermediate_size")  # fmt: skip
"""text_config fields that do not change the forward: init range, storage dtype, generation metadata and its own tie
flag (the wrapper ties by the top-level one, as the provider reads it); pad_token_id is the id image / audio
placeholders are embedded as on both sides (HF Gemma4Model.forward, modeling_gemma4_vl.py:279); published E4B writes
expert_intermediate_size (null), which transformers 5.12.1's Gemma4TextConfig does not declare."""

SUB_CONFIG_METADATA = ("_name_or_path", "architectures", "chunk_size_feed_forward", "id2label", "label2id",
                       "is_encoder_decoder", "model_type", "output_attentions", "output_hidden_states", "problem_type",
                       "return_dict")  # fmt: skip
"""What transformers writes into every nested sub-config (published E4B's vision_config and audio_config carry them):
bookkeeping no tower reads."""

IGNORED = (
    *(f"{TEXT}.{name}" for name in TEXT_IGNORED),
    *(f"{sub}.{name}" for sub in (VISION, AUDIO) for name in ("initializer_range", "dtype", *SUB_CONFIG_METADATA)),
    "boi_token_id",
    "eoi_token_id",
    "boa_token_id",
    "eoa_token_id",
    "eoa_token_index",
    "pad_token_id",
    "initializer_range",
    "dtype",
)
"""Fields that do not change the computed function: the begin / end-of-image and -audio ids (text tokens on both
sides), init ranges, storage dtypes."""

GEMMA4_VL_TABLE: tuple[FieldRule, ...] = (
    *(in_text(rule) for rule in GEMMA4_TABLE if rule.megatron not in REPLACED and rule.hf != (BIDIRECTIONAL,)),
    _sub(
        TEXT,
        BIDIRECTIONAL,
        "the VL model builds its attention mask from the provider's text_config "
        "(modeling_gemma4_vl.py:366-391): within each image both ways where 'vision', else causal",
    ),
    same("tie_word_embeddings", "share_embeddings_and_output_weights", note="the top-level flag"),
    *_tokens(),
    *(_sub(VISION, field) for field in VISION_FIELDS),
    *(_sub(AUDIO, field) for field in AUDIO_FIELDS),
    *_ignored(IGNORED),
)
"""model_type gemma4: the Gemma 4 text table under text_config, the top-level tie flag and token ids, the vision and
audio sub-configs."""
