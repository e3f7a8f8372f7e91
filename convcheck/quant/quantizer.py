"""A quantizer as the quant oracle runs it (rank side): a reference from the catalog or the user's `FILE.py:FUNC`,
with its block, its dequantizer and its error bound; `load_quantizer` probes a user function once before any export."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from convcheck.errors import BadInput, one_line
from convcheck.hooks import load_hook
from convcheck.quant import reference as ref
from convcheck.quant.catalog import FORMATS, QuantFormat, is_custom

FP8_BLOCK_SCALE = (("weight_scale_inv", "float32"),)
"""What a user's FILE.py:FUNC returns beside the weight: the bridge's quant_fn contract (one float32 multiplier per
block, named `<weight>_scale_inv` by the bridge)."""


@dataclass(frozen=True, kw_only=True)
class Quantizer:
    """One quantizer at one block size."""

    spec: str
    """The --quantizer value (a catalog name or an absolute FILE.py:FUNC)."""
    block: tuple[int, int]
    element: torch.dtype
    """The dtype of the quantized weight."""
    scales: tuple[tuple[str, str], ...]
    """(checkpoint suffix, dtype name) of each scale, in return order."""
    function: Callable[..., tuple[torch.Tensor, ...]]
    """(x [M, N], block) -> (q, *scales)."""
    bridge: bool
    """One weight and one scale per call: it can be handed to export_hf_weights_quant as quant_fn."""
    calls: dict[str, int] = field(default_factory=lambda: {"total": 0, "autograd": 0})
    """How often the bridge called bridge_fn, and how often with autograd on and a weight that requires grad."""
    reuse: Any = None
    """A convcheck.quant.reuse.BlockReuse that keeps every bridge_fn result for the reference (None: none kept)."""

    @property
    def reusable(self) -> bool:
        """A built-in 2-D block quantizer: each block's bytes and scale depend on that block alone
        (convcheck.quant.reuse)."""
        return not is_custom(self.spec) and self.block[0] > 1 and self.bridge

    @property
    def label(self) -> str:
        return f"{self.spec.rpartition('/')[2]} {self.block[0]}x{self.block[1]}"

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            return tuple(self.function(x.detach(), self.block))

    def bridge_fn(self, weight: torch.Tensor, block: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The quant_fn the bridge calls on each shard (block as the bridge passes it back), outside autograd: the
        bridge hands it the Megatron parameter itself with autograd on, and the in-place steps of these references
        would otherwise leave graphs that keep their float32 copies alive (~430 MB per export measured)."""
        self.calls["total"] += 1
        if torch.is_grad_enabled() and weight.requires_grad:
            self.calls["autograd"] += 1
        size = tuple(block) if block is not None else self.block
        with torch.no_grad():
            q, scale = self.function(weight.detach(), size)
            if self.reuse is not None:
                self.reuse.keep(weight.detach(), size, q, scale)
        return q, scale

    def dequantize(self, q: torch.Tensor, scales: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """float32 [M, N] from the weight as sent and its scales."""
        if self.element == torch.uint8:
            return ref.dequant_nvfp4(q, scales[0], scales[1], self.block)
        if self.scales[0][1] == "uint8":
            return ref.dequant_mxfp8(q, scales[0], self.block)
        return ref.dequant_fp8(q, scales[0], self.block)

    def error(self, x: torch.Tensor, out: tuple[torch.Tensor, ...]) -> tuple[float, float]:
        """(worst |dequantize(q) - x| / bound, max |dequantize(q) - x|) of `out` = quantize(x)."""
        q, scales = out[0], tuple(out[1:])
        if self.element == torch.uint8:
            err = (self.dequantize(q, scales) - x.to(torch.float32)).abs()
            return float((err / self.bound(x, scales)).max()), float(err.max())
        multiplier = scales[0].to(torch.float32)
        if self.scales[0][1] == "uint8":
            multiplier = torch.exp2(multiplier - 127)
        return ref.fp8_error(x, q, multiplier, self.block)

    def bound(self, x: torch.Tensor, scales: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The largest |dequantize(quantize(x)) - x| the format's rounding allows, element by element."""
        shape = tuple(x.shape)
        if self.element == torch.uint8:
            multiplier = ref.expand(scales[0], self.block, shape) * scales[1].to(torch.float32)
            return ref.nvfp4_bound(x, multiplier)
        if self.scales[0][1] == "uint8":
            return ref.fp8_bound(x, ref.expand(torch.exp2(scales[0].to(torch.float32) - 127), self.block, shape))
        return ref.fp8_bound(x, ref.expand(scales[0], self.block, shape))


def load_quantizer(spec: str, block: int | None) -> Quantizer:
    """The quantizer `spec` at `block` (rows = cols = block for 2-D formats, cols for 1-row formats; None: the
    format's own); a user's function is probed once on a [2 b0, 2 b1] bf16 weight: BadInput (exit 2, one line) when
    it raises or returns other than (float8_e4m3fn [M, N], float32 [2, 2])."""
    if not is_custom(spec):
        fmt: QuantFormat = FORMATS[spec]
        size = fmt.block if block is None else (block, block) if fmt.block[0] > 1 else (1, block)
        element = torch.uint8 if fmt.name == "nvfp4" else torch.float8_e4m3fn
        return Quantizer(spec=spec, block=size, element=element, scales=fmt.scales,
                         function=ref.REFERENCES[fmt.function], bridge=fmt.bridge)  # fmt: skip
    size = (block or 128, block or 128)
    quantizer = Quantizer(spec=spec, block=size, element=torch.float8_e4m3fn, scales=FP8_BLOCK_SCALE,
                          function=_user_function(spec), bridge=True)  # fmt: skip
    _probe(quantizer)
    return quantizer


def _user_function(spec: str) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The user's FILE.py:FUNC (convcheck.hooks.load_hook); BadInput in one line when importing it raises."""
    try:
        function = load_hook(spec, what="quantizer")
    except BadInput:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's file: any failure is bad input, said in one line
        raise BadInput(f"quantizer {spec}: importing it raised {one_line(exc)}") from None
    if not callable(function):
        raise BadInput(f"quantizer {spec} is not callable")
    return function


def _probe(quantizer: Quantizer) -> None:
    """Call a user's quantizer once on a small distinct-valued bf16 weight and check what it returns."""
    b0, b1 = quantizer.block
    x = ((torch.arange(4 * b0 * b1, dtype=torch.float32) % 4093 + 1) / 4096).reshape(2 * b0, 2 * b1)
    try:
        out = quantizer.bridge_fn(x.to(torch.bfloat16), quantizer.block)
    except Exception as exc:  # noqa: BLE001 - the user's function: any failure is bad input, said in one line
        raise BadInput(f"quantizer {quantizer.spec} raised {one_line(exc)} on a {list(x.shape)} bf16 weight") from None
    if not isinstance(out, tuple) or len(out) != 2 or not all(isinstance(t, torch.Tensor) for t in out):
        raise BadInput(f"quantizer {quantizer.spec} must return (weight, scale) tensors, got {type(out).__name__}")
    q, scale = out
    if q.dtype != torch.float8_e4m3fn or tuple(q.shape) != tuple(x.shape):
        raise BadInput(
            f"quantizer {quantizer.spec} returned a {str(q.dtype).removeprefix('torch.')} {list(q.shape)} weight "
            f"for a {list(x.shape)} bf16 one, expected float8_e4m3fn {list(x.shape)}"
        )
    if scale.dtype != torch.float32 or scale.numel() != 4:
        raise BadInput(
            f"quantizer {quantizer.spec} returned a {str(scale.dtype).removeprefix('torch.')} {list(scale.shape)} "
            f"scale for {b0}x{b1} blocks of a {list(x.shape)} weight, expected float32 [2, 2]"
        )
