"""Mappings that move elements and then change their values elementwise: the probe follows the move, the compare
checks the values.

An index code does not survive arithmetic, so for a mapping class declared here the probe runs the part of its
megatron_to_hf that moves elements (the next class's megatron_to_hf in its MRO, which the class calls first), and
the differential compares the real export bitwise against the declared map of the shard at the probe's positions.
Whatever the class's own code does beyond its declared map (an offset applied twice, a wrong sign, elements
permuted) is then a mismatch named by tensor and first wrong element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class ValueMap:
    """An elementwise map HF = megatron + offset, exact in the weight's dtype (as the bridge computes it)."""

    owner: str
    """The bridge's mapping class that applies it on export."""
    offset: float

    @property
    def label(self) -> str:
        sign = "+" if self.offset >= 0 else "-"
        return f"x {sign} {abs(self.offset):g} ({self.owner})"

    def apply(self, weight: Any) -> Any:
        """The HF values of a shard [any shape]: a new tensor of its dtype and device."""
        return weight.detach().clone().add_(self.offset)


_DECLARED = {"RMSNorm2ZeroCenteredRMSNormMapping": 1.0}
"""Class name in megatron.bridge.models.conversion.param_mapping -> the offset its megatron_to_hf adds: the
zero-centered gamma Megatron stores (param_mapping.py:2838) is the HF gated norm's weight minus one."""


def _declared_class(mapping: Any) -> type | None:
    """The declared value-map class `mapping` is an instance of, None when it only moves elements."""
    import sys

    param_mapping = sys.modules.get("megatron.bridge.models.conversion.param_mapping")
    if param_mapping is None:  # not imported: nothing can be an instance of its classes
        return None
    for name in _DECLARED:
        cls = getattr(param_mapping, name, None)
        if cls is not None and isinstance(mapping, cls):
            return cls
    return None


def value_map(mapping: Any) -> ValueMap | None:
    """The declared elementwise map of a task's mapping, None for a mapping that only moves elements."""
    cls = _declared_class(mapping)
    return None if cls is None else ValueMap(owner=cls.__name__, offset=_DECLARED[cls.__name__])


def follow_moves_only(probe_mapping: Any) -> None:
    """Point a probe copy of a declared value-map mapping at the megatron_to_hf its class builds on (the part
    that moves elements); the class's own arithmetic is left to the value compare. No-op for other mappings."""
    cls = _declared_class(probe_mapping)
    if cls is not None:
        probe_mapping.megatron_to_hf = super(cls, probe_mapping).megatron_to_hf
