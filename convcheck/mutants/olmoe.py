"""Planted OLMoE bugs: the full-width q/k norms loaded as if split over TP, q_norm and k_norm traded, routed experts
out of order. Each patches the real Megatron-Bridge classes at run time."""

from __future__ import annotations

import re
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.mapping_registry import MegatronMappingRegistry
from megatron.bridge.models.conversion.param_mapping import AutoMapping

from convcheck.mutants.patch import wrap

Q_NORM_0 = "decoder.layers.0.self_attention.q_layernorm.weight"


def qk_norm_sharded() -> None:
    """The import treats layer 0's q_norm as split by heads over TP: each rank writes only its own heads' block
    `[r * W / tp, (r + 1) * W / tp)` of the full-width parameter, which keeps its pre-load values elsewhere."""

    def make(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            shard = original(self, hf_weights, megatron_module)
            if self.megatron_param != Q_NORM_0 or self.tp_size == 1:
                return shard
            width = shard.shape[0] // self.tp_size
            own = slice(self.tp_rank * width, (self.tp_rank + 1) * width)
            out = megatron_module.weight.detach().clone()
            out[own] = shard[own]
            return out

        return hf_to_megatron

    wrap(AutoMapping, "hf_to_megatron", make)


def _rename_resolved(change: Any) -> None:
    """Every mapping the registry resolves (for import and export alike) is rebuilt with `change(megatron, hf)` as its
    HF name(s): a bug made identically both ways, which a roundtrip cannot see."""

    def make(original):  # type: ignore[no-untyped-def]
        def resolve_mapping(self, mapping, captures):  # type: ignore[no-untyped-def]
            resolved = original(self, mapping, captures)
            hf = resolved.hf_param
            renamed = {k: change(resolved.megatron_param, v) for k, v in hf.items()} if isinstance(hf, dict) else None
            if renamed is not None and renamed != hf:
                return self._prepare_mapping(type(resolved)(resolved.megatron_param, **renamed))
            if isinstance(hf, str) and change(resolved.megatron_param, hf) != hf:
                return self._prepare_mapping(
                    type(resolved)(resolved.megatron_param, change(resolved.megatron_param, hf))
                )
            return resolved

        return resolve_mapping

    wrap(MegatronMappingRegistry, "resolve_mapping", make)


def qk_norms_swapped() -> None:
    """Every layer's q_layernorm maps to HF k_norm and k_layernorm to q_norm (import and export)."""
    swap = {"self_attn.q_norm.": "self_attn.k_norm.", "self_attn.k_norm.": "self_attn.q_norm."}

    def change(megatron: str, hf: str) -> str:
        if "_layernorm" not in megatron:
            return hf
        return next((hf.replace(a, b) for a, b in swap.items() if a in hf), hf)

    _rename_resolved(change)


def experts_misordered() -> None:
    """Layer 0's routed experts 0 and 1 trade HF tensors (grouped experts, import and export)."""
    pattern = re.compile(r"^(model\.layers\.0\.mlp\.experts\.)([01])(\..*)$")

    def change(megatron: str, hf: str) -> str:
        match = pattern.match(hf)
        return f"{match[1]}{1 - int(match[2])}{match[3]}" if match else hf

    _rename_resolved(change)
