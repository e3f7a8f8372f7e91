"""Planted Qwen3-VL bugs through the real Megatron-Bridge objects: the patch merger's fc1 transposed, the vision qkv
split without the per-head interleave, the deepstack features fed one language layer late."""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.param_mapping import AutoMapping, ConcatenatedQKVMapping
from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_block import Qwen3VLTransformerBlock

from convcheck.mutants.patch import transform_hf_symmetrically, wrap

MERGER_FC1 = "vision_model.merger.linear_fc1.weight"
QKV_0 = "vision_model.decoder.layers.0.self_attention.linear_qkv.weight"


def merger_transposed() -> None:
    """The patch merger's linear_fc1 `[4V, 4V]` is imported transposed and exported transposed back (the same bug
    both ways, a roundtrip cannot see it): every merged image token's embedding changes."""

    def transposed(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.t().contiguous()

    transform_hf_symmetrically(AutoMapping, MERGER_FC1, transposed, transposed)


def vision_qkv_unsplit() -> None:
    """Vision block 0's HF qkv `[q; k; v]` is imported as if it were already Megatron's per-head `[q_h; k_h; v_h]`
    layout (ConcatenatedQKVMapping's split and merge skipped); the export splits it right."""

    def make(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            if self.megatron_param != QKV_0:
                return original(self, hf_weights, megatron_module)
            return self._tp_mapping.hf_to_megatron(hf_weights if self.tp_rank == 0 else None, megatron_module)

        return hf_to_megatron

    wrap(ConcatenatedQKVMapping, "hf_to_megatron", make)


def deepstack_off_by_one() -> None:
    """The language model adds deepstack feature k after layer k + 1 instead of k (layer 0 gets none): the features
    of vision block `deepstack_visual_indexes[k]` reach the wrong language layer."""

    def make(original):  # type: ignore[no-untyped-def]
        def forward(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[no-untyped-def]
            embeds = kwargs.get("deepstack_visual_embeds")
            if embeds:
                kwargs["deepstack_visual_embeds"] = [torch.zeros_like(embeds[0]), *embeds]
            return original(self, *args, **kwargs)

        return forward

    wrap(Qwen3VLTransformerBlock, "forward", make)
