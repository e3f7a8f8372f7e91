"""Planted Mamba bugs: `convcheck verify --hook convcheck.mutants.mamba:NAME` runs them in every rank.

Each patch goes into a real Megatron-Bridge Mamba mapping (in_proj, conv1d, A_log), symmetrically (import and
export), so a roundtrip cannot see it; the mapping oracle must name the tensor.
"""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.param_mapping import (
    ColumnParallelMapping,
    MambaConv1dMapping,
    MambaInProjMapping,
)

from convcheck.mutants.patch import permute_rows_symmetrically, wrap


def _dt_first_perm(config: Any, tp: int, inverse: bool) -> Any:
    """Local row order `[z, x, dt, B, C]` instead of Megatron-Core's `[z, x, B, C, dt]` (or back)."""
    d = config.mamba_num_heads * config.mamba_head_dim // tp
    gn = config.mamba_num_groups * config.mamba_state_dim // tp
    h = config.mamba_num_heads // tp
    perm = torch.cat([torch.arange(2 * d), torch.arange(2 * d + 2 * gn, 2 * d + 2 * gn + h),
                      torch.arange(2 * d, 2 * d + 2 * gn)])  # fmt: skip
    return torch.argsort(perm) if inverse else perm


def dt_before_bc() -> None:
    """MambaInProjMapping import places each rank's dt rows before B/C; the export reads them back the same way."""
    permute_rows_symmetrically(
        MambaInProjMapping,
        lambda mapping, module, _rows, inverse: _dt_first_perm(mapping._get_config(module), mapping.tp_size, inverse),
    )


def conv1d_bc_swapped() -> None:
    """MambaConv1dMapping's channel index lists B and C in swapped places: conv1d holds [x, C, B] per rank (import
    and export alike, so a roundtrip cannot see it)."""

    def make(original):  # type: ignore[no-untyped-def]
        def get_shard_idx(self, config, local_tp):  # type: ignore[no-untyped-def]
            x, b, c = original(self, config, local_tp)
            return [x, c, b]

        return get_shard_idx

    wrap(MambaConv1dMapping, "get_shard_idx", make)


def a_log_sign_flipped() -> None:
    """A_log is stored negated (as if the bridge converted A = -exp(A_log) to A_log twice); the export negates it
    back, so the roundtrip passes."""

    def make_import(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, hf_weights, megatron_module)
            return -out if self.megatron_param.endswith("mixer.A_log") and out is not None else out

        return hf_to_megatron

    def make_export(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            return {n: -t for n, t in out.items()} if self.megatron_param.endswith("mixer.A_log") else out

        return megatron_to_hf

    wrap(ColumnParallelMapping, "hf_to_megatron", make_import)
    wrap(ColumnParallelMapping, "megatron_to_hf", make_export)
