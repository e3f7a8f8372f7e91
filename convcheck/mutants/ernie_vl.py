"""Planted bugs in the bridge's ERNIE 4.5 VL conversion (tests/test_ernie_vl_probe.py).

`convcheck verify --hook convcheck.mutants.ernie_vl:NAME` runs NAME in every rank before the model is built.
"""

from __future__ import annotations

import re

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.ernie_vl import ernie45_vl_bridge

from convcheck.mutants.patch import wrap


def vision_experts_lose_their_offset() -> None:
    """The EP gather of the vision experts (`_offset_gather_from_ep_ranks`, which the vision mappings' own
    gather_from_ep_ranks calls) names them without the text pool's offset, in layer 1: vision expert j is exported
    as HF expert j, over the text expert of that number."""

    def make(original):  # type: ignore[no-untyped-def]
        def gather(mapping, weights, module, hf_param_name=None):  # type: ignore[no-untyped-def]
            out = original(mapping, weights, module, hf_param_name)
            if ".layers.1." not in str(hf_param_name):
                return out
            offset = mapping._expert_offset
            return {re.sub(r"experts\.(\d+)", lambda m: f"experts.{int(m.group(1)) - offset}", n): t
                    for n, t in out.items()}  # fmt: skip

        return gather

    wrap(ernie45_vl_bridge, "_offset_gather_from_ep_ranks", make)
