"""Planted Qwen3.5-VL bugs through the real Megatron-Bridge objects: the MTP layer's eh_proj reading its two inputs
swapped, the merged image tokens reaching the language model in reverse order."""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.param_mapping import AutoMapping
from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

from convcheck.mutants.patch import transform_hf_symmetrically, wrap

EH_PROJ = "language_model.mtp.layers.0.eh_proj.weight"


def _halves_swapped(weight: torch.Tensor) -> torch.Tensor:
    """`[rows, 2H]` with its column halves exchanged: `[W_hidden, W_embedding]` for `[W_embedding, W_hidden]`."""
    first, second = weight.chunk(2, dim=1)
    return torch.cat([second, first], dim=1).contiguous()


def mtp_inputs_swapped() -> None:
    """The MTP layer's eh_proj `[H, 2H]` (HF `mtp.fc`, reading `[enorm(embedding); hnorm(hidden)]`) is imported with
    its column halves exchanged and exported exchanged back (the same bug both ways, a roundtrip cannot see it): the
    MTP layer applies the embedding's weights to the hidden state and the hidden state's to the embedding."""

    transform_hf_symmetrically(AutoMapping, EH_PROJ, _halves_swapped, _halves_swapped)


def image_tokens_reversed() -> None:
    """The vision tower hands its merged image tokens `[tokens, D]` to the language model in reverse order (a merge
    window order that does not match the image-token placeholders): each image token gets another window's
    embedding. No weight changes; only the logits oracle's image pass can see it."""

    def make(original):  # type: ignore[no-untyped-def]
        def forward(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[no-untyped-def]
            embeds, deepstack = original(self, *args, **kwargs)
            return embeds.flip(0), deepstack

        return forward

    wrap(Qwen3VLVisionModel, "forward", make)
