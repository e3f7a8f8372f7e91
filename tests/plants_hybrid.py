"""Planted NemotronH config bugs: `convcheck verify --hook tests/plants_hybrid.py:NAME` runs them in every rank.

Each wraps the real Megatron-Bridge NemotronH bridge (or megatron-core's MambaMixer) so that one Mamba setting
differs from the HF config; the config oracle must name the field.
"""

from __future__ import annotations

from typing import Any, Callable


def _wrap_provider_bridge(change: Callable[[Any], None]) -> None:
    """NemotronHBridge.provider_bridge returns its provider after `change(provider)`."""
    from megatron.bridge.models.nemotronh.nemotron_h_bridge import NemotronHBridge

    original = NemotronHBridge.provider_bridge

    def provider_bridge(self, hf_pretrained):  # type: ignore[no-untyped-def]
        provider = original(self, hf_pretrained)
        change(provider)
        return provider

    NemotronHBridge.provider_bridge = provider_bridge


def halve_mamba_heads() -> None:
    """The provider gets half of HF's mamba_num_heads (every Mamba shape changes, so the import fails too)."""
    _wrap_provider_bridge(lambda p: setattr(p, "mamba_num_heads", p.mamba_num_heads // 2))


def swap_pattern() -> None:
    """The provider's hybrid pattern swaps the attention and MLP layers (`M*-ME` -> `M-*ME`)."""
    _wrap_provider_bridge(lambda p: setattr(p, "hybrid_layer_pattern", p.hybrid_layer_pattern.replace("*-", "-*")))


def gated_norm_eps() -> None:
    """Every MambaMixer's gated RMSNorm gets eps 1e-2 instead of HF's layer_norm_epsilon (weights untouched)."""
    from megatron.core.ssm import mamba_mixer

    original = mamba_mixer.MambaMixer.__init__

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        self.norm.eps = 1e-2

    mamba_mixer.MambaMixer.__init__ = __init__
