"""The config oracle's table for Gemma 3 VL (model_type gemma3), as megatron-bridge 0.6.2 builds it
(gemma_vl/gemma3_vl_bridge.py:58-98 provider_bridge; gemma3_vl_provider.py; modeling_gemma3_vl.py:94-106 and
:291-336 for the tower and projector) against transformers 5.12.1's Gemma3Config / modeling_gemma3.py.

The language model's rules are Gemma 3 text's (convcheck.models.gemma3) read under `text_config`, its tied flag the
top-level one. The vision tower is transformers' own SigLIP module built from the vision_config the bridge passes on:
its rules read what the built tower holds (`model.vision_tower.*`). The projector's geometry (how many patches per
side it reshapes, the pooling kernel) is read from the built projector.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from convcheck.models.config_rules import QK_NORMS, FieldRule, HfView, MegatronGet, built_qk_norms, implied, same
from convcheck.models.gemma3 import GEMMA3_TABLE
from convcheck.models.qwen3_vl_config import TEXT, VISION, _ignored, in_text

REPLACED = ("share_embeddings_and_output_weights",)
"""Gemma 3 text rules the VL table replaces: the tied flag is the top-level one (transformers ties the wrapper's
lm_head by it, and the bridge's hf_config_to_provider_kwargs reads text_config's, which equals it in published
checkpoints)."""


def _tower(hf: str, megatron: str, note: str = "") -> FieldRule:
    """vision_config.<hf> equals the built SigLIP tower's `model.vision_tower.<megatron>`."""
    name = f"{VISION}.{hf}"
    return FieldRule(megatron=f"model.vision_tower.{megatron}", hf=(name,), expect=lambda c, _m: c[name], note=note)


def _head(c: HfView, _m: MegatronGet) -> bool:
    """Whether transformers builds the SigLIP pooling head: vision_use_head, True where the config names none
    (SiglipVisionConfig's default, modeling_siglip.py:572)."""
    return bool(c.get(f"{VISION}.vision_use_head", True))


def _has_pooling_head(tower: Any) -> bool:
    """Whether the bridge's SigLIP tower holds the pooling head: on the tower itself (bridge 0.5.0+ keeps the inner
    SiglipVisionTransformer, modeling_gemma3_vl.py:99) or on its `vision_model` (releases before hold the whole
    SiglipVisionModel, modeling_gemma3_vl.py:94)."""
    return hasattr(getattr(tower, "vision_model", tower), "head")


def _patches_per_side(c: HfView, _m: MegatronGet) -> int:
    """image_size // patch_size: the side of the patch grid HF's projector reshapes (Gemma3MultiModalProjector)."""
    return int(c[f"{VISION}.image_size"]) // int(c[f"{VISION}.patch_size"])


def _pool_kernel(c: HfView, m: MegatronGet) -> int:
    """The average-pooling kernel: patches per side // sqrt(mm_tokens_per_image) (HF Gemma3MultiModalProjector)."""
    return _patches_per_side(c, m) // int(math.isqrt(int(c["mm_tokens_per_image"])))


def _kernel(value: Any, _m: MegatronGet) -> int:
    return int(value[0] if isinstance(value, (tuple, list)) else value)


VISION_TOWER = (
    _tower("num_hidden_layers", "config.num_hidden_layers"),
    _tower("hidden_size", "config.hidden_size"),
    _tower("intermediate_size", "config.intermediate_size"),
    _tower("num_attention_heads", "config.num_attention_heads"),
    _tower("image_size", "config.image_size"),
    _tower("patch_size", "config.patch_size"),
    _tower("num_channels", "config.num_channels"),
    _tower("layer_norm_eps", "config.layer_norm_eps"),
    _tower("hidden_act", "config.hidden_act"),
    _tower("attention_dropout", "config.attention_dropout"),
    FieldRule(
        megatron="model.vision_tower",
        hf=(f"{VISION}.vision_use_head",),
        expect=_head,
        observe=lambda tower, _m: _has_pooling_head(tower),
        note="whether the tower has the pooling head (the bridge drops it: gemma3-vl-pooling-head-dropped)",
    ),
)
"""transformers' SigLIP tower, as the bridge built it from the config it passed on."""

PROJECTOR = (
    FieldRule(
        megatron="model.multi_modal_projector.patches_per_side",
        hf=(f"{VISION}.image_size", f"{VISION}.patch_size"),
        expect=_patches_per_side,
        note="the patch grid's side the projector reshapes the tower's output into",
    ),
    FieldRule(
        megatron="model.multi_modal_projector.avg_pool.kernel_size",
        hf=("mm_tokens_per_image",),
        also=(f"{VISION}.image_size", f"{VISION}.patch_size"),
        expect=_pool_kernel,
        observe=_kernel,
        note="average pooling of the patch grid down to mm_tokens_per_image soft tokens",
    ),
    FieldRule(
        megatron="model.multi_modal_projector.config.input_size",
        hf=(f"{VISION}.hidden_size",),
        expect=lambda c, _m: c[f"{VISION}.hidden_size"],
        note="the soft-embedding norm's and projection's input width",
    ),
    FieldRule(
        megatron="model.multi_modal_projector.config.hidden_size",
        hf=(f"{TEXT}.hidden_size",),
        expect=lambda c, _m: c[f"{TEXT}.hidden_size"],
        note="the projection's output: the language model's width",
    ),
    FieldRule(
        megatron="model.multi_modal_projector.mm_soft_embed_norm.eps",
        hf=(f"{VISION}.layer_norm_eps",),
        expect=lambda c, _m: float(c[f"{VISION}.layer_norm_eps"]),
        observe=lambda value, _m: float(value),
        note="HF's mm_soft_emb_norm takes the vision tower's layer_norm_eps",
    ),
    implied(
        "model.multi_modal_projector.config.layernorm_zero_centered_gamma",
        True,
        "HF Gemma3RMSNorm multiplies by 1 + w in the soft-embedding norm too",
    ),
)
"""Gemma 3's projector: average pooling to mm_tokens_per_image, the soft-embedding RMSNorm, the projection."""

TOKENS = (
    FieldRule(
        megatron="model.config.image_token_id",
        hf=("image_token_index",),
        expect=lambda c, _m: c["image_token_index"],
        note="which input ids the soft tokens replace and which attend bidirectionally within their image",
    ),
)
IGNORED_HERE = (
    "boi_token_index",
    "eoi_token_index",
    *(f"{sub}.{name}" for sub in (TEXT, VISION) for name in ("initializer_range", "dtype")),
    *(
        f"{TEXT}.{name}"
        for name in ("bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "tie_word_embeddings")
    ),
)
"""Fields that do not change the computed function: the image's delimiters (ordinary text tokens to both models), the
sub-configs' init range and storage dtype, generation metadata and text_config's own tie flag (the top-level one
ties)."""

ROPE = ("rotary_base", "rope_scaling_factor")
"""Gemma 3 text rules over `rope_parameters.<layer type>`: the config oracle's view flattens one level, so under
text_config the whole `rope_parameters` dict is one field, which these rules read (their functions look inside)."""


def _language(rule: FieldRule) -> FieldRule:
    """A Gemma 3 text rule in the VL frame: read under text_config, the q / k norms looked up in the language model."""
    if rule.megatron == QK_NORMS:
        return built_qk_norms(rule.note, "model.language_model." + QK_NORMS[len("model.") :])
    if rule.megatron in ROPE:
        return in_text(replace(rule, hf=("rope_parameters",)))  # also: the transformers 4 spellings
    return in_text(rule)


LANGUAGE = tuple(_language(rule) for rule in GEMMA3_TABLE if rule.megatron not in REPLACED)

GEMMA3_VL_TABLE: tuple[FieldRule, ...] = (
    *LANGUAGE,
    same("tie_word_embeddings", "share_embeddings_and_output_weights", note="the top-level flag"),
    *VISION_TOWER,
    *PROJECTOR,
    *TOKENS,
    *_ignored(IGNORED_HERE),
)
"""model_type gemma3: Gemma 3 text's rules under text_config, the SigLIP tower, the projector and the image token."""
