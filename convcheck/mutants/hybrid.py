"""Planted NemotronH config bugs: `convcheck verify --hook convcheck.mutants.hybrid:NAME` runs them in every rank.

Each wraps the real Megatron-Bridge NemotronH bridge (or megatron-core's MambaMixer) so that one Mamba setting
differs from the HF config; the config oracle must name the field.
"""

from __future__ import annotations

from typing import Any, Callable

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.nemotronh.nemotron_h_bridge import NemotronHBridge
from megatron.core.ssm import mamba_mixer

from convcheck.mutants.patch import alter_provider, wrap


def _alter_nemotron_h(change: Callable[[Any], None]) -> None:
    """NemotronHBridge.provider_bridge returns its provider after `change(provider)`."""
    alter_provider(change, only=NemotronHBridge)


def halve_mamba_heads() -> None:
    """The provider gets half of HF's mamba_num_heads (every Mamba shape changes, so the import fails too)."""
    _alter_nemotron_h(lambda p: setattr(p, "mamba_num_heads", p.mamba_num_heads // 2))


def swap_pattern() -> None:
    """The provider's hybrid pattern swaps the attention and MLP layers (`M*-ME` -> `M-*ME`)."""
    _alter_nemotron_h(lambda p: setattr(p, "hybrid_layer_pattern", p.hybrid_layer_pattern.replace("*-", "-*")))


def gated_norm_eps() -> None:
    """Every MambaMixer's gated RMSNorm gets eps 1e-2 instead of HF's layer_norm_epsilon (weights untouched)."""

    def make(original):  # type: ignore[no-untyped-def]
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            original(self, *args, **kwargs)
            self.norm.eps = 1e-2

        return __init__

    wrap(mamba_mixer.MambaMixer, "__init__", make)
