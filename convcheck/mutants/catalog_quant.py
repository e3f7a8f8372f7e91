"""Catalog entries of quantized-refit bugs (hooks in convcheck.mutants.quant), caught by the opt-in quant oracle.

They are not in MUTANTS: `convcheck selftest` runs the default oracles, and the quant oracle needs its options (the
ignore over-match needs the target config QUANT_OVERMATCH_CONFIG). tests/test_quant_ranks.py runs each and asserts the
whole verdict; every finding names the tensor, the block and the first differing element (or the missing scale).
"""

from __future__ import annotations

from convcheck.mutants.mutant import HOOKS as _M
from convcheck.mutants.mutant import Mutant

FP8 = "tiny:qwen3-moe-fp8"
QUANT_OVERMATCH_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
    "modules_to_not_convert": ["model.layers.0.mlp.experts.1"],
}
"""The target quantization_config of quant_ignore_overmatch: layer 0's expert 1 stays bf16, and only it."""

QUANT_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="quant_other_division",
        description="the sender quantizes with 1 / (448 / amax) and x * (448 / amax) where the reference divides by "
        "amax / 448",
        hook=_M + "quant:other_division",
        fixture=FP8,
        layout="tp1",
        catches=("quant",),
        targets=("model.layers.*.weight", "model.layers.*.weight_scale_inv"),
    ),
    Mutant(
        name="quant_per_shard",
        description="each shard quantized as two column halves with their own amax (a shard boundary inside a "
        "block), the first half's scale sent",
        hook=_M + "quant:per_shard",
        fixture=FP8,
        layout="tp1",
        catches=("quant",),
        targets=("model.layers.*.weight", "model.layers.*.weight_scale_inv"),
    ),
    Mutant(
        name="quant_drop_scale",
        description="layer 1's o_proj fp8 weight is sent without its weight_scale_inv",
        hook=_M + "quant:drop_scale",
        fixture=FP8,
        layout="tp1",
        catches=("quant",),
        targets=("model.layers.1.self_attn.o_proj.weight_scale_inv",),
    ),
    Mutant(
        name="quant_stale_scale",
        description="a reused scale buffer: layer 1 expert 1's down_proj leaves with expert 0's scale",
        hook=_M + "quant:stale_scale",
        fixture=FP8,
        layout="tp1",
        catches=("quant",),
        targets=("model.layers.1.mlp.experts.1.down_proj.weight_scale_inv",),
    ),
    Mutant(
        name="quant_ignore_overmatch",
        description="the ignore pattern model.layers.0.mlp.experts.1 read as a bare prefix: experts 10-15 of layer 0 "
        "stay bf16 too",
        hook=_M + "quant:ignore_overmatch",
        fixture=FP8,
        layout="tp1",
        catches=("quant",),
        targets=("model.layers.0.mlp.experts.1[0-5].*.weight",),
    ),
    Mutant(
        name="quant_wrong_grid",
        description="each expert's fused gate/up scaled over [256, 128] blocks, the scale repeated onto the "
        "[128, 128] grid",
        hook=_M + "quant:wrong_grid",
        fixture=FP8,
        layout="tp1",
        catches=("quant",),
        targets=("model.layers.*.mlp.experts.*.[gu][ap]*_proj.weight*",),
    ),
    Mutant(
        name="quant_bytes_without_scales",
        description="layer 0's fp8 weights are sent without any of their scales",
        hook=_M + "quant:bytes_without_scales",
        fixture=FP8,
        layout="tp1",
        catches=("quant",),
        targets=("model.layers.0.*.weight_scale_inv",),
    ),
)
"""The quant oracle's planted bugs."""

WIDE = "tiny:qwen3-moe-fp8-wide"
IMPORT_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="quant_import_transposed_grid",
        description="the FP8 import (DeepSeek-V3's dequantizing loader on Qwen3-MoE) reads each scale grid transposed",
        hook=_M + "quant_import:transposed_grid",
        fixture=WIDE,
        layout="tp1",
        catches=("quant-import",),
        targets=(
            "decoder.layers.*.self_attention.linear_qkv.weight",
            "decoder.layers.*.self_attention.linear_proj.weight",
        ),
    ),
    Mutant(
        name="quant_import_dropped_scale",
        description="the FP8 import (DeepSeek-V3's dequantizing loader on Qwen3-MoE) drops layer 1's o_proj scale",
        hook=_M + "quant_import:dropped_scale",
        fixture=WIDE,
        layout="tp1",
        catches=("quant-import",),
        targets=("decoder.layers.1.self_attention.linear_proj.weight",),
    ),
)
"""The quant-import oracle's planted bugs (hooks in convcheck.mutants.quant_import): each named by the Megatron
parameter and its first differing element."""
