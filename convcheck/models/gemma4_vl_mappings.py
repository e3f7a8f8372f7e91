"""Gemma 4 VL's explicit mappings (Gemma4ForConditionalGeneration): the Gemma 4 text decoder of `gemma4_mappings`
(dense or MoE, per-layer inputs, KV sharing) under `language_model.` (HF `model.language_model.`), and the towers the
bridge builds as transformers' own modules, each parameter and persistent buffer whole on every rank under its own
name (megatron-bridge 0.6.2 gemma_vl/gemma4_vl_bridge.py:220-243, :331-346):
- `vision_tower.X` <-> `model.vision_tower.X`: the patch embedder's `input_proj.weight` `[V, 3 * P * P]` and position
  table `[2, N_pos, V]`, per block the q / k / v / o and gate / up / down `linear.weight`s (`[n * d, V]`, ...,
  `[V, I]`), their clip bounds `input_min` / `input_max` / `output_min` / `output_max` `[]` (persistent buffers,
  with use_clipped_linears), the q / k norms `[d]` and the four sandwich norms `[V]`;
- `embed_vision.embedding_projection.weight` `[H, V]` <-> `model.embed_vision.embedding_projection.weight` (its
  pre-projection norm has no scale);
- `audio_tower.X` <-> `model.audio_tower.X` and `embed_audio.embedding_projection.weight` `[H, A_out]`: the audio
  tower (subsampling convolutions, conformer layers with clipped linears, the output projection and its bias) and its
  embedder, where the config has an audio_config (E2B / E4B).
None of them is split by TP (the towers run whole on every rank of the first pipeline stage).
"""

from __future__ import annotations

import re

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Replicated
from convcheck.mappings.registry import MappingRule
from convcheck.models.gemma4_mappings import gemma4_rules
from convcheck.models.qwen3_vl_mappings import under_language_model

TOWERS: dict[str, str] = {
    "vision_tower": "model.vision_tower",
    "embed_vision": "model.embed_vision",
    "audio_tower": "model.audio_tower",
    "embed_audio": "model.embed_audio",
}
"""Megatron module of Gemma4VLModel -> the HF module it is a copy of."""


def tower_tensor(match: re.Match[str], geometry: Geometry) -> Replicated:
    """A tower's parameter or buffer `<module>.X` (any shape, whole on every rank) <-> HF `model.<module>.X`."""
    return Replicated(megatron=match[0], hf=f"{TOWERS[match['module']]}.{match['rest']}")


TOWER_RULES = (MappingRule(r"(?P<module>" + "|".join(TOWERS) + r")\.(?P<rest>.+)", tower_tensor),)


def gemma4_vl_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of Gemma 4 VL: the Gemma 4 text decoder under language_model, the vision and audio
    towers and their embedders whole."""
    return [*(under_language_model(rule) for rule in gemma4_rules(tied)), *TOWER_RULES]
