"""Reference quantizers and their dequantizers, as plain functions over tensors (rank side: torch at module top).

Each quantizer takes one whole 2-D weight `x` [M, N] (the bf16 export of an HF tensor) and a block [b0, b1] and
returns (q, *scales) exactly as the arithmetic in `convcheck.quant.catalog.FORMATS` says; each dequantizer returns
float32 [M, N]. `fp8_bound` and `nvfp4_bound` give, element by element, the largest |dequantize(quantize(x)) - x|
the format's rounding allows (`fp8_error` measures it on the block view).

The FP8 and MXFP8 references upcast x to float32 first: bf16 and fp16 widen exactly, a block's amax is the same value
in either dtype, and a bf16 operand meeting a float32 one is widened anyway, so the bits are those of the formulas as
written on bf16 operands (tests/test_quant_reference.py), in under half the time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from convcheck.errors import BadInput

FP8_MAX = 448.0
"""Largest finite float8_e4m3fn value."""
E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
"""Round-to-nearest thresholds between the E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6."""
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The value of each 4-bit E2M1 code (bit 3 the sign)."""


def grid(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    """The scale grid of a [M, N] weight: [ceil(M / b0), ceil(N / b1)]."""
    return -(-shape[0] // block[0]), -(-shape[1] // block[1])


def _blocks(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """`x` [M, N] padded with zeros (its dtype) to whole blocks, viewed as [R, b0, C, b1] (no copy where the block
    divides it)."""
    b0, b1 = block
    rows, cols = -x.shape[0] % b0, -x.shape[1] % b1
    padded = F.pad(x, (0, cols, 0, rows), mode="constant", value=0.0) if rows or cols else x
    return padded.reshape(padded.shape[0] // b0, b0, padded.shape[1] // b1, b1)


def _owned_blocks(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """A float32 copy of `x`, zero-padded to whole blocks, viewed as [R, b0, C, b1]: the caller may write into it."""
    return _blocks(x.to(torch.float32, copy=True), block)


def _block_amax(v: torch.Tensor) -> torch.Tensor:
    """max |x| over each block of `v` [R, b0, C, b1] as [R, 1, C, 1]: max(|max x|, |min x|), the same value as
    v.abs().amax() without a full-size temporary (NaN where the block holds one)."""
    top, bottom = v.amax(dim=(1, 3), keepdim=True), v.amin(dim=(1, 3), keepdim=True)
    return torch.maximum(top.abs_(), bottom.abs_())


def _unblock(v: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """[R, b0, C, b1] back to [M, N] with the padding cut off (contiguous)."""
    return v.reshape(v.shape[0] * v.shape[1], v.shape[2] * v.shape[3])[: shape[0], : shape[1]].contiguous()


def _check_2d(x: torch.Tensor, who: str) -> None:
    if x.dim() != 2:
        raise BadInput(f"{who} quantizes 2-D weights, got shape {list(x.shape)}")


def fp8_block(x: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """slime / verl: (q float8_e4m3fn [M, N], weight_scale_inv float32 [ceil(M/b0), ceil(N/b1)]).

    scale = float32(amax) / 448; q = fp8(clamp(x / scale, -448, 448)); zero padding at the edge blocks."""
    _check_2d(x, "fp8-block")
    v = _owned_blocks(x, block)
    scale = _block_amax(v) / FP8_MAX
    q = v.div_(scale).clamp_(min=-FP8_MAX, max=FP8_MAX).to(torch.float8_e4m3fn)
    return _unblock(q, tuple(x.shape)), scale.reshape(v.shape[0], v.shape[2])


def fp8_nemo_rl(x: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """NeMo-RL: (q float8_e4m3fn [M, N], weight_scale_inv float32 [M/b0, N/b1]); M, N multiples of the block.

    s = 448 / amax (1 where amax is 0 or inf); q = fp8(clamp(x * s, -448, 448)); weight_scale_inv = 1 / s."""
    _check_2d(x, "fp8-nemo-rl")
    if x.shape[0] % block[0] or x.shape[1] % block[1]:
        raise BadInput(f"fp8-nemo-rl needs a weight the block {list(block)} divides, got {list(x.shape)}")
    v = _owned_blocks(x, block)
    amax = _block_amax(v)
    s = torch.where((amax == 0) | (amax == torch.inf), torch.ones_like(amax), FP8_MAX / amax)
    q = v.mul_(s).clamp_(min=-FP8_MAX, max=FP8_MAX).to(torch.float8_e4m3fn)
    return _unblock(q, tuple(x.shape)), torch.reciprocal(s).reshape(v.shape[0], v.shape[2])


def fp8_ue8m0(x: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM / SGLang UE8M0: (q float8_e4m3fn [M, N], weight_scale_inv float32 powers of two [R, C]).

    s = 2^ceil(log2(max(amax, 1e-4) / 448)); q = fp8(x * (1 / s)), no clamp; zero padding at the edge blocks."""
    _check_2d(x, "fp8-ue8m0")
    v = _owned_blocks(x, block)
    amax = _block_amax(v).clamp(min=1e-4)
    s = torch.pow(2.0, torch.ceil(torch.log2(amax / FP8_MAX)))
    q = v.mul_(1.0 / s).to(torch.float8_e4m3fn)
    return _unblock(q, tuple(x.shape)), s.reshape(v.shape[0], v.shape[2])


def mxfp8(x: torch.Tensor, block: tuple[int, int] = (1, 32)) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MX / ModelOpt MXFP8: (q float8_e4m3fn [M, N], weight_scale uint8 E8M0 [M, ceil(N/32)]).

    e = clamp(ceil(log2(amax / 448)), -127, 127) (-127 for an all-zero block); scale = e + 127;
    q = fp8(clamp(x * 2^-e, -448, 448))."""
    _check_2d(x, "mxfp8")
    v = _owned_blocks(x, block)
    descale = _block_amax(v) / FP8_MAX
    safe = torch.where(descale > 0, descale, torch.ones_like(descale))
    e = torch.where(descale > 0, torch.ceil(torch.log2(safe)), torch.full_like(descale, -127.0)).clamp(-127, 127)
    scale = (e + 127).to(torch.uint8)
    q = v.mul_(torch.exp2(127 - scale.to(torch.float32))).clamp_(min=-FP8_MAX, max=FP8_MAX).to(torch.float8_e4m3fn)
    return _unblock(q, tuple(x.shape)), scale.reshape(v.shape[0], v.shape[2])


def nvfp4(x: torch.Tensor, block: tuple[int, int] = (1, 16)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ModelOpt NVFP4: (packed uint8 [M, N/2], weight_scale float8_e4m3fn [M, N/16], weight_scale_2 float32 []).

    weight_scale_2 = amax(x) / (6 * 448); weight_scale = fp8(clamp(amax_block / (6 * weight_scale_2) or 1, 2^-9,
    448)); each element rounded to E2M1 (ties to even) after dividing by weight_scale * weight_scale_2."""
    _check_2d(x, "nvfp4")
    if block[0] != 1 or x.shape[1] % block[1] or block[1] % 2:
        raise BadInput(
            f"nvfp4 needs 1-row blocks of an even width dividing N, got block {list(block)}, {list(x.shape)}"
        )
    global_scale = x.abs().amax().to(torch.float32) / (6.0 * FP8_MAX)
    v = _blocks(x, block)
    per_block = v.abs().amax(dim=(1, 3), keepdim=True).to(torch.float32) / (6.0 * global_scale)
    per_block = torch.where(per_block == 0, torch.ones_like(per_block), per_block)
    weight_scale = per_block.clamp(min=2.0**-9, max=FP8_MAX).to(torch.float8_e4m3fn)
    scaled = v / (weight_scale.to(torch.float32) * global_scale)
    codes = e2m1_codes(_unblock(scaled, tuple(x.shape)))
    packed = (codes[:, 1::2] << 4) | codes[:, 0::2]
    return packed.contiguous(), weight_scale.reshape(v.shape[0], v.shape[2]), global_scale.reshape(())


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """4-bit E2M1 codes (uint8) of float32 `v`: sign bit 3 for v < 0; the magnitude rounded to nearest, ties to
    even, saturating at 6."""
    bounds = torch.tensor(E2M1_BOUNDS, dtype=torch.float32)
    magnitude = v.abs()
    index = torch.searchsorted(bounds, magnitude.contiguous(), out_int32=True).to(torch.uint8)
    tie_up = (magnitude.unsqueeze(-1) == bounds[[1, 3, 5]]).any(dim=-1).to(torch.uint8)
    return ((v < 0).to(torch.uint8) << 3) + index + tie_up


def expand(scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, ...]) -> torch.Tensor:
    """A [R, C] scale grid as float32 [M, N]: each scale over its block, cut at the edges."""
    s = scale.to(torch.float32).reshape(grid(shape, block))
    return s.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)[: shape[0], : shape[1]]


def dequant_fp8(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float32(q) * scale, the scale a float32 multiplier per block (weight_scale_inv)."""
    return q.to(torch.float32) * expand(scale, block, tuple(q.shape))


def dequant_mxfp8(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float32(q) * 2^(scale - 127), the scale uint8 E8M0."""
    return q.to(torch.float32) * expand(torch.exp2(scale.to(torch.float32) - 127), block, tuple(q.shape))


def dequant_nvfp4(
    packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """E2M1 value of each nibble * float32(weight_scale) * weight_scale_2, as float32 [M, 2 * packed cols]."""
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    shape = tuple(codes.shape)
    return values[codes] * expand(weight_scale, block, shape) * weight_scale_2.to(torch.float32)


def fp8_bound(x: torch.Tensor, multiplier: torch.Tensor) -> torch.Tensor:
    """Largest |dequant - x| of an E4M3 element with block multiplier s (float32 [M, N]): half an E4M3 step at |x|,
    at most 2^-4 |x| for normal values and 2^-10 s below 2^-6 s, plus 2^-20 |x| of float32 rounding."""
    magnitude = x.to(torch.float32).abs()
    return magnitude * 2.0**-4 + multiplier * 2.0**-10 + magnitude * 2.0**-20


def fp8_error(
    x: torch.Tensor, q: torch.Tensor, multiplier: torch.Tensor, block: tuple[int, int]
) -> tuple[float, float]:
    """(worst |dequant - x| / fp8_bound, max |dequant - x|) of an E4M3 weight with one float32 multiplier per block
    ([R, C]), computed on the block view (dequant = float32(q) * multiplier, as dequant_fp8)."""
    xv = _blocks(x.to(torch.float32), block)
    s = multiplier.to(torch.float32).reshape(xv.shape[0], 1, xv.shape[2], 1)
    err = _blocks(q.to(torch.float32), block).mul_(s).sub_(xv).abs_()
    bound = xv.abs_().mul_(2.0**-4 + 2.0**-20).add_(s * 2.0**-10)
    worst_error = float(err.max()) if err.numel() else 0.0
    return (float(err.div_(bound).max()) if err.numel() else 0.0), worst_error


def nvfp4_bound(x: torch.Tensor, multiplier: torch.Tensor) -> torch.Tensor:
    """Largest |dequant - x| of an E2M1 element with multiplier S (float32 [M, N]): half an E2M1 step, max(S / 4,
    |x| / 4), which also covers saturation at 6 after the fp8 rounding of the block scale."""
    magnitude = x.to(torch.float32).abs()
    return torch.maximum(multiplier / 4, magnitude / 4) + magnitude * 2.0**-20


QuantFn = Callable[..., tuple[torch.Tensor, ...]]
REFERENCES: dict[str, QuantFn] = {
    "fp8_block": fp8_block,
    "fp8_nemo_rl": fp8_nemo_rl,
    "fp8_ue8m0": fp8_ue8m0,
    "mxfp8": mxfp8,
    "nvfp4": nvfp4,
}
"""catalog.QuantFormat.function -> its reference implementation."""
