"""The bridge's grouped (fused-expert) export, followed one task at a time.

A mapping with `is_grouped_export` (FusedGatedExpertMapping, FusedExpertMapping: param_mapping.py:2909-3040) returns
one expert's part of a fused HF tensor (`[2F, H]`, or `[ep, 2F, H]` after its EP gather); the export loop buffers the
parts and stacks them into `[E, ...]` once every expert has come (`_accumulate_grouped_export`, model_bridge.py:936,
called at 1373). Here one task's parts go through that real method on a buffer of its own whose other experts are
zeros, so the output is the whole fused tensor holding only this task's elements (codes are >= 1: zero is 'not
mine'), in the place the real export puts them.
"""

from __future__ import annotations

from typing import Any

import torch

GroupedFollow = Any
"""(task, name -> one task's megatron_to_hf output) -> name -> the fused HF tensor holding only that task's part."""


def is_grouped(task: Any) -> bool:
    """True when the bridge's export stacks this task's output with other tasks' (fused experts)."""
    return bool(getattr(task.mapping, "is_grouped_export", False))


def grouped_follow(model_bridge: Any, model_config: Any, hf_state: Any) -> GroupedFollow:
    """The follower of one model's grouped export through `model_bridge._accumulate_grouped_export`."""

    def follow(task: Any, outputs: dict[str, Any]) -> dict[str, Any]:
        if not outputs:
            return {}
        buffers: dict[str, dict[int, Any]] = {}
        merged = model_bridge._accumulate_grouped_export(task, dict(outputs), model_config, buffers, hf_state)
        if merged is not None:  # this task alone filled every expert
            return dict(merged)
        if not buffers:
            raise ValueError(f"the grouped export keeps nothing of {task.param_name} (no expert number in its name)")
        for parts in buffers.values():
            blank = torch.zeros_like(next(iter(parts.values())))
            for expert in range(model_config.num_moe_experts):
                parts.setdefault(expert, blank)
        # the same parts again: they land in the same slots, and now every expert is there
        merged = model_bridge._accumulate_grouped_export(task, dict(outputs), model_config, buffers, hf_state)
        return dict(merged or {})

    return follow
