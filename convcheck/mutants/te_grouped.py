"""Planted bugs for `--experts te-grouped`: `convcheck verify --hook convcheck.mutants.te_grouped:NAME` runs them in
every rank.

Each patches real Megatron-Bridge mapping code only for TEGroupedMLP's `experts.linear_fcN.weightE` naming, so
SequentialMLP (`experts.local_experts.E.*`) is untouched.
"""

from __future__ import annotations

import re

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.param_mapping import MegatronParamMapping

from convcheck.mutants.patch import wrap


def grouped_export_local_expert_id() -> None:
    """The EP gather of grouped `weightE` params names each rank's tensor with its LOCAL expert id (no EP offset)."""

    def make(original):  # type: ignore[no-untyped-def]
        def gather_from_ep_ranks(self, megatron_weights, megatron_module, hf_param_name):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module, hf_param_name)
            if ".experts.linear_fc" not in str(self.megatron_param) or self.ep_size == 1:
                return out
            per_rank = self._get_config(megatron_module).num_moe_experts // self.ep_size
            buggy = {}
            for name, tensor in out.items():  # EP-rank order: the last rank's tensor wins the shared local name
                expert = int(re.search(r"experts\.(\d+)\.", name).group(1))  # type: ignore[union-attr]
                buggy[re.sub(r"experts\.\d+\.", f"experts.{expert % per_rank}.", name, count=1)] = tensor
            return buggy

        return gather_from_ep_ranks

    wrap(MegatronParamMapping, "gather_from_ep_ranks", make)
