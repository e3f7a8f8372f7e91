"""The reference quantizers convcheck ships, as data (no torch): name, block, scales and the exact arithmetic of each;
and the `--quantizer NAME|FILE.py:FUNC` spelling, checked on the launcher side."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convcheck.errors import BadInput
from convcheck.hooks import parse_hook


@dataclass(frozen=True, kw_only=True, slots=True)
class QuantFormat:
    """One reference quantizer (its code: `convcheck.quant.reference`, function `function`)."""

    name: str
    """What `--quantizer` calls it."""
    used_by: str
    """Who quantizes this way."""
    block: tuple[int, int]
    """[rows, cols] of the weight one scale covers."""
    element: str
    """The element type of the quantized weight as sent."""
    scales: tuple[tuple[str, str], ...]
    """(checkpoint suffix after the module name, dtype) of each scale, in the order the quantizer returns them."""
    function: str
    """Its function in convcheck.quant.reference."""
    arithmetic: str
    """The exact arithmetic: division, epsilon, clamp, rounding, edge padding (docs/quant.md prints it)."""
    bridge: bool = True
    """It fits the bridge's `export_hf_weights_quant(quant_fn=...)`: one weight and one scale per call."""

    @property
    def scale_count(self) -> int:
        return len(self.scales)


_FP8_CAST = (
    "the cast is torch's float32 -> float8_e4m3fn (round to nearest, ties to even; |v| >= 480 would give NaN, no "
    "saturation)"
)
FORMATS: dict[str, QuantFormat] = {
    f.name: f
    for f in (
        QuantFormat(
            name="fp8-block",
            used_by="slime and verl (the bridge's bf16 export quantized in the weight sync), DeepSeek-V3 checkpoints",
            block=(128, 128),
            element="float8_e4m3fn",
            scales=(("weight_scale_inv", "float32"),),
            function="fp8_block",
            arithmetic="pad the weight with zeros to a multiple of the block (F.pad, constant 0, in its own dtype); "
            "amax = max |x| over the block in the weight's dtype, then float32; scale = amax / 448.0 (float32 "
            "division; no epsilon: an all-zero block gives scale 0 and NaN bytes); q = clamp(x / scale, -448, 448) "
            f"computed in float32 (bf16 x upcast exactly); {_FP8_CAST}; the padding is cut off; weight_scale_inv = "
            "scale, float32 [ceil(M/b0), ceil(N/b1)]",
        ),
        QuantFormat(
            name="fp8-nemo-rl",
            used_by="NeMo-RL (quantizes inside the vLLM worker: cast_tensor_to_fp8_blockwise)",
            block=(128, 128),
            element="float8_e4m3fn",
            scales=(("weight_scale_inv", "float32"),),
            function="fp8_nemo_rl",
            arithmetic="no padding: M and N must be multiples of the block; x upcast to float32; amax = max |x| over "
            "the block; s = 448.0 / amax, which torch computes for a Python float over a tensor as reciprocal(amax) "
            "* 448 (two float32 roundings), s = 1.0 where amax is 0 or inf; q = clamp(x * s, -448, 448); "
            f"{_FP8_CAST}; weight_scale_inv = torch.reciprocal(s), float32 [M/b0, N/b1] (1 / (448 / amax): differs "
            "from amax / 448 in the last bit of 40-60% of the scales)",
        ),
        QuantFormat(
            name="fp8-ue8m0",
            used_by="SGLang / vLLM on Blackwell requantizing for DeepGEMM (per_block_cast_to_fp8(use_ue8m0=True))",
            block=(128, 128),
            element="float8_e4m3fn",
            scales=(("weight_scale_inv", "float32"),),
            function="fp8_ue8m0",
            arithmetic="pad with zeros to a multiple of the block; amax = max |x| over the block in float32, clamped "
            "below at 1e-4; s = amax / 448.0 rounded up to a power of two: 2^ceil(log2(s)) (torch.log2, torch.ceil, "
            f"torch.pow); q = x * (1.0 / s) in float32, no clamp (|q| <= 448 since s >= amax / 448); {_FP8_CAST}; "
            "padding cut off; weight_scale_inv = s, float32 [ceil(M/b0), ceil(N/b1)], every value a power of two "
            "(the UE8M0 packing DeepGEMM applies afterwards is a layout, not part of this check)",
        ),
        QuantFormat(
            name="mxfp8",
            used_by="OCP MX / ModelOpt MXFP8 (MXFP8QTensor)",
            block=(1, 32),
            element="float8_e4m3fn",
            scales=(("weight_scale", "uint8"),),
            function="mxfp8",
            arithmetic="blocks of 32 along the last dim (zero padding to a multiple of 32); amax per block; d = "
            "float32(amax) / 448.0; e = ceil(log2(d)) where d > 0, else -127; e clamped to [-127, 127]; scale = "
            "e + 127 as uint8 (E8M0, a biased power-of-two exponent); q = clamp(x * 2^(127 - scale), -448, 448) in "
            f"float32 (torch.exp2); {_FP8_CAST}; scale uint8 [M, ceil(N/32)]",
        ),
        QuantFormat(
            name="nvfp4",
            used_by="ModelOpt NVFP4 (NVFP4QTensor, the bridge's export_hf_weights_modelopt)",
            block=(1, 16),
            element="E2M1 packed two per uint8 (even index in the low nibble)",
            scales=(("weight_scale", "float8_e4m3fn"), ("weight_scale_2", "float32")),
            function="nvfp4",
            arithmetic="weight_scale_2 = float32(max |x| of the whole tensor) / (6.0 * 448.0); blocks of 16 along the "
            "last dim (N a multiple of 16); s = float32(amax of the block) / (6.0 * weight_scale_2), s = 1.0 where "
            "it is 0, clamped to [2^-9, 448] and cast to float8_e4m3fn (weight_scale); v = x / (float32(weight_scale) "
            "* weight_scale_2) in float32; E2M1 code = (v < 0) << 3 | the index of |v| among the bounds 0.25, 0.75, "
            "1.25, 1.75, 2.5, 3.5, 5 (torch.searchsorted, left) plus 1 where |v| is exactly 0.75, 1.75 or 3.5 (ties "
            "to even; above 5 saturates at 6); packed (code[1::2] << 4) | code[0::2]: uint8 [M, N/2]",
            bridge=False,
        ),
    )
}
"""The reference quantizers, by --quantizer name."""


def parse_quantizer(spec: str) -> str:
    """`spec` as the Job stores it: a known name, or `FILE.py:FUNC` with FILE made absolute (it must exist and define
    FUNC at its top level, read with ast: nothing is imported here); BadInput naming the problem otherwise."""
    if spec in FORMATS:
        return spec
    if not spec.rpartition(":")[0].endswith(".py"):
        raise BadInput(f"unknown quantizer {spec!r}; known: {', '.join(FORMATS)}, or FILE.py:FUNC")
    hook = parse_hook(spec, what="quantizer")  # the form, and that the file exists
    file, func = hook.target, hook.function
    path = Path(file).expanduser().resolve()
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"quantizer file {file} does not parse: {exc}") from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    if func not in defined:
        raise BadInput(f"quantizer file {file} defines no top-level {func!r}")
    return f"{path}:{func}"


def is_custom(spec: str) -> bool:
    """True for a `FILE.py:FUNC` quantizer (the user's function, called as the bridge calls quant_fn)."""
    return spec not in FORMATS


def parse_block(value: int) -> int:
    """The `--quant-block` value: a positive width; BadInput otherwise."""
    if value < 1:
        raise BadInput(f"--quant-block must be a positive number of rows and columns, got {value}")
    return value


DEFAULT_BLOCK = 128


def block_of(quantization_config: dict[str, Any] | None) -> int:
    """The square block a quantization_config asks for (DEFAULT_BLOCK when it names none); BadInput for anything but
    an FP8 block config (quant_method fp8, fmt e4m3, weight_block_size [b, b])."""
    if quantization_config is None:
        return DEFAULT_BLOCK
    method, fmt = quantization_config.get("quant_method"), quantization_config.get("fmt", "e4m3")
    if method != "fp8" or fmt != "e4m3":
        raise BadInput(f"--fp8 writes FP8 block checkpoints (quant_method fp8, fmt e4m3); the config's "
                       f"quantization_config has quant_method {method!r}, fmt {fmt!r}")  # fmt: skip
    block = quantization_config.get("weight_block_size")
    if block is None:
        raise BadInput("--fp8 writes FP8 block checkpoints; the config's quantization_config names no "
                       "weight_block_size (a per-tensor FP8 checkpoint)")  # fmt: skip
    if not (isinstance(block, list) and len(block) == 2 and block[0] == block[1] and int(block[0]) > 0):
        raise BadInput(f"--fp8 needs a square weight_block_size [b, b], got {block!r}")
    return int(block[0])
