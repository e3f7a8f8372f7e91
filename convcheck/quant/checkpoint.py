"""FP8 block checkpoints in the published layout, written from a bf16 one with a reference quantizer (rank side:
torch at module top).

The published layout (DeepSeek-V3, Qwen3-*-FP8, MiniMax-M2): each quantized weight `W.weight` is float8_e4m3fn [M, N]
beside `W.weight_scale_inv` float32 [ceil(M/b), ceil(N/b)] (the dequantization multiplier of each b x b block), and
config.json holds `quantization_config` = {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
weight_block_size: [b, b], modules_to_not_convert: [...]}. Every other tensor is written as it is.

The reference dequantization of such a weight, element by element: bf16(float32(q[i, j]) * s[i // b, j // b]), one
float32 multiplication (exact operands: every float8_e4m3fn value is a float32) rounded to nearest-even, then one
float32 -> bf16 rounding to nearest-even.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from convcheck.quant import reference as ref
from convcheck.quant.names import module_of

QUANT_METHOD = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
SCALE = "_scale_inv"
"""The published name of a weight's scale: `<name>_scale_inv` (`model.layers.0.mlp.down_proj.weight_scale_inv`)."""

Quantize = Callable[[torch.Tensor, tuple[int, int]], tuple[torch.Tensor, torch.Tensor]]


def quantization_config(block: int, not_converted: list[str]) -> dict:
    """The config.json `quantization_config` of an FP8 block checkpoint whose unquantized 2-D weights are the modules
    `not_converted` (HF tensor names without `.weight`)."""
    return {**QUANT_METHOD, "weight_block_size": [block, block], "modules_to_not_convert": sorted(not_converted)}


def dequantize(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    """The reference dequantization: bf16(float32(q) * scale per block) for q float8_e4m3fn [M, N] and scale float32
    [ceil(M/b), ceil(N/b)] (module docstring)."""
    return ref.dequant_fp8(q, scale, (block, block)).to(torch.bfloat16)


def fp8_tensors(
    tensors: Mapping[str, torch.Tensor], why_not: Mapping[str, str], block: int, quantize: Quantize = ref.fp8_block
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the FP8 checkpoint's tensors, the bf16 reference's tensors) of the bf16 checkpoint `tensors`: each name with
    `why_not[name] == ""` quantized by `quantize` (q, scale) in the first and dequantized (`dequantize`) in the second;
    every other tensor is the same object in both."""
    fp8: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if why_not.get(name, "not 2-D") == "":
            q, scale = quantize(tensor, (block, block))
            fp8[name], fp8[name + SCALE] = q, scale.to(torch.float32).contiguous()
            reference[name] = dequantize(q, scale, block)
        else:
            fp8[name] = reference[name] = tensor
    return fp8, reference


def not_converted(why_not: Mapping[str, str]) -> list[str]:
    """The modules of the 2-D `.weight` tensors left unquantized (`why_not` non-empty)."""
    return sorted(module_of(n) for n, why in why_not.items() if why and n.endswith(".weight"))


def write_checkpoint(source: Path, out: Path, tensors: Mapping[str, torch.Tensor], config: dict) -> Path:
    """A checkpoint folder `out`: `tensors` in one model.safetensors, `config` as config.json, and the other files of
    `source` (tokenizer, generation config) copied; returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name not in ("config.json", ".complete"):
            if not file.name.endswith(".index.json"):
                shutil.copy(file, out / file.name)
    save_file(
        {n: t.contiguous() for n, t in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
