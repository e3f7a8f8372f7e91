"""Gemma 3 VL's explicit mappings (megatron-bridge 0.6.2 gemma_vl/gemma3_vl_bridge.py:102-176): the Gemma 3 text
decoder of `gemma3_mappings` under `language_model.` (HF `language_model.model.`, as published checkpoints and
transformers 5.12.1's save_pretrained name it), the SigLIP tower and the multi-modal projector.

With V the vision hidden size, H the language model's:
- `vision_tower.X` (every SigLIP parameter: the Conv2d patch embedding `[V, C, P, P]` and its bias `[V]`, the
  position embedding `[N_patches, V]`, each encoder layer's q / k / v / out projections `[V, V]` + biases, fc1
  `[I, V]`, fc2 `[V, I]` + biases, two LayerNorms `[V]` + biases, the post LayerNorm) <-> HF
  `vision_tower.vision_model.X` (the published namespace) or `vision_tower.X` (transformers 5's), whichever the
  checkpoint holds; whole on every rank (the bridge builds transformers' own module, not split);
- `multi_modal_projector.mm_soft_embed_norm.weight` `[V]` <-> `multi_modal_projector.mm_soft_emb_norm.weight`, whole
  (zero-centred on both sides: HF Gemma3RMSNorm multiplies by 1 + w, the bridge's TENorm has
  layernorm_zero_centered_gamma);
- `multi_modal_projector.proj.weight` `[H / tp, V]` (a ColumnParallelLinear, rows split) <->
  `multi_modal_projector.mm_input_projection_weight` `[V, H]` (HF multiplies by it: stored transposed, its columns
  split).
"""

from __future__ import annotations

import re

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Replicated
from convcheck.mappings.registry import MappingRule
from convcheck.mappings.transposed import TransposedSplit
from convcheck.models.gemma3_mappings import gemma3_rules
from convcheck.models.qwen3_vl_mappings import under_language_model

HF_LM = "language_model."
"""The decoder's HF prefix: the text model's `model.X` is `language_model.model.X`, its `lm_head`
`language_model.lm_head`."""
LEGACY_TOWER, TOWER = "vision_tower.vision_model.", "vision_tower."
PROJECTOR = "multi_modal_projector."


def language_model_name(hf: str) -> str:
    """A text-model HF name as the VL checkpoint spells it: `model.X` -> `language_model.model.X`, `lm_head.X` ->
    `language_model.lm_head.X` (other strings, as a mapping's axis, unchanged)."""
    return HF_LM + hf if hf.startswith(("model.", "lm_head.")) else hf


def text_model_name(hf: str) -> str:
    """The inverse of `language_model_name` (other names unchanged)."""
    return hf[len(HF_LM) :] if hf.startswith(HF_LM) else hf


def _legacy(names: frozenset[str]) -> bool:
    """Whether the checkpoint names its tower in the published namespace (`vision_tower.vision_model.*`), which the
    bridge then maps (gemma3_vl_bridge.py:114-123)."""
    return any(name.startswith(LEGACY_TOWER) for name in names)


def tower_path(match: re.Match[str]) -> str:
    """The SigLIP parameter's path inside the tower: the Megatron name's, less the `vision_model.` a transformers
    before 5.8 keeps in the module the bridge builds (`SiglipVisionModel.vision_model`; bridge 0.3.x-0.4.x)."""
    return match["path"].removeprefix("vision_model.")


def tower_legacy(match: re.Match[str], geometry: Geometry) -> Replicated:
    """A SigLIP parameter (any shape) <-> `vision_tower.vision_model.<path>`, whole on every rank."""
    return Replicated(megatron=match[0], hf=LEGACY_TOWER + tower_path(match))


def tower_flat(match: re.Match[str], geometry: Geometry) -> Replicated:
    """A SigLIP parameter (any shape) <-> `vision_tower.<path>` (transformers 5's own spelling), whole."""
    return Replicated(megatron=match[0], hf=TOWER + tower_path(match))


def soft_embedding_norm(match: re.Match[str], geometry: Geometry) -> Replicated:
    """The projector's RMSNorm `[V]` <-> `mm_soft_emb_norm.weight`, whole (both zero-centred: copied as is)."""
    return Replicated(megatron=match[0], hf=PROJECTOR + "mm_soft_emb_norm.weight")


def projection(match: re.Match[str], geometry: Geometry) -> TransposedSplit:
    """The projector's `proj.weight` `[H / tp, V]` <-> `mm_input_projection_weight` `[V, H]`, transposed, split."""
    return TransposedSplit(megatron=match[0], hf=PROJECTOR + "mm_input_projection_weight")


TOWER_PATTERN = r"vision_tower\.(?P<path>.+)"
VISION_RULES = (
    MappingRule(TOWER_PATTERN, tower_legacy, lambda _m, names: _legacy(names)),
    MappingRule(TOWER_PATTERN, tower_flat, lambda _m, names: not _legacy(names)),
    MappingRule(r"multi_modal_projector\.mm_soft_embed_norm\.weight", soft_embedding_norm),
    MappingRule(r"multi_modal_projector\.proj\.weight", projection),
)
"""Every Megatron parameter of the SigLIP tower and the projector."""


def gemma3_vl_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of Gemma 3 VL: the Gemma 3 decoder under language_model, the tower and projector."""
    decoder = [under_language_model(rule, language_model_name, text_model_name) for rule in gemma3_rules(tied)]
    return [*decoder, *VISION_RULES]
