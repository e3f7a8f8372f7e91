"""What exists because a CPU run's collectives go over gloo, which has no float8 types (NCCL carries them): shim 25.
It moves the same bytes as the upstream call would, as uint8 views of the float8 tensors."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

from convcheck.compat._patch import _patch

FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
"""torch's one-byte float dtypes (those this torch has): gloo refuses each ("Invalid scalar type")."""

# --- Shim 25 ----------------------------------------------------------------------------------------
# megatron-bridge 0.6.2, megatron/bridge/models/conversion/param_mapping.py:632 (gather_from_tp_ranks), :806
# (gather_from_ep_ranks), :868 (gather_from_ep_ranks_scale) and :431 (broadcast_from_pp_rank) call
# torch.distributed.all_gather / broadcast on the float8 shards export_hf_weights_quant's quant_fn returned; gloo
# raises "RuntimeError: Invalid scalar type" for float8 (torch/distributed/distributed_c10d.py, ProcessGroupGloo).
# On a gloo group those two calls run with every float8 tensor viewed as uint8 (same storage, one byte per element):
# the collective moves the same bytes into the same tensors; any other call runs unchanged.


def _is_float8(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and str(tensor.dtype).removeprefix("torch.") in FLOAT8


def _on_gloo(group: Any) -> bool:
    try:
        return dist.get_backend(group) == "gloo"
    except (RuntimeError, ValueError):
        return False


def _bytes(tensor: Any) -> Any:
    return tensor.view(torch.uint8) if _is_float8(tensor) else tensor


def _gather_bytes(original: Any) -> Any:
    @functools.wraps(original)
    def all_gather(tensor_list, tensor, group=None, async_op=False):  # type: ignore[no-untyped-def]
        if not (_is_float8(tensor) or any(_is_float8(t) for t in tensor_list)) or not _on_gloo(group):
            return original(tensor_list, tensor, group=group, async_op=async_op)
        return original([_bytes(t) for t in tensor_list], _bytes(tensor), group=group, async_op=async_op)

    return all_gather


def _broadcast_bytes(original: Any) -> Any:
    @functools.wraps(original)
    def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):  # type: ignore[no-untyped-def]
        if _is_float8(tensor) and _on_gloo(group):
            tensor = _bytes(tensor)
        return original(tensor, src=src, group=group, async_op=async_op, group_src=group_src)

    return broadcast


def install() -> None:
    """Install shim 25 (idempotent): float8 all_gather and broadcast over gloo as uint8 views."""
    _patch(dist, "all_gather", _gather_bytes)
    _patch(dist, "broadcast", _broadcast_bytes)
