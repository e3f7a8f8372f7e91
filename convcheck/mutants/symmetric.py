"""Planted bugs for the mapping oracle: `convcheck verify --hook convcheck.mutants.symmetric:NAME` runs them per rank.

Each patches the real Megatron-Bridge QKV conversion (QKVMapping or its merge/split helpers) symmetrically, so a
roundtrip cannot see it.
"""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion import param_mapping
from megatron.bridge.models.conversion.param_mapping import QKVMapping

from convcheck.mutants.patch import permute_rows_symmetrically


def _group_perm(config: Any, rows: int, inverse: bool) -> Any:
    """Row order that puts each query group's k head before its q heads (`[k, q.., v]`), or back."""
    n = config.num_attention_heads // config.num_query_groups
    d = config.kv_channels or config.hidden_size // config.num_attention_heads
    per_group = (n + 2) * d
    within = torch.cat([torch.arange(n * d, (n + 1) * d), torch.arange(0, n * d), torch.arange((n + 1) * d, per_group)])
    if inverse:
        within = torch.argsort(within)
    return torch.cat([g * per_group + within for g in range(rows // per_group)])


def qk_order_swapped() -> None:
    """QKVMapping import writes each group as [k, q.., v] and the export reads it back the same way."""
    permute_rows_symmetrically(
        QKVMapping, lambda mapping, module, rows, inverse: _group_perm(mapping._get_config(module), rows, inverse)
    )


def qkv_not_interleaved() -> None:
    """The bridge's QKV merge writes [all q; all k; all v] instead of one block per query group, and its split reads
    that back the same way (weights only)."""

    def merge_qkv_weights(provider, q, k, v):  # type: ignore[no-untyped-def]
        return torch.cat([q, k, v], dim=0)

    def split_qkv_weights(provider, qkv, *args, **kwargs):  # type: ignore[no-untyped-def]
        heads, groups = provider.num_attention_heads, provider.num_query_groups
        kv_rows = qkv.shape[0] * groups // (heads + 2 * groups)
        return torch.split(qkv, [qkv.shape[0] - 2 * kv_rows, kv_rows, kv_rows], dim=0)

    param_mapping.merge_qkv_weights = merge_qkv_weights
    param_mapping.split_qkv_weights = split_qkv_weights
