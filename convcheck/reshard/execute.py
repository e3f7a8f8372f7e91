"""The reshard executor: every trainer rank sends exactly the slices the plans ask of it; each host assembles."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from convcheck.reshard.plan import ParamPlan, Piece, host

SENTINEL = 0xA5
"""Byte a destination starts as: an element no piece wrote shows up as a difference, never as a lucky zero."""


@dataclass(kw_only=True)
class Moved:
    """Bytes one target rank received, by origin, beside its shard's size."""

    shard_bytes: int = 0
    local_bytes: int = 0
    remote_bytes: int = 0
    padding_bytes: int = 0
    per_param: dict[str, int] = field(default_factory=dict)

    @property
    def moved_bytes(self) -> int:
        return self.local_bytes + self.remote_bytes


def _index(box: tuple[tuple[int, int], ...]) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in box)


def _bytes(tensor: Any, box: tuple[tuple[int, int], ...]) -> Any:
    return tensor[_index(box)].contiguous().view(-1).view(torch.uint8)


def _nbytes(piece: Piece, itemsize: int) -> int:
    n = itemsize
    for lo, hi in piece.dst:
        n *= hi - lo
    return n


def execute(
    plans: list[ParamPlan], tensors: dict[str, Any], rank: int, world: int, group: Any = None
) -> tuple[dict[tuple[int, str], Any], dict[int, Moved]]:
    """Collective: run `plans` (identical on every rank); this rank's assembled target shards (each plan's value
    offset added once assembled, in its dtype) and per-target bytes."""
    outbox: dict[int, list[Any]] = {}
    inbox: dict[int, list[tuple[Any, Piece, int]]] = {}
    out: dict[tuple[int, str], Any] = {}
    moved: dict[int, Moved] = {}
    device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
    for plan in plans:
        home = host(plan.target, world)
        dtype = getattr(torch, plan.dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        dest = None
        if home == rank:
            dest = torch.empty(plan.shape, dtype=dtype, device=device)
            dest.view(-1).view(torch.uint8).fill_(SENTINEL)
            out[(plan.target, plan.name)] = dest
            stats = moved.setdefault(plan.target, Moved())
            stats.shard_bytes += dest.numel() * itemsize
        for piece in plan.pieces:
            nbytes = _nbytes(piece, itemsize)
            if piece.rank is None:
                if dest is not None:
                    dest[_index(piece.dst)].view(-1).view(torch.uint8).zero_()
                    stats.padding_bytes += nbytes
                continue
            if dest is not None:
                stats.per_param[plan.name] = stats.per_param.get(plan.name, 0) + nbytes
            if piece.rank == rank and home == rank:
                dest[_index(piece.dst)].copy_(tensors[piece.key][_index(piece.src)])
                stats.local_bytes += nbytes
            elif piece.rank == rank:
                outbox.setdefault(home, []).append(_bytes(tensors[piece.key], piece.src))
            elif home == rank:
                inbox.setdefault(piece.rank, []).append((dest, piece, nbytes))
                stats.remote_bytes += nbytes
    _exchange(outbox, inbox, device, group)
    for plan in plans:
        if plan.offset and host(plan.target, world) == rank:
            out[(plan.target, plan.name)].add_(plan.offset)
    return out, moved


def _exchange(
    outbox: dict[int, list[Any]], inbox: dict[int, list[tuple[Any, Piece, int]]], device: Any, group: Any
) -> None:
    """One message per (sender, receiver) pair, posted all at once; then every received piece is written in place."""
    if not outbox and not inbox:
        return
    ops, buffers = [], {}
    for peer, parts in sorted(outbox.items()):
        ops.append(dist.P2POp(dist.isend, torch.cat(parts), peer, group))
    for peer, parts in sorted(inbox.items()):
        buffers[peer] = torch.empty(sum(n for _, _, n in parts), dtype=torch.uint8, device=device)
        ops.append(dist.P2POp(dist.irecv, buffers[peer], peer, group))
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for peer, parts in inbox.items():
        at = 0
        for dest, piece, nbytes in parts:
            view = dest[_index(piece.dst)]
            view.copy_(buffers[peer][at : at + nbytes].view(dest.dtype).view(view.shape))
            at += nbytes


def allgather_baseline(tensors: dict[str, Any], world: int, group: Any = None) -> tuple[int, float]:
    """Collective: the all-gather a gather-then-slice sync does (every rank's shards to every rank), timed; this
    rank's received bytes and seconds."""
    import time

    device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
    parts = [t.detach().contiguous().view(-1).view(torch.uint8) for _, t in sorted(tensors.items())]
    mine = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
    if world == 1:
        return 0, 0.0
    started = time.perf_counter()
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.int64, device=device), group=group)
    most = int(max(int(s) for s in sizes))
    padded = torch.zeros(most, dtype=torch.uint8, device=device)
    padded[: mine.numel()] = mine
    out = [torch.empty(most, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    received = sum(int(s) for s in sizes) - mine.numel()
    return received, time.perf_counter() - started
