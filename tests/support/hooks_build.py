"""`--hook` for tests/test_build_failed.py: the Qwen3 bridge's provider reads an HF config field the config class does
not have (what megatron-bridge 0.4.x's Qwen3-Next bridge does with `full_attention_interval` on transformers 5.3:
qwen3_next_bridge.py:85), so the real provider build raises on every rank."""

from __future__ import annotations

from typing import Any


def provider_reads_a_missing_field() -> None:
    from megatron.bridge.models.qwen.qwen3_bridge import Qwen3Bridge

    original = Qwen3Bridge.provider_bridge

    def provider_bridge(self: Any, hf_pretrained: Any) -> Any:
        provider = original(self, hf_pretrained)
        provider.window_size = hf_pretrained.config.full_attention_interval
        return provider

    Qwen3Bridge.provider_bridge = provider_bridge


def forward_calls_cuda() -> None:
    """Every transformer layer's forward first allocates on CUDA (upstream code convcheck has no CPU shim for)."""
    import torch
    from megatron.core.transformer.transformer_layer import TransformerLayer

    original = TransformerLayer.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        torch.zeros(1, device="cuda")
        return original(self, *args, **kwargs)

    TransformerLayer.forward = forward
