"""Planted ownership bugs: a rank claims (and imports) parameters that belong to another rank.

`convcheck verify --hook convcheck.mutants.ownership:NAME` runs NAME in every rank before the model is built.
"""

from __future__ import annotations

import re

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import megatron.bridge.models.conversion.model_bridge as model_bridge
from megatron.core import parallel_state as ps

from convcheck.mutants.patch import wrap


def ep_rank1_takes_rank0_experts() -> None:
    """The bridge's local -> global name function gives EP rank 1's experts the ids of EP rank 0's experts.

    Both the import (EP rank 1 loads experts 0.. instead of its own) and every global name convcheck reads go
    through it, so two EP ranks claim the same global expert names."""

    def make(original):  # type: ignore[no-untyped-def]
        def local_name_to_global(models, config, param_name, vp_stage=None):  # type: ignore[no-untyped-def]
            name = original(models, config, param_name, vp_stage)
            ep_size = ps.get_expert_model_parallel_world_size()
            if ep_size < 2 or ps.get_expert_model_parallel_rank() != 1 or ".experts." not in name:
                return name
            per_rank = config.num_moe_experts // ep_size

            def back(match: re.Match[str]) -> str:
                return f"{match.group(1)}{int(match.group(2)) - per_rank}{match.group(3)}"

            name = re.sub(r"(\.local_experts\.)(\d+)(\.)", back, name)
            return re.sub(r"(\.experts\.linear_fc\d\.(?:weight|bias))(\d+)($)", back, name)

        return local_name_to_global

    wrap(model_bridge, "_megatron_local_name_to_global", make)
