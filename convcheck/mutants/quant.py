"""Planted quantized-refit bugs (the quant oracle's catalog, convcheck.mutants.catalog_quant): each patches the real
bridge's quantized export (MegatronQuantizationBridge.stream_weights_megatron_to_hf_quant, the quant_fn it is handed
or GatedMLPMapping's quantized path) the way a sender's bug would look."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.param_mapping import GatedMLPMapping
from megatron.bridge.models.conversion.quant_bridge import MegatronQuantizationBridge

from convcheck.mutants.patch import wrap

SCALE = "_scale_inv"


def _patch_quant_export(
    change_fn: Callable[[Any], Any] | None = None,
    change_checker: Callable[[Any], Any] | None = None,
    transform: Callable[[Iterator[tuple[str, Any]]], Iterator[tuple[str, Any]]] | None = None,
) -> None:
    """Wrap the bridge's quantized export: its quant_fn, its quantization_checker and / or its output stream."""

    def make(original: Any) -> Any:
        def stream(self, model, hf_pretrained, quantization_checker, quant_fn, *args, **kwargs):  # type: ignore[no-untyped-def]
            checker = change_checker(quantization_checker) if change_checker else quantization_checker
            fn = change_fn(quant_fn) if change_fn else quant_fn
            out = original(self, model, hf_pretrained, checker, fn, *args, **kwargs)
            yield from transform(iter(out)) if transform else out

        return stream

    wrap(MegatronQuantizationBridge, "stream_weights_megatron_to_hf_quant", make)


def other_division() -> None:
    """The sender quantizes with NeMo-RL's arithmetic (x * (448 / amax), scale 1 / (448 / amax)) where the receiver's
    reference divides (x / (amax / 448), scale amax / 448)."""
    from convcheck.quant.reference import fp8_nemo_rl

    _patch_quant_export(change_fn=lambda _fn: lambda w, block: fp8_nemo_rl(w, tuple(block)))


def per_shard() -> None:
    """Every shard is quantized as two column halves, each with its own block amax (a shard boundary inside a
    block), and the block's first half's scale is sent: blocks the halves cut differ where the halves' amax do."""

    def change(fn: Any) -> Any:
        def quant(w: Any, block: Any) -> Any:
            half = w.shape[1] // 2
            (q_left, s_left), (q_right, _) = fn(w[:, :half].contiguous(), block), fn(w[:, half:].contiguous(), block)
            if half % block[1] == 0:  # block-aligned halves: exactly the whole-tensor quantization
                return fn(w, block)
            return torch.cat([q_left, q_right], dim=1), s_left

        return quant

    _patch_quant_export(change_fn=change)


def drop_scale() -> None:
    """The sender never sends layer 1's o_proj weight_scale_inv (its fp8 weight goes alone)."""
    dropped = "model.layers.1.self_attn.o_proj.weight" + SCALE
    _patch_quant_export(transform=lambda items: ((n, t) for n, t in items if n != dropped))


def stale_scale() -> None:
    """A scale buffer the sender reuses: layer 1 expert 1's down_proj leaves with expert 0's scale."""

    def transform(items: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        kept = None
        for name, tensor in items:
            if name == "model.layers.1.mlp.experts.0.down_proj.weight" + SCALE:
                kept = tensor.clone()
            if name == "model.layers.1.mlp.experts.1.down_proj.weight" + SCALE and kept is not None:
                tensor = kept
            yield name, tensor

    _patch_quant_export(transform=transform)


def ignore_overmatch() -> None:
    """The sender reads its ignore pattern `model.layers.0.mlp.experts.1` as a prefix with no dot boundary (as
    transformers' re.match does): layer 0's experts 10-15 stay bf16 with expert 1."""
    loose = re.compile(r"decoder\.layers\.0\.mlp\.experts\.local_experts\.1")

    def change(checker: Any) -> Any:
        return lambda name: checker(name) and not loose.match(str(name))

    _patch_quant_export(change_checker=change)


def wrong_grid() -> None:
    """The fused gate/up of every expert is quantized over [2 b0, b1] blocks (one scale for a gate block and the up
    block beside it), its scale repeated to the [b0, b1] grid: shapes right, values wrong."""

    def make(original: Any) -> Any:
        def megatron_to_hf_quant(self, weights, module, checker, quant_fn, block=None):  # type: ignore[no-untyped-def]
            def coarse(w: Any, b: Any) -> Any:
                q, scale = quant_fn(w, (2 * b[0], b[1]))
                return q, scale.repeat_interleave(2, dim=0)

            return original(self, weights, module, checker, coarse, block)

        return megatron_to_hf_quant

    wrap(GatedMLPMapping, "megatron_to_hf_quant", make)


def bytes_without_scales() -> None:
    """The sender sends layer 0's fp8 weights without any of their scales."""
    _patch_quant_export(
        transform=lambda items: (
            (n, t) for n, t in items if not (n.startswith("model.layers.0.") and n.endswith(SCALE))
        )
    )
