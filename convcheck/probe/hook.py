"""The bridge's export hook, followed by the probe: what `maybe_modify_converted_hf_weight` adds, drops or rewrites
after a task's megatron_to_hf (GLM-4.7-Flash restores its MTP layers' embed_tokens / shared_head.head aliases there,
glm47_flash_bridge.py:116), applied to a copy of the task's outputs.

Without side effects: the hook runs on a model bridge of its own (the AutoBridge builds a fresh one on each access),
given what the bridge's export gives it (hf_pretrained, hf_config, the source state, stream_weights_megatron_to_hf
in model_bridge.py:1307-1335), and on a new dict each call, so the export's own dict and bridge are never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ExportHook = Callable[[Any, dict[str, Any]], dict[str, Any]]
"""(task, HF name -> tensor as megatron_to_hf made it) -> HF name -> tensor as the bridge's export emits it."""


def export_hook(ctx: Any) -> ExportHook | None:
    """The run's export hook, or None when the bridge's class keeps the base one (which returns its input)."""
    from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge

    auto = ctx.bridge
    if not hasattr(type(auto), "_model_bridge") or not hasattr(auto, "hf_pretrained"):
        return None  # not an AutoBridge: nothing stands between megatron_to_hf and the export
    base = MegatronModelBridge.maybe_modify_converted_hf_weight
    model_bridge = auto._model_bridge  # a new instance (megatron-bridge model_bridge.py:2162)
    if getattr(type(model_bridge), "maybe_modify_converted_hf_weight", base) is base:
        return None
    pretrained = auto.hf_pretrained
    model_bridge.hf_pretrained = pretrained
    model_bridge.hf_config = pretrained.config if hasattr(pretrained, "config") else pretrained
    state = pretrained.state if hasattr(pretrained, "state") else {}

    def follow(task: Any, outputs: dict[str, Any]) -> dict[str, Any]:
        return dict(model_bridge.maybe_modify_converted_hf_weight(task, dict(outputs), state) or {})

    return follow


def hook_made(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    """Names of `after` the hook added or replaced (not the very tensor megatron_to_hf returned)."""
    return {name for name, tensor in after.items() if before.get(name) is not tensor}
