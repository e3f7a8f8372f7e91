"""Planted GLM-4.5 bugs (q/k/v bias interleave, fp32 expert bias, MTP layer source, partial rotary):
`convcheck verify --hook convcheck.mutants.glm45:NAME` runs one in every rank."""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion import param_mapping
from megatron.bridge.models.conversion.param_mapping import AutoMapping
from megatron.bridge.models.glm.glm45_bridge import GLM45Bridge

from convcheck.mutants.patch import alter_provider, wrap

EXPERT_BIAS = "decoder.layers.2.mlp.router.expert_bias"
MTP_QKV = "mtp.layers.0.mtp_model_layer.self_attention.linear_qkv.weight"


def qkv_bias_not_interleaved() -> None:
    """The fused QKV bias is [q; k; v] concatenated, not interleaved per query group: import and export alike (the
    bridge's merge_qkv_biases / split_qkv_biases), so a roundtrip is exact and only the mapping and logits see it."""

    def merge(_original: Any) -> Any:
        return lambda _config, q, k, v: torch.cat([q, k, v])

    def split(_original: Any) -> Any:
        def split_qkv_biases(config, packed):  # type: ignore[no-untyped-def]
            d = config.kv_channels or config.hidden_size // config.num_attention_heads
            q_rows, kv_rows = config.num_attention_heads * d, config.num_query_groups * d
            return packed[:q_rows], packed[q_rows : q_rows + kv_rows], packed[q_rows + kv_rows :]

        return split_qkv_biases

    wrap(param_mapping, "merge_qkv_biases", merge)
    wrap(param_mapping, "split_qkv_biases", split)


def expert_bias_left_at_init() -> None:
    """The import of layer 2's router expert bias (e_score_correction_bias) writes nothing: it keeps its init zeros."""

    def make(original: Any) -> Any:
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, hf_weights, megatron_module)
            if self.megatron_param != EXPERT_BIAS:
                return out
            return megatron_module.expert_bias.detach().clone()

        return hf_to_megatron

    wrap(AutoMapping, "hf_to_megatron", make)


def mtp_qkv_from_last_decoder_layer() -> None:
    """The MTP layer's q/k/v projections are mapped to the last decoder layer's HF tensors (model.layers.{L - 1})
    instead of its own (model.layers.{L}), on import and on export."""

    def make(original: Any) -> Any:
        def mapping_registry(self):  # type: ignore[no-untyped-def]
            registry = original(self)
            last = self.hf_config.num_hidden_layers
            for mapping in registry.mappings:
                if mapping.megatron_param == MTP_QKV:
                    mapping.hf_param = {
                        key: name.replace(f"model.layers.{last}.", f"model.layers.{last - 1}.")
                        for key, name in mapping.hf_param.items()
                    }
            return registry

        return mapping_registry

    wrap(GLM45Bridge, "mapping_registry", make)


def partial_rotary_lost() -> None:
    """The provider rotates the whole head (rotary_percent 1.0): GLM's partial_rotary_factor 0.5 is dropped."""
    alter_provider(lambda provider: setattr(provider, "rotary_percent", 1.0))
