"""The reshard planner: per target rank and parameter, the pieces (source rank, source box) -> destination box.

Pure: roles, the trainer shards' metadata and a TargetLayout in, plans out; no process group, no tensor data. No
piece is larger than the target shard, so no full tensor is gathered anywhere. A box is one (start, stop) per dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from convcheck.reshard.roles import ParamRole, Shard
from convcheck.reshard.target import TargetLayout
from convcheck.verdict import Finding

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Piece:
    """Copy `src` of trainer rank `rank`'s shard `key` into `dst` of the target shard; rank None: zero padding."""

    rank: int | None
    key: str
    src: Box
    dst: Box


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamPlan:
    """How target rank `target` assembles its shard of `name`, shape `shape`."""

    name: str
    target: int
    shape: tuple[int, ...]
    dtype: str
    pieces: tuple[Piece, ...]
    offset: float = 0.0
    """Added to the assembled shard (the role's value offset: Megatron's zero-centered norm -> HF's)."""


def host(target: int, world: int) -> int:
    """The trainer rank that hosts (assembles and checks) simulated target rank `target`."""
    return target % world


def spans(start: int, stop: int, block: int) -> list[tuple[int, int, int]]:
    """[start, stop) cut at multiples of `block`: (block index, local start, local stop) each."""
    out = []
    while start < stop:
        index, lo = divmod(start, block)
        hi = min(block, lo + stop - start)
        out.append((index, lo, hi))
        start += hi - lo
    return out


def source(shards: list[Shard], index: int | None, prefer: int) -> Shard:
    """Trainer shard `index` (None: any copy) to read: the one on rank `prefer` when it holds it, else the lowest."""
    mine = [s for s in shards if index is None or s.index == index]
    return next((s for s in mine if s.rank == prefer), min(mine, key=lambda s: s.rank))


def megatron_qkv_row(role: ParamRole, part: str, head: int) -> int:
    """First row of q / gate head or k / v group `head` in Megatron's fused qkv: per group [q heads of g; k_g; v_g],
    with attention_output_gate [q heads of g; gate heads of g; k_g; v_g] (megatron-core attention.py)."""
    nh, nkv, d = role.heads
    per = nh // nkv
    q_rows = 2 * per if role.gate else per
    if part in ("q", "gate"):
        return ((head // per) * (q_rows + 2) + (per if part == "gate" else 0) + head % per) * d
    return ((head * (q_rows + 2)) + q_rows + (part == "v")) * d


def section_pieces(role: ParamRole, shards: list[Shard], prefer: int, p: int, tp: int) -> list[Piece]:
    """Target rows [chunk p of each section] from trainer shards each holding [its chunk of each section]."""
    count = shards[0].count
    rest = tuple((0, k) for k in shards[0].shape[1:])
    pieces, at, base = [], 0, 0
    for size in role.sections:
        n, m = size // tp, size // count
        for index, lo, hi in spans(p * n, (p + 1) * n, m):
            s = source(shards, index, prefer)
            pieces.append(Piece(s.rank, s.local, ((base + lo, base + hi), *rest), ((at, at + hi - lo), *rest)))
            at += hi - lo
        base += m
    return pieces


def kv_heads_for(role: ParamRole, tp: int, p: int) -> range:
    """The kv groups target tp rank `p` holds: nkv/tp of them, or one replicated on tp/nkv ranks when nkv < tp."""
    nkv = role.heads[1]
    if nkv >= tp:
        return range(p * nkv // tp, (p + 1) * nkv // tp)
    return range(p // (tp // nkv), p // (tp // nkv) + 1)


def _rows(shards: list[Shard], prefer: int, start: int, stop: int, at: int) -> list[Piece]:
    """Pieces for global dim-0 rows [start, stop) of row-blocked shards, written from destination row `at`."""
    pieces = []
    for index, lo, hi in spans(start, stop, shards[0].shape[0]):
        s = source(shards, index, prefer)
        rest = tuple((0, n) for n in s.shape[1:])
        pieces.append(Piece(s.rank, s.local, ((lo, hi), *rest), ((at, at + hi - lo), *rest)))
        at += hi - lo
    return pieces


def placement(layout: TargetLayout, target: int, expert: int | None) -> tuple[int, int] | None:
    """The planner's (split index, split count) of `target` for a dense parameter (tp) or global expert `expert`
    (etp, expert TP innermost in the target grid); None when `target` does not hold that expert."""
    if expert is None:
        return target % layout.tp, layout.tp
    etp_rank, ep_rank = target % layout.etp, (target // layout.etp) % layout.ep
    per_rank = layout.num_experts // layout.ep
    return (etp_rank, layout.etp) if ep_rank * per_rank <= expert < (ep_rank + 1) * per_rank else None


def gated_pieces(shards: list[Shard], prefer: int, p: int, n: int) -> list[Piece]:
    """Target rows [gate rows p*n..; up rows p*n..] from trainer shards each packed [gate shard; up shard]."""
    first = shards[0]
    half = first.shape[0] // 2
    pieces = []
    for at, offset in ((0, 0), (n, half)):
        for index, lo, hi in spans(p * n, (p + 1) * n, half):
            s = source(shards, index, prefer)
            rest = tuple((0, k) for k in s.shape[1:])
            pieces.append(Piece(s.rank, s.local, ((offset + lo, offset + hi), *rest), ((at, at + hi - lo), *rest)))
            at += hi - lo
    return pieces


def plan_param(role: ParamRole, shards: list[Shard], layout: TargetLayout, target: int, world: int) -> ParamPlan:
    """Target rank `target`'s plan for `role`, read from the trainer `shards` (every shard index present); an
    expert is split over the target's etp as a dense tensor over its tp."""
    prefer = host(target, world)
    p, tp = placement(layout, target, role.expert) or (0, 1)
    first = shards[0]
    full = role.hf_shapes[0]
    if role.kind == "replicated":
        s = source(shards, None, prefer)
        box = tuple((0, n) for n in s.shape)
        return ParamPlan(
            name=role.name,
            target=target,
            shape=full,
            dtype=first.dtype,
            pieces=(Piece(s.rank, s.local, box, box),),
            offset=role.offset,
        )
    pieces: list[Piece] = []
    if role.kind == "qkv":
        nh, nkv, d = role.heads
        groups = kv_heads_for(role, tp, p)
        parts = ("q", "gate") if role.gate else ("q",)
        wanted = [(part, h) for h in range(p * nh // tp, (p + 1) * nh // tp) for part in parts]
        wanted += [("k", g) for g in groups] + [("v", g) for g in groups]
        for at, (part, head) in enumerate(wanted):
            row = megatron_qkv_row(role, part, head)
            pieces += _rows(shards, prefer, row, row + d, at * d)
        shape = (len(wanted) * d, *full[1:])
    elif role.kind == "gated":
        n = full[0] // tp
        pieces = gated_pieces(shards, prefer, p, n)
        shape = (2 * n, *full[1:])
    elif role.kind == "sections":
        pieces = section_pieces(role, shards, prefer, p, tp)
        shape = (sum(size // tp for size in role.sections), *first.shape[1:])
    else:
        dim = 0 if role.kind == "column" else 1
        n = -(-full[dim] // tp)
        start, stop = min(p * n, full[dim]), min((p + 1) * n, full[dim])
        shape = tuple(n if i == dim else k for i, k in enumerate(full))
        at = 0
        for index, lo, hi in spans(start, stop, first.shape[dim]):
            s = source(shards, index, prefer)
            src = tuple((lo, hi) if i == dim else (0, k) for i, k in enumerate(s.shape))
            dst = tuple((at, at + hi - lo) if i == dim else (0, k) for i, k in enumerate(shape))
            pieces.append(Piece(s.rank, s.local, src, dst))
            at += hi - lo
        if at < n:
            pieces.append(Piece(None, "", (), tuple((at, n) if i == dim else (0, k) for i, k in enumerate(shape))))
    return ParamPlan(
        name=role.name,
        target=target,
        shape=tuple(shape),
        dtype=first.dtype,
        pieces=tuple(pieces),
        offset=role.offset,
    )


def build_plan(
    roles: dict[str, ParamRole], shards: dict[str, list[Shard]], layout: TargetLayout, world: int
) -> tuple[list[ParamPlan], list[Finding]]:
    """Every target rank's plans (sorted by target rank, then name) and a finding per parameter it cannot plan."""
    plans: list[ParamPlan] = []
    findings: list[Finding] = []
    for name in sorted(roles):
        role, held = roles[name], shards.get(name, [])
        count = held[0].count if held else 0
        missing = [] if role.kind == "replicated" else sorted(set(range(count)) - {s.index for s in held})
        if not held or missing:
            findings.append(
                Finding(tensor=name, kind="no-source", message=f"no trainer rank holds shard(s) {missing} of {count}")
            )
            continue
        uneven = [size for size in role.sections if size % layout.tp or size % count]
        if uneven:
            findings.append(
                Finding(
                    tensor=name,
                    kind="plan-indivisible",
                    message=f"target {layout.label}: section(s) of {uneven} rows do not split over target tp "
                    f"{layout.tp} and trainer tp {count}",
                    detail={"target": layout.label, "sections": list(role.sections)},
                )
            )
            continue
        for target in range(layout.world):
            if placement(layout, target, role.expert) is not None:
                plans.append(plan_param(role, held, layout, target, world))
    plans.sort(key=lambda plan: (plan.target, plan.name))
    return plans, findings


def coverage(plan: ParamPlan, shards: dict[str, list[Shard]]) -> Finding | None:
    """A finding unless the pieces cover every destination element exactly once, each from a box of its source."""
    counts = torch.zeros(plan.shape, dtype=torch.int32)
    shapes = {(s.rank, s.local): s.shape for s in shards.get(plan.name, [])}
    for piece in plan.pieces:
        extent = [hi - lo for lo, hi in piece.dst]
        if piece.rank is not None:
            shape = shapes.get((piece.rank, piece.key))
            fits = shape is not None and all(0 <= lo <= hi <= n for (lo, hi), n in zip(piece.src, shape))
            if not fits or [hi - lo for lo, hi in piece.src] != extent:
                return Finding(
                    tensor=plan.name,
                    kind="plan-bad-piece",
                    message=f"target rank {plan.target}: source box {list(piece.src)} of rank {piece.rank} does not "
                    f"fit its shard {shape} or the destination box {list(piece.dst)}",
                    detail={"target_rank": plan.target},
                )
        counts[tuple(slice(lo, hi) for lo, hi in piece.dst)] += 1
    wrong = (counts != 1).nonzero()
    if len(wrong) == 0:
        return None
    index = [int(i) for i in wrong[0]]
    times = int(counts[tuple(index)])
    return Finding(
        tensor=plan.name,
        kind="plan-coverage",
        message=f"target rank {plan.target}: {len(wrong)} element(s) not covered exactly once; first at index "
        f"{index}, covered {times} time(s)",
        detail={"target_rank": plan.target, "first_index": index, "times": times},
    )
