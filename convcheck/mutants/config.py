"""Planted config bugs for the functional oracles: `convcheck verify --hook convcheck.mutants.config:NAME`.

Each wraps the real model bridges' `provider_bridge` so the provider (and the model built from it) carries one
wrong field, the way a bridge that mistranslates the HF config would.
"""

from __future__ import annotations

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.param_mapping import AutoMapping
from megatron.bridge.models.mistral.mistral_bridge import MistralBridge

from convcheck.mutants.patch import alter_provider, wrap


def wrong_rope_theta() -> None:
    """rotary_base doubled (10000 -> 20000)."""
    alter_provider(lambda p: setattr(p, "rotary_base", p.rotary_base * 2))


def eps_off() -> None:
    """RMSNorm epsilon 1e-6 -> 1e-2 (large enough to move fp32 logits of a tiny model)."""
    alter_provider(lambda p: setattr(p, "layernorm_epsilon", 1e-2))


def drop_qk_norm() -> None:
    """Qwen3's q/k RMSNorm dropped from the Megatron attention."""
    alter_provider(lambda p: setattr(p, "qk_layernorm", False))


def router_topk() -> None:
    """The router picks 3 experts per token instead of the HF model's 2."""
    alter_provider(lambda p: setattr(p, "moe_router_topk", 3) if p.num_moe_experts else None)


def flip_tied() -> None:
    """share_embeddings_and_output_weights inverted."""
    field = "share_embeddings_and_output_weights"
    alter_provider(lambda p: setattr(p, field, not getattr(p, field)))


def scale_o_proj_on_import() -> None:
    """The import writes layer 0's o_proj times 1.5 (config untouched: only the logits oracle can see it)."""

    def make(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, hf_weights, megatron_module)
            if self.megatron_param == "decoder.layers.0.self_attention.linear_proj.weight":
                return out * 1.5
            return out

        return hf_to_megatron

    wrap(AutoMapping, "hf_to_megatron", make)


def window_off_by_one() -> None:
    """Sliding window one position too wide: window_size (W, 0) for HF's W (the bridge's bug before #2656)."""

    def widen(p):  # type: ignore[no-untyped-def]
        if p.window_size is not None:
            p.window_size = (p.window_size[0] + 1, p.window_size[1])

    alter_provider(widen)


def window_export_dropped() -> None:
    """The exported config.json loses sliding_window (the bridge's bug before #4800): Mistral comes back full."""

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf_config(provider):  # type: ignore[no-untyped-def]
            exported = dict(original(provider))
            exported.pop("sliding_window", None)
            return exported

        return classmethod(lambda cls, provider: megatron_to_hf_config(provider))

    wrap(MistralBridge, "megatron_to_hf_config", make)
