"""Planted bugs of the Transformer Engine layout's own mappings (`--spec te`): the bridge's TE names fuse each layer's
norms into the linear after them (`linear_qkv.layer_norm_weight`, `linear_fc1.layer_norm_weight`), a mapping the local
layout never runs."""

from __future__ import annotations

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.param_mapping import AutoMapping

SWAPS = {
    "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight": ("input_layernorm", "post_attention_layernorm"),
    "decoder.layers.0.mlp.linear_fc1.layer_norm_weight": ("post_attention_layernorm", "input_layernorm"),
}
"""The TE-named norms of layer 0 whose HF tensors the planted bug swaps."""


def swap_layer_norm_weights() -> None:
    """The bridge maps layer 0's fused norms to each other's HF tensor (linear_qkv.layer_norm_weight <-> HF
    post_attention_layernorm, linear_fc1.layer_norm_weight <-> input_layernorm), in import and export alike: the
    export still equals the source, only the loaded shards (and Megatron's forward) are wrong."""
    original = AutoMapping.resolve

    def resolve(self, captures):  # type: ignore[no-untyped-def]
        mapping = original(self, captures)
        swap = SWAPS.get(mapping.megatron_param)
        if swap is None:
            return mapping
        return type(mapping)(mapping.megatron_param, mapping.hf_param.replace(*swap), mapping.permute_dims)

    AutoMapping.resolve = resolve
