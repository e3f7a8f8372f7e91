"""Planted Nemotron-3 MTP bugs through the real megatron-bridge NemotronHBridge: the MTP block's enorm and hnorm
swapped, and each MTP inner layer's pre-norm taken from the other inner layer (the flattened MTP index reversed).

Both wrap `_MTPFlatteningMapping.resolve` (nemotronh/nemotron_h_bridge.py), which import and export share, so the
bug is the same both ways: a roundtrip cannot see it, the mapping oracle names it."""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.param_mapping import AutoMapping
from megatron.bridge.models.nemotronh import nemotron_h_bridge

from convcheck.mutants.patch import wrap

SWAPPED_NORMS = {"enorm.weight": "hnorm.weight", "hnorm.weight": "enorm.weight"}
INNER_NORMS = (".self_attention.linear_qkv.layer_norm_weight", ".pre_mlp_layernorm.weight", ".input_layernorm.weight")
"""An MTP inner layer's pre-norm as the TE spec (fused) and the local spec name it."""


def _wrap_resolve(change: Any) -> None:
    """`_MTPFlatteningMapping.resolve`, then `change(mapping, resolved)` -> the mapping to use."""

    def make(original: Any) -> Any:
        def resolve(self, captures):  # type: ignore[no-untyped-def]
            return change(self, original(self, captures))

        return resolve

    wrap(nemotron_h_bridge._MTPFlatteningMapping, "resolve", make)


def mtp_enorm_hnorm_swapped() -> None:
    """The MTP block's enorm (the embedding's norm) reads and writes HF's hnorm (the hidden state's) and back."""

    def change(_mapping: Any, resolved: Any) -> Any:
        block, _, leaf = resolved.megatron_param.rpartition(".")
        leaf = f"{block.rpartition('.')[2]}.{leaf}"
        if leaf not in SWAPPED_NORMS or not isinstance(resolved.hf_param, str):
            return resolved
        hf = resolved.hf_param[: -len(leaf)] + SWAPPED_NORMS[leaf]
        return AutoMapping(megatron_param=resolved.megatron_param, hf_param=hf)

    _wrap_resolve(change)


def mtp_inner_norms_from_the_other_layer() -> None:
    """Each MTP inner layer's pre-norm resolves to HF's norm of inner layer P - 1 - i (the flattened index reversed):
    with Super's `*E` block the attention layer's norm is the MoE layer's and back."""

    def change(mapping: Any, resolved: Any) -> Any:
        if not resolved.megatron_param.endswith(INNER_NORMS) or not isinstance(resolved.hf_param, str):
            return resolved
        width = mapping._mtp_layers_per_block
        parts = resolved.megatron_param.split(".")  # mtp.layers.{d}.mtp_model_layer.layers.{i}.<...>
        outer, inner = int(parts[2]), int(parts[5])
        hf = f"mtp.layers.{outer * width + width - 1 - inner}.norm.weight"
        return AutoMapping(megatron_param=resolved.megatron_param, hf_param=hf)

    _wrap_resolve(change)
