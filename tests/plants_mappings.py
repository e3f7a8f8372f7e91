"""Planted bugs for the mapping oracle: `convcheck verify --hook tests/plants_mappings.py:NAME` runs them per rank.

Each patches the real Megatron-Bridge QKVMapping symmetrically, so a roundtrip cannot see it.
"""

from __future__ import annotations

from typing import Any


def _group_perm(config: Any, rows: int, inverse: bool) -> Any:
    """Row order that puts each query group's k head before its q heads (`[k, q.., v]`), or back."""
    import torch

    n = config.num_attention_heads // config.num_query_groups
    d = config.kv_channels or config.hidden_size // config.num_attention_heads
    per_group = (n + 2) * d
    within = torch.cat([torch.arange(n * d, (n + 1) * d), torch.arange(0, n * d), torch.arange((n + 1) * d, per_group)])
    if inverse:
        within = torch.argsort(within)
    return torch.cat([g * per_group + within for g in range(rows // per_group)])


def qk_order_swapped() -> None:
    """QKVMapping import writes each group as [k, q.., v] and the export reads it back the same way."""
    from megatron.bridge.models.conversion.param_mapping import QKVMapping

    to_megatron, to_hf = QKVMapping.hf_to_megatron, QKVMapping.megatron_to_hf

    def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
        shard = to_megatron(self, hf_weights, megatron_module)
        config = self._get_config(megatron_module)
        return shard[_group_perm(config, shard.shape[0], inverse=False)].contiguous()

    def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
        if megatron_weights is not None and megatron_module is not None:
            config = self._get_config(megatron_module)
            perm = _group_perm(config, megatron_weights.shape[0], inverse=True)
            megatron_weights = megatron_weights[perm].contiguous()
        return to_hf(self, megatron_weights, megatron_module)

    QKVMapping.hf_to_megatron = hf_to_megatron
    QKVMapping.megatron_to_hf = megatron_to_hf
