"""Planted bugs in the fused-expert export (Qwen3.6: `experts.gate_up_proj` / `experts.down_proj`):
`convcheck verify --hook convcheck.mutants.fused_experts:NAME` runs one in every rank.

Each patches a real Megatron-Bridge object: FusedGatedExpertMapping, or the EP gather its gated mapping runs.
"""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.param_mapping import FusedGatedExpertMapping, MegatronParamMapping

from convcheck.mutants.patch import wrap


def _layer0_gate_up(name: Any) -> bool:
    return str(name).startswith("model.layers.0.mlp.experts.gate_up_proj")


def gate_up_halves_swapped() -> None:
    """FusedGatedExpertMapping's export fuses [up; gate] instead of [gate; up] in layer 0 (the import is right)."""

    def make(original: Any) -> Any:
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            if not _layer0_gate_up(self.hf_param):
                return out
            return {n: torch.cat(list(t.chunk(2, dim=t.dim() - 2))[::-1], dim=t.dim() - 2) for n, t in out.items()}

        return megatron_to_hf

    wrap(FusedGatedExpertMapping, "megatron_to_hf", make)


def ep_gather_reversed() -> None:
    """The EP gather of layer 0's fused gate / up parts stacks the EP ranks' experts in reverse: expert e and
    e + E/ep trade slots of gate_up_proj at EP2 (the probe stubs the gather, so only the real export has it)."""

    def make(original: Any) -> Any:
        def gather_from_ep_ranks(self, megatron_weights, megatron_module, hf_param_name):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module, hf_param_name)
            if self.ep_size == 1 or not _layer0_gate_up(hf_param_name):
                return out
            return {n: t.flip(0) for n, t in out.items()}

        return gather_from_ep_ranks

    wrap(MegatronParamMapping, "gather_from_ep_ranks", make)
