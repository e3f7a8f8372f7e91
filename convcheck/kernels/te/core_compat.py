"""What megatron-core's TE wrappers do differently across the gated megatron-core releases (0.16-0.19), answered for
the installed one, so the stand-in builds what that release's wrappers build."""

from __future__ import annotations

import torch
from megatron.core.extensions import transformer_engine as te_ext


def mark_expert_parameters(module: torch.nn.Module, parallel_mode: str | None, use_expert_pgs: bool,
                           expert_parallel: bool) -> None:  # fmt: skip
    """The gradient-reduction and partition attributes the installed megatron-core's TE wrappers stamp on an expert
    module's own parameters: its `_set_expert_parameter_attributes` where it has one (0.19+); before that, the
    wrappers' inline rule, `allreduce = not expert_parallel` on every parameter (0.16-0.18 TELinear /
    TEGroupedLinear)."""
    mark = getattr(te_ext, "_set_expert_parameter_attributes", None)
    if mark is not None:
        mark(module, parallel_mode, use_expert_pgs)
        return
    for param in module.parameters(recurse=False):
        param.allreduce = not expert_parallel
