"""`--hook` for tests/test_differential.py: a bug in one layer only, one whose probe slots are shared with the same
parameter of earlier layers (convcheck.probe.shared.layer_key): under TP2, the TP gather of tiny:qwen3-moe-4l's layer 3
attention output projection (probed neither first nor second of the four layers) hands rank 0 back its own half with
every bit of element [1, 2] flipped. The probe's copies gather through stubs, so only the real export carries it."""

from __future__ import annotations

from typing import Any

from convcheck.mutants import wrap

MEGATRON = "decoder.layers.3.self_attention.linear_proj.weight"
TARGET = "model.layers.3.self_attn.o_proj.weight"


def flip_layer3_o_proj_on_rank0() -> None:
    """Rank 0's gathered halves of layer 3's o_proj: its own half's element [1, 2] with every bit flipped."""
    from megatron.bridge.models.conversion.param_mapping import MegatronParamMapping

    from convcheck.compare.bits import int_view

    def make(original: Any) -> Any:
        def gather_from_tp_ranks(self: Any, tensor: Any) -> Any:
            parts = original(self, tensor)
            if self.tp_rank != 0 or self.megatron_param != MEGATRON:
                return parts
            mine = parts[0].clone()
            bits = int_view(mine).view(mine.shape)
            bits[1, 2] = ~bits[1, 2]
            return [mine, *parts[1:]]

        return gather_from_tp_ranks

    wrap(MegatronParamMapping, "gather_from_tp_ranks", make)
