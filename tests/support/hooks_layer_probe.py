"""`--hook`s for tests/test_differential.py: a bug in one layer only, one whose probe slots are shared with the same
parameter of earlier layers (convcheck.probe.shared), under TP2 in tiny:qwen3-moe-4l: the TP gather of layer 3's
attention output projection (probed neither first nor second of the four layers) hands rank 0 back its own half with
every bit of element [1, 2] flipped; or rank 0's conversion of layer 3's expert 5 down projection (whole on every
rank: its slots those of layer 0's expert 0, renamed in both numbers) flips every bit of that element. The probe's
copies gather through stubs and are integer codes, so only the real export carries either."""

from __future__ import annotations

import re
from typing import Any

from convcheck.mutants.patch import flipped, wrap

MEGATRON = "decoder.layers.3.self_attention.linear_proj.weight"
TARGET = "model.layers.3.self_attn.o_proj.weight"
EXPERT = re.compile(r"^decoder\.layers\.3\.mlp\.experts\.(local_experts\.5\.linear_fc2\.weight|linear_fc2\.weight5)$")
"""Layer 3's expert 5 down projection, as SequentialMLP or TEGroupedMLP names it."""
EXPERT_TARGET = "model.layers.3.mlp.experts.5.down_proj.weight"


def flip_layer3_o_proj_on_rank0() -> None:
    """Rank 0's gathered halves of layer 3's o_proj: its own half's element [1, 2] with every bit flipped."""
    from megatron.bridge.models.conversion.param_mapping import MegatronParamMapping

    def make(original: Any) -> Any:
        def gather_from_tp_ranks(self: Any, tensor: Any) -> Any:
            parts = original(self, tensor)
            if self.tp_rank != 0 or self.megatron_param != MEGATRON:
                return parts
            return [flipped(parts[0], (1, 2)), *parts[1:]]

        return gather_from_tp_ranks

    wrap(MegatronParamMapping, "gather_from_tp_ranks", make)


def flip_layer3_expert5_down_on_rank0() -> None:
    """Rank 0's export of layer 3's expert 5 down_proj has element [1, 2] with every bit flipped."""
    import torch.distributed as dist
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    def make(original: Any) -> Any:
        def megatron_to_hf(self: Any, weights: Any, module: Any) -> Any:
            out = original(self, weights, module)
            real = weights is not None and weights.dtype.is_floating_point  # the probe converts integer codes
            if not real or dist.get_rank() != 0 or not EXPERT.match(str(self.megatron_param)) or not out:
                return out
            return {**out, EXPERT_TARGET: flipped(out[EXPERT_TARGET], (1, 2))}

        return megatron_to_hf

    wrap(AutoMapping, "megatron_to_hf", make)
