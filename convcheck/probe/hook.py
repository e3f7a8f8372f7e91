"""The bridge's export hook, followed by the probe: what `maybe_modify_converted_hf_weight` adds, drops or rewrites
after a task's megatron_to_hf (GLM-4.7-Flash restores its MTP layers' embed_tokens / shared_head.head aliases there,
glm47_flash_bridge.py:116), applied to a copy of the task's outputs.

Without side effects: the hook runs on a model bridge of its own (the AutoBridge builds a fresh one on each access),
given what the bridge's export gives it (hf_pretrained, hf_config, the source state, stream_weights_megatron_to_hf
in model_bridge.py:1307-1335), and on a new dict each call, so the export's own dict and bridge are never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge

ExportHook = Callable[[Any, dict[str, Any]], dict[str, Any]]
"""(task, HF name -> tensor as megatron_to_hf made it) -> HF name -> tensor as the bridge's export emits it."""


def export_hook(ctx: Any, tasks: Iterable[Any] = ()) -> ExportHook | None:
    """The run's export hook, or None when the bridge's class keeps the base one (which returns its input) and
    none of `tasks` (the run's conversion tasks) is grouped. A grouped task (fused experts) skips the hook and goes
    through the bridge's expert buffering instead (convcheck.probe.grouped), as in model_bridge.py:1361-1383."""
    from convcheck.probe.grouped import grouped_follow, is_grouped

    auto = ctx.bridge
    if not hasattr(type(auto), "_model_bridge") or not hasattr(auto, "hf_pretrained"):
        return None  # not an AutoBridge: nothing stands between megatron_to_hf and the export
    base = MegatronModelBridge.maybe_modify_converted_hf_weight
    model_bridge = auto._model_bridge  # a new instance (megatron-bridge model_bridge.py:2162)
    modifies = getattr(type(model_bridge), "maybe_modify_converted_hf_weight", base) is not base
    grouped = any(is_grouped(task) for task in tasks)
    if not modifies and not grouped:
        return None
    pretrained = auto.hf_pretrained
    model_bridge.hf_pretrained = pretrained
    model_bridge.hf_config = pretrained.config if hasattr(pretrained, "config") else pretrained
    state = pretrained.state if hasattr(pretrained, "state") else {}
    stack = grouped_follow(model_bridge, ctx.model[0].config, state) if grouped else None

    def follow(task: Any, outputs: dict[str, Any]) -> dict[str, Any]:
        if stack is not None and is_grouped(task):
            return stack(task, outputs)
        if not modifies:
            return outputs
        return dict(model_bridge.maybe_modify_converted_hf_weight(task, dict(outputs), state) or {})

    return follow


def hook_name(task: Any) -> str:
    """What the export runs after this task's megatron_to_hf, as findings name it."""
    from convcheck.probe.grouped import is_grouped

    if is_grouped(task):
        return "the bridge's grouped-expert export (_accumulate_grouped_export)"
    return "the bridge's maybe_modify_converted_hf_weight"


def hook_made(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    """Names of `after` the hook added or replaced (not the very tensor megatron_to_hf returned)."""
    return {name for name, tensor in after.items() if before.get(name) is not tensor}
