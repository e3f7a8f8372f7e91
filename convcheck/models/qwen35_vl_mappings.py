"""Qwen3.5-VL's and Qwen3.5-VL-MoE's explicit mappings: the Qwen3.5 gated-DeltaNet decoder of `qwen_next_mappings`
(dense MLP or MoE, the MTP layer) under `language_model.` (HF `model.language_model.`; the MTP layer stays HF's
top-level `mtp.*`, as published checkpoints and the bridge name it: qwen/qwen35_bridge.py:319-327, :588-595), and the
Qwen3-VL vision tower of `qwen3_vl_mappings` (blocks, patch and position embedding, the patch merger; Qwen3.5 has no
deepstack mergers).
"""

from __future__ import annotations

from convcheck.mappings.registry import MappingRule
from convcheck.models.qwen3_vl_mappings import VISION_RULES, under_language_model
from convcheck.models.qwen_next_mappings import qwen35_rules


def qwen35_vl_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of Qwen3.5-VL (dense or MoE): the Qwen3.5 decoder and MTP layer under
    language_model, the vision tower under vision_model."""
    return [*(under_language_model(rule) for rule in qwen35_rules(tied)), *VISION_RULES]
