"""Planted bugs for the mapping oracle: `convcheck verify --hook convcheck.mutants.symmetric:NAME` runs them per rank.

Each patches the real Megatron-Bridge QKVMapping symmetrically, so a roundtrip cannot see it.
"""

from __future__ import annotations

from typing import Any

from convcheck.mutants import permute_rows_symmetrically


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

    permute_rows_symmetrically(
        QKVMapping, lambda mapping, module, rows, inverse: _group_perm(mapping._get_config(module), rows, inverse)
    )
