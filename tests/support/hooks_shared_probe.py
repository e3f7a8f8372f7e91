"""`--hook` for tests/test_differential.py: a bug in one routed expert only, one whose probe slots are its layer's
shared ones (convcheck.probe.shared): the EP gather of tiny:qwen3-moe's layer 0 down projections hands rank 0 back
its own expert 3 (local expert 3, the fourth of its layer: probed neither first nor second) with every bit of element
[1, 2] flipped."""

from __future__ import annotations

from typing import Any

from convcheck.mutants.patch import flipped, wrap

TARGET = "model.layers.0.mlp.experts.3.down_proj.weight"


def flip_expert3_down_on_rank0() -> None:
    """Rank 0's export of layer 0's expert 3 down projection has element [1, 2] with every bit flipped."""
    from megatron.bridge.models.conversion.param_mapping import MegatronParamMapping

    def make(original: Any) -> Any:
        def gather_from_ep_ranks(self: Any, weights: Any, module: Any, hf_param_name: Any) -> Any:
            out = original(self, weights, module, hf_param_name)
            if self.ep_rank != 0 or TARGET not in out:
                return out
            return {**out, TARGET: flipped(out[TARGET], (1, 2))}

        return gather_from_ep_ranks

    wrap(MegatronParamMapping, "gather_from_ep_ranks", make)
