"""Planted config bugs for the functional oracles: `convcheck verify --hook tests/plants_functional.py:NAME`.

Each wraps the real model bridges' `provider_bridge` so the provider (and the model built from it) carries one
wrong field, the way a bridge that mistranslates the HF config would.
"""

from __future__ import annotations

from typing import Any, Callable


def _alter_provider(change: Callable[[Any], None]) -> None:
    """Wrap `provider_bridge` of every registered model bridge that defines its own, then apply `change`."""
    import megatron.bridge  # noqa: F401 - registers every model bridge
    from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge

    def subclasses(cls: type) -> list[type]:
        return [c for s in cls.__subclasses__() for c in (s, *subclasses(s))]

    for cls in subclasses(MegatronModelBridge):
        if "provider_bridge" not in cls.__dict__:
            continue
        original = cls.__dict__["provider_bridge"]

        def provider_bridge(self, hf_pretrained, _original=original):  # type: ignore[no-untyped-def]
            provider = _original(self, hf_pretrained)
            change(provider)
            return provider

        cls.provider_bridge = provider_bridge


def wrong_rope_theta() -> None:
    """rotary_base doubled (10000 -> 20000)."""
    _alter_provider(lambda p: setattr(p, "rotary_base", p.rotary_base * 2))


def eps_off() -> None:
    """RMSNorm epsilon 1e-6 -> 1e-2 (large enough to move fp32 logits of a tiny model)."""
    _alter_provider(lambda p: setattr(p, "layernorm_epsilon", 1e-2))


def drop_qk_norm() -> None:
    """Qwen3's q/k RMSNorm dropped from the Megatron attention."""
    _alter_provider(lambda p: setattr(p, "qk_layernorm", False))


def router_topk() -> None:
    """The router picks 3 experts per token instead of the HF model's 2."""
    _alter_provider(lambda p: setattr(p, "moe_router_topk", 3) if p.num_moe_experts else None)


def flip_tied() -> None:
    """share_embeddings_and_output_weights inverted."""
    field = "share_embeddings_and_output_weights"
    _alter_provider(lambda p: setattr(p, field, not getattr(p, field)))


def scale_o_proj_on_import() -> None:
    """The import writes layer 0's o_proj times 1.5 (config untouched: only the logits oracle can see it)."""
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    original = AutoMapping.hf_to_megatron

    def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
        out = original(self, hf_weights, megatron_module)
        if self.megatron_param == "decoder.layers.0.self_attention.linear_proj.weight":
            return out * 1.5
        return out

    AutoMapping.hf_to_megatron = hf_to_megatron
