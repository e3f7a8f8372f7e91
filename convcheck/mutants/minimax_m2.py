"""Planted MiniMax-M2 bugs, each patching the real Megatron-Bridge classes at run time: layer 0's router expert bias
left at its initial zeros, layer 0's full-width k_norm rows loaded from the other TP rank's heads, the partial RoPE
turned full."""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.param_mapping import AutoMapping
from megatron.bridge.models.minimax_m2.minimax_m2_bridge import MiniMaxM2Bridge, _FullDimQKNormMapping

from convcheck.mutants.patch import alter_provider, wrap

EXPERT_BIAS_0 = "decoder.layers.0.mlp.router.expert_bias"
K_NORM_0 = "decoder.layers.0.self_attention.k_layernorm.weight"


def expert_bias_at_init() -> None:
    """The import leaves layer 0's router expert_bias (HF block_sparse_moe.e_score_correction_bias) at its initial
    zeros: the top-k choice loses its correction."""

    def make(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, hf_weights, megatron_module)
            return torch.zeros_like(out) if self.megatron_param == EXPERT_BIAS_0 else out

        return hf_to_megatron

    wrap(AutoMapping, "hf_to_megatron", make)


def k_norm_rows_of_other_rank() -> None:
    """The import gives TP rank r the rows of rank tp - 1 - r in layer 0's full-width k_layernorm (each rank's norm
    weights another rank's heads); the export gathers them in rank order."""
    state = {"importing": False}

    def make_import(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            state["importing"] = self.megatron_param == K_NORM_0
            try:
                return original(self, hf_weights, megatron_module)
            finally:
                state["importing"] = False

        return hf_to_megatron

    def make_spec(original):  # type: ignore[no-untyped-def]
        def _get_shard_spec(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
            world, rank = original(self, *args, **kwargs)
            return (world, world - 1 - rank) if state["importing"] else (world, rank)

        return _get_shard_spec

    wrap(_FullDimQKNormMapping, "hf_to_megatron", make_import)
    wrap(_FullDimQKNormMapping, "_get_shard_spec", make_spec)


def rotary_dim_ignored() -> None:
    """The provider keeps rotary_percent 1.0 (rotary_dim not read): every channel of each head rotates, where
    MiniMax-M2 rotates rotary_dim of them."""

    def change(provider: Any) -> None:
        provider.rotary_percent = 1.0

    alter_provider(change, MiniMaxM2Bridge)
