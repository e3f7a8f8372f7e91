"""Planted Mamba bugs: `convcheck verify --hook convcheck.mutants.mamba:NAME` runs them in every rank.

The patch goes into the real Megatron-Bridge MambaInProjMapping, symmetrically (import and export), so a
roundtrip cannot see it; the mapping oracle must name the tensor.
"""

from __future__ import annotations

from typing import Any

from convcheck.mutants import permute_rows_symmetrically


def _dt_first_perm(config: Any, tp: int, inverse: bool) -> Any:
    """Local row order `[z, x, dt, B, C]` instead of Megatron-Core's `[z, x, B, C, dt]` (or back)."""
    import torch

    d = config.mamba_num_heads * config.mamba_head_dim // tp
    gn = config.mamba_num_groups * config.mamba_state_dim // tp
    h = config.mamba_num_heads // tp
    perm = torch.cat([torch.arange(2 * d), torch.arange(2 * d + 2 * gn, 2 * d + 2 * gn + h),
                      torch.arange(2 * d, 2 * d + 2 * gn)])  # fmt: skip
    return torch.argsort(perm) if inverse else perm


def dt_before_bc() -> None:
    """MambaInProjMapping import places each rank's dt rows before B/C; the export reads them back the same way."""
    from megatron.bridge.models.conversion.param_mapping import MambaInProjMapping

    permute_rows_symmetrically(
        MambaInProjMapping,
        lambda mapping, module, _rows, inverse: _dt_first_perm(mapping._get_config(module), mapping.tp_size, inverse),
    )
