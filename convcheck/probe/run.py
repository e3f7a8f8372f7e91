"""Run the probe for one conversion task: index-coded shard in, HF coordinates of every owned element out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from convcheck.probe.stubs import ProbeCommError, ProbeState, no_communication, probe_copy, warm


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeSlot:
    """Where this rank's shard elements land in one HF tensor of one task."""

    hf_name: str
    shape: tuple[int, ...]
    positions: Any
    """int64 [n]: flat HF indices this rank writes, ascending."""
    local: Any
    """int64 [n]: flat index in this rank's Megatron shard of the element written at each position."""
    writer: tuple[tuple[str, int], ...]
    """The gathers (group kind, rank in group) the element went through: ranks with equal writers are replicas."""


def shard_codes(shape: tuple[int, ...], rank: int, numel: int) -> tuple[Any, Any]:
    """Codes `rank * numel + i + 1` (i the local flat index) shaped like the shard, and their dtype."""
    import torch

    dtype = torch.int32 if (rank + 1) * numel < 2**31 - 1 else torch.int64
    codes = torch.arange(rank * numel + 1, rank * numel + numel + 1, dtype=dtype).reshape(shape)
    return codes, dtype


def decode(out: Any, rank: int, numel: int, code_dtype: Any) -> tuple[Any, Any]:
    """(positions, local indices) of the codes in a probe output; ProbeCommError when codes are foreign."""
    import torch

    if out.dtype != code_dtype:
        raise ProbeCommError(f"probe: output dtype {out.dtype} is not the code dtype (the mapping computed, not moved)")
    flat = out.reshape(-1).to(torch.int64)
    positions = flat.ne(0).nonzero().squeeze(1)
    codes = flat[positions] - 1
    owner = torch.div(codes, max(numel, 1), rounding_mode="floor")
    if bool(owner.ne(rank).any()) or bool(codes.lt(0).any()):
        raise ProbeCommError("probe: output holds codes of another rank or out of range (placeholders leaked)")
    return positions, codes - rank * numel


def probe_task(task: Any, rank: int) -> dict[str, ProbeSlot]:
    """Run the task's real megatron_to_hf on a probe copy of its mapping over an index-coded shard."""
    state = ProbeState()
    warm(task.mapping, task.megatron_module)
    mapping = probe_copy(task.mapping, state)
    weight = task.param_weight
    if weight is None:
        codes, dtype, numel = None, None, 0
    else:
        numel = weight.numel()
        codes, dtype = shard_codes(tuple(weight.shape), rank, numel)
        for attr in ("tensor_model_parallel", "partition_dim", "partition_stride"):
            if hasattr(weight, attr):
                setattr(codes, attr, getattr(weight, attr))
    with no_communication():
        out = mapping.megatron_to_hf(codes, task.megatron_module)
    state.check_pool()
    writer = tuple(sorted(state.writer))
    slots = {}
    for name, tensor in (out or {}).items():
        if codes is None:
            raise ProbeCommError(f"probe: a rank without the parameter produced {name} (needs a PP broadcast)")
        positions, local = decode(tensor, rank, numel, dtype)
        slots[str(name)] = ProbeSlot(
            hf_name=str(name), shape=tuple(tensor.shape), positions=positions, local=local, writer=writer
        )
    return slots


def to_ranges(positions: Any) -> list[tuple[int, int]]:
    """Ascending flat positions as half-open (start, stop) runs."""
    import torch

    if positions.numel() == 0:
        return []
    breaks = (positions[1:] - positions[:-1]).ne(1).nonzero().squeeze(1) + 1
    starts = torch.cat([positions[:1], positions[breaks]])
    stops = torch.cat([positions[breaks - 1] + 1, positions[-1:] + 1])
    return list(zip(starts.tolist(), stops.tolist()))


def count_writes(numel: int, writers: list[list[tuple[int, int]]]) -> Any:
    """int32 [numel]: how many writers cover each flat element (each writer a list of ranges)."""
    import torch

    delta = torch.zeros(numel + 1, dtype=torch.int32)
    for ranges in writers:
        if ranges:
            r = torch.tensor(ranges, dtype=torch.int64)
            r = r.clamp(0, numel)
            delta.index_add_(0, r[:, 0], torch.ones(len(r), dtype=torch.int32))
            delta.index_add_(0, r[:, 1], -torch.ones(len(r), dtype=torch.int32))
    return delta.cumsum(0)[:numel].to(torch.int32)


def first_index(mask: Any, shape: tuple[int, ...]) -> list[int]:
    """The HF index of the first element where flat bool `mask` holds."""
    from convcheck.bits import unravel_index

    return list(unravel_index(int(mask.nonzero()[0, 0]), tuple(shape)))


def bad_ranges(mask: Any, shape: tuple[int, ...], limit: int = 4) -> list[str]:
    """`[i, j]..[k, l]` HF index ranges where `mask` (flat bool) holds, the first `limit` of them."""
    from convcheck.bits import unravel_index

    runs = to_ranges(mask.nonzero().squeeze(1))
    return [f"{list(unravel_index(a, shape))}..{list(unravel_index(b - 1, shape))}" for a, b in runs[:limit]]
