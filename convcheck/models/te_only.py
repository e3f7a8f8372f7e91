"""Architectures whose bridge layer spec exists only on Transformer Engine, as data (no torch).

For these the bridge's provider builds TE classes that megatron-core's local spec has no counterpart for, so the
local layout (`--spec local`, convcheck's TE-free default) would be a model of convcheck's making, not the bridge's:
its findings would be artifacts. `verify` builds them with `--spec te` (the bridge's own specs on convcheck's TE
stand-in, convcheck.compat.te_standin) whatever `--spec` says, and says so on stderr.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TE_ONLY: dict[str, str] = {
    "Gemma3ForCausalLM": "the bridge's Gemma 3 layer spec keeps the post-attention and post-MLP norms inside "
    "TERowParallelLinearLayerNorm and the sliding-window attention in Gemma3TEDotProductAttention "
    "(megatron/bridge/models/gemma/gemma3_provider.py:146-170), TE classes the local spec has no counterpart for",
    "Gemma3ForConditionalGeneration": "the bridge's Gemma 3 VL provider builds its language model from the Gemma 3 "
    "TE layer spec (megatron/bridge/models/gemma/gemma3_provider.py:146-170) and its projector's norm from TENorm "
    "(megatron/bridge/models/gemma_vl/modeling_gemma3_vl.py:327)",
    "Qwen3VLForConditionalGeneration": "the bridge's Qwen3-VL provider builds its language model from megatron-core's "
    "TE layer spec (megatron/bridge/models/qwen_vl/qwen3_vl_provider.py:148) and its vision tower from TE classes",
    "Qwen3VLMoeForConditionalGeneration": "the bridge's Qwen3-VL-MoE provider builds its language model from "
    "megatron-core's TE layer spec (megatron/bridge/models/qwen_vl/qwen3_vl_provider.py:314) and its vision tower from "
    "TE classes",
    "Qwen3_5ForConditionalGeneration": "the bridge's Qwen3.5-VL provider builds its vision tower from TE classes "
    "(megatron/bridge/models/qwen_vl/qwen35_vl_provider.py:502-530: the TE ViT layer spec, TENorm and TE linears in "
    "the patch merger)",
    "Qwen3_5MoeForConditionalGeneration": "the bridge's Qwen3.5-VL-MoE provider builds its vision tower from TE "
    "classes (megatron/bridge/models/qwen_vl/qwen35_vl_provider.py:502-530)",
    "MiniMaxM2ForCausalLM": "the bridge's MiniMax-M2 layer spec is megatron-core's TE MoE spec with full-width q/k "
    "norms (megatron/bridge/models/minimax_m2/minimax_m2_provider.py:195-216)",
    "GlmMoeDsaForCausalLM": "the bridge's GLM-5 DSA spec asks the backend for TE's duplicated TELinear (MLA's down "
    "projections and the DSA indexer's linears), which megatron-core's local backend has no counterpart for, and "
    "AbsorbedMLA accepts only TE's or the column-parallel linears there (megatron-core models/gpt/"
    "experimental_attention_variant_module_specs.py:92-95 and :118-120; transformer/experimental_attention_variant/"
    "absorbed_mla.py:282-291)",
}
"""HF architecture class -> why its bridge spec exists only on TE (the line `verify` prints when it picks TE)."""


def config_architecture(config: Mapping[str, Any]) -> str:
    """The first HF `architectures` class name of a config.json ("" when it names none)."""
    names = config.get("architectures") or [""]
    return str(names[0])


def layer_spec_for(spec: str, config: Mapping[str, Any]) -> tuple[str, str | None]:
    """The layer specs a run of `config` builds for the requested `spec`, and the note saying why when it differs:
    "te" for a TE-only architecture (TE_ONLY), else `spec` unchanged."""
    arch = config_architecture(config)
    if spec == "te" or arch not in TE_ONLY:
        return spec, None
    return "te", f"{arch}: building the bridge's Transformer Engine specs (--spec te): {TE_ONLY[arch]}"
