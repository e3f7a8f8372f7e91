"""Planted bugs in the GPT-OSS conversion (gate/up interleave, its bias, down_proj orientation, sinks over TP):
`convcheck verify --hook convcheck.mutants.gpt_oss:NAME` runs one in every rank.

Each patches a real Megatron-Bridge object (GPTOSSMLPGateUpProjMapping, GPTOSSBridge, GPTOSSMLPDownProjMapping,
AutoMapping); the symmetric ones leave a roundtrip intact, so only the explicit mappings and the logits see them.
"""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.param_mapping import AutoMapping
from megatron.bridge.models.gpt_oss.gpt_oss_bridge import (
    GPTOSSBridge,
    GPTOSSMLPDownProjMapping,
    GPTOSSMLPGateUpProjMapping,
)

from convcheck.mutants.patch import wrap


def _gate_up_mapping() -> Any:
    return GPTOSSMLPGateUpProjMapping


def gate_up_halves() -> None:
    """gate_up_proj and its bias read as [gate half | up half] instead of alternating gate / up columns, on import and
    export alike (a roundtrip stays bitwise; every expert's fc1 holds the wrong rows)."""
    cls = _gate_up_mapping()
    cls._interleave = staticmethod(lambda rows: rows)
    cls._uninterleave = lambda self, rows: rows


def bias_not_interleaved() -> None:
    """gate_up_proj_bias taken as [gate half | up half] (the weight is de-interleaved, its bias is not), on import and
    export alike."""
    cls = _gate_up_mapping()

    def make_import(original: Any) -> Any:
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            if not self.hf_param.endswith("_bias"):
                return original(self, hf_weights, megatron_module)
            self._interleave = lambda rows: rows  # this instance only
            try:
                return original(self, hf_weights, megatron_module)
            finally:
                del self._interleave

        return hf_to_megatron

    def make_export(original: Any) -> Any:
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            if not self.hf_param.endswith("_bias"):
                return original(self, megatron_weights, megatron_module)
            self._uninterleave = lambda rows: rows  # this instance only
            try:
                return original(self, megatron_weights, megatron_module)
            finally:
                del self._uninterleave

        return megatron_to_hf

    wrap(cls, "hf_to_megatron", make_import)
    wrap(cls, "megatron_to_hf", make_export)


def down_proj_not_transposed() -> None:
    """A square expert down_proj is neither transposed on import nor on export: each expert's fc2 holds D[e] where it
    needs D[e].T; a roundtrip stays bitwise. The code #3271 (0182c798b) brought to main and #3743 (d35bae9c0; 0.4.2:
    #3753) fixed, in no PyPI release."""

    def square(tensor: Any) -> bool:
        return tensor is not None and tensor.dim() >= 2 and tensor.shape[-1] == tensor.shape[-2]

    def make_load(original: Any) -> Any:
        def maybe_modify_loaded_hf_weight(self, hf_param, hf_state_dict):  # type: ignore[no-untyped-def]
            out = original(self, hf_param, hf_state_dict)
            if isinstance(hf_param, str) and hf_param.endswith(".mlp.experts.down_proj") and square(out):
                return out.transpose(-1, -2).contiguous()
            return out

        return maybe_modify_loaded_hf_weight

    def make_export(original: Any) -> Any:
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            if self.hf_param.endswith("_bias"):
                return out
            return {n: t.transpose(-1, -2).contiguous() if square(t) else t for n, t in out.items()}

        return megatron_to_hf

    wrap(GPTOSSBridge, "maybe_modify_loaded_hf_weight", make_load)
    wrap(GPTOSSMLPDownProjMapping, "megatron_to_hf", make_export)


def sinks_not_split() -> None:
    """The attention sinks are not split over TP: every TP rank loads the first heads / tp sinks (rank 0's heads)."""

    def make(original: Any) -> Any:
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            if self.megatron_param.endswith("softmax_offset") and self.tp_size > 1 and hf_weights is not None:
                local = hf_weights.shape[0] // self.tp_size
                hf_weights = torch.cat([hf_weights[:local]] * self.tp_size)
            return original(self, hf_weights, megatron_module)

        return hf_to_megatron

    wrap(AutoMapping, "hf_to_megatron", make)


def window_off_by_one() -> None:
    """The provider's window is (W, 0) instead of (W - 1, 0): one key more than HF's W-token window (#2656)."""
    from convcheck.mutants.patch import alter_provider

    alter_provider(lambda p: setattr(p, "window_size", (p.window_size[0] + 1, p.window_size[1])), only=GPTOSSBridge)
