"""Hooks and rank functions of tests/test_te_standin_ranks.py (`verify --spec te`): a planted bug through the real
bridge's mappings under Transformer Engine's names, and what the ranks built."""

from __future__ import annotations

from typing import Any

SWAPS = {
    "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight": ("input_layernorm", "post_attention_layernorm"),
    "decoder.layers.0.mlp.linear_fc1.layer_norm_weight": ("post_attention_layernorm", "input_layernorm"),
}
"""The TE-named norms of layer 0 whose HF tensors the planted bug swaps."""


def swap_layer_norm_weights() -> None:
    """The bridge maps layer 0's fused norms to each other's HF tensor (linear_qkv.layer_norm_weight <-> HF
    post_attention_layernorm, linear_fc1.layer_norm_weight <-> input_layernorm), in import and export alike: the
    export still equals the source, only the loaded shards (and Megatron's forward) are wrong."""
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    original = AutoMapping.resolve

    def resolve(self, captures):  # type: ignore[no-untyped-def]
        mapping = original(self, captures)
        swap = SWAPS.get(mapping.megatron_param)
        if swap is None:
            return mapping
        return type(mapping)(mapping.megatron_param, mapping.hf_param.replace(*swap), mapping.permute_dims)

    AutoMapping.resolve = resolve


def built(ctx: Any) -> dict[str, Any]:
    """Class names of layer 0's modules, the parameter shapes of this rank, and whether megatron-core saw TE."""
    import sys

    from megatron.core.extensions import transformer_engine

    chunk = ctx.model[0]
    while hasattr(chunk, "module"):
        chunk = chunk.module
    layer = chunk.decoder.layers[0]
    return {
        "classes": {name: type(m).__name__ for name, m in layer.named_modules() if name.count(".") <= 2},
        "final_norm": type(chunk.decoder.final_layernorm).__name__,
        "shapes": {n: tuple(p.shape) for n, p in layer.named_parameters()},
        "have_te": transformer_engine.HAVE_TE,
        "te_imported": "transformer_engine" in sys.modules,
    }
