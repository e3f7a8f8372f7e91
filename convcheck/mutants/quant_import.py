"""Planted FP8-import bugs (the quant-import oracle's catalog, convcheck.mutants.catalog_quant.IMPORT_MUTANTS).

The Qwen3-MoE bridge of megatron-bridge 0.6.2 does not dequantize FP8 checkpoints (fp8-import-not-dequantized), so
each hook first gives it the DeepSeek-V3 bridge's loader (deepseek_v3_bridge.py:133-167: the bridge's own
quantization_utils.maybe_dequantize_fp8_blockwise on each loaded weight and its `_scale_inv`), then plants its bug in
the scale that loader is handed. `dequantize` alone is the fixed bridge: the oracle passes on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion import quantization_utils
from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
from megatron.bridge.models.qwen.qwen3_moe_bridge import Qwen3MoEBridge

SCALE = "_scale_inv"


def _dequantizing_loader(scale_of: Callable[[str, Any], Any]) -> None:
    """Qwen3MoEBridge.maybe_modify_loaded_hf_weight dequantizes every loaded float8 weight with
    maybe_dequantize_fp8_blockwise(weight, scale_of(name, its weight_scale_inv)); scale_of returns None to drop it."""

    def one(name: str, weight: Any, state: Any) -> Any:
        scale = state.get(name + SCALE)
        if scale is not None:
            scale = scale_of(name, scale)
        return quantization_utils.maybe_dequantize_fp8_blockwise(weight, scale)

    def load(self: Any, hf_param: Any, hf_state_dict: Any) -> Any:
        weights = MegatronModelBridge.maybe_modify_loaded_hf_weight(self, hf_param, hf_state_dict)
        if isinstance(hf_param, dict):
            return {key: one(hf_param[key], w, hf_state_dict) for key, w in weights.items()}
        return one(hf_param, weights, hf_state_dict)

    Qwen3MoEBridge.maybe_modify_loaded_hf_weight = load


def dequantize() -> None:
    """The fixed bridge: DeepSeek-V3's dequantizing loader on Qwen3-MoE, nothing planted (a control: no finding)."""
    _dequantizing_loader(lambda _name, scale: scale)


def transposed_grid() -> None:
    """The loader reads each scale grid transposed (scale[j, i] for block [i, j], stored row-major as the transposed
    grid): every block off the diagonal of a square grid takes its mirror's scale."""
    _dequantizing_loader(lambda _name, scale: scale.t().contiguous().reshape(scale.shape))


def dropped_scale() -> None:
    """Layer 1's o_proj scale is dropped on the way: its fp8 values load as if bf16."""
    _dequantizing_loader(lambda name, scale: None if name == "model.layers.1.self_attn.o_proj.weight" else scale)
