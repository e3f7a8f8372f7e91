"""A Transformer Engine stand-in for hosts without TE: torch modules under the names megatron-core's TE extension
(megatron/core/extensions/transformer_engine.py) gives its TE-backed modules, with TE 2.20.2's parameter names, shapes
and dtypes and the math a forward needs. convcheck.compat.te_standin binds them where megatron-core and the bridge look
the names up (`verify --spec te`); tests/test_te_standin_wheel.py compares the parameters with TE's own source."""

from __future__ import annotations

from convcheck.kernels.te.attention import TEDotProductAttention
from convcheck.kernels.te.grouped import TEColumnParallelGroupedLinear, TEGroupedLinear, TERowParallelGroupedLinear
from convcheck.kernels.te.linear import (
    TEColumnParallelLinear,
    TELayerNormColumnParallelLinear,
    TELinear,
    TERowParallelLinear,
)
from convcheck.kernels.te.norm import LayerNorm, RMSNorm, TENorm
from convcheck.kernels.te.rules import TE_VERSION, ParamRule, TeSource

STAND_INS: dict[str, type] = {
    "TELinear": TELinear,
    "TEColumnParallelLinear": TEColumnParallelLinear,
    "TERowParallelLinear": TERowParallelLinear,
    "TELayerNormColumnParallelLinear": TELayerNormColumnParallelLinear,
    "TENorm": TENorm,
    "TEDotProductAttention": TEDotProductAttention,
    "TEGroupedLinear": TEGroupedLinear,
    "TEColumnParallelGroupedLinear": TEColumnParallelGroupedLinear,
    "TERowParallelGroupedLinear": TERowParallelGroupedLinear,
}
"""megatron-core's TE class name -> its stand-in (what TESpecProvider and the bridge's TE specs name)."""

__all__ = [
    "STAND_INS",
    "TE_VERSION",
    "LayerNorm",
    "ParamRule",
    "RMSNorm",
    "TEColumnParallelGroupedLinear",
    "TEColumnParallelLinear",
    "TEDotProductAttention",
    "TEGroupedLinear",
    "TELayerNormColumnParallelLinear",
    "TELinear",
    "TENorm",
    "TERowParallelGroupedLinear",
    "TERowParallelLinear",
    "TeSource",
]
