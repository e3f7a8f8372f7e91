"""Planted Gemma 3 bugs, each patching the real Megatron-Bridge classes at run time: the sandwich norms traded, the
global layers rotated with the local RoPE base, the sliding window one position short, and (for a direct test with
the post-norm epsilon fixed) one sliding layer built as a global one."""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.gemma import gemma3_provider
from megatron.bridge.models.gemma.gemma3_bridge import Gemma3ModelBridge

from convcheck.mutants.olmoe import _rename_resolved
from convcheck.mutants.patch import alter_provider, wrap

POST_ATTENTION, PRE_FEEDFORWARD = "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight"


def _gemma3_bridge() -> type:
    return Gemma3ModelBridge


def sandwich_norms_swapped() -> None:
    """Every layer's post-attention norm (linear_proj.post_layernorm) maps to HF pre_feedforward_layernorm and its
    pre-feedforward norm (linear_fc1.layer_norm_weight) to post_attention_layernorm, in import and export alike."""

    def change(_megatron: str, hf: str) -> str:
        if hf.endswith(POST_ATTENTION):
            return hf.replace(POST_ATTENTION, PRE_FEEDFORWARD)
        return hf.replace(PRE_FEEDFORWARD, POST_ATTENTION) if hf.endswith(PRE_FEEDFORWARD) else hf

    _rename_resolved(change)


def global_rope_base_local() -> None:
    """The provider's (local, global) RoPE bases built as (local, local): the global layers rotate with the sliding
    layers' base."""

    def change(provider: Any) -> None:
        local, _global = provider.rotary_base
        provider.rotary_base = (local, local)

    alter_provider(change, _gemma3_bridge())


def window_one_short() -> None:
    """The provider's window built as HF sliding_window - 1 (Megatron's left bound taken for HF's window): every
    sliding layer attends one position fewer than HF's."""

    def change(provider: Any) -> None:
        provider.window_size = provider.window_size - 1

    alter_provider(change, _gemma3_bridge())


SLIDING_LAYER = 2
"""The layer number (from 1) `sliding_layer_global` builds without its window."""


def sliding_layer_global() -> None:
    """Layer 2's core attention (a sliding layer of the 5:1 pattern) built without its window, as a global layer's
    is; its RoPE stays local: one layer's window dropped."""

    def make(original):  # type: ignore[no-untyped-def]
        def __init__(self, config, layer_number, *args, **kwargs):  # type: ignore[no-untyped-def]
            original(self, config, layer_number, *args, **kwargs)
            if layer_number == SLIDING_LAYER:
                _drop_window(self)

        return __init__

    wrap(gemma3_provider.Gemma3TEDotProductAttention, "__init__", make)


def _drop_window(attention: Any) -> None:
    """Clear every window setting the built core attention keeps (its own copy of the config included)."""
    config = getattr(attention, "config", None)
    if config is not None:
        config.window_size = None
    for name in ("window_size", "sliding_window"):
        if hasattr(attention, name):
            setattr(attention, name, None)
