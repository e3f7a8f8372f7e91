"""Hooks and rank functions of tests/test_te_standin_ranks.py (`verify --spec te`): a planted bug through the real
bridge's mappings under Transformer Engine's names, and what the ranks built."""

from __future__ import annotations

from typing import Any


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
