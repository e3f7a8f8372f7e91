"""The export against the source bytes, tensor by tensor: one drain per run, shared by the oracles that need only
that answer (layout, mapping); roundtrip's own drain records it, so a default run pays for it once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from convcheck.rank.context import RankContext
from convcheck.verdict import Finding


@dataclass
class SourceMatch:
    """Rank 0: each exported name's (shape, dtype) and whether every yield of it equals the source tensor; every
    rank: `clean` (all names equal, none missing, the stream ran to its end)."""

    clean: bool
    by: str
    """What drained the export for it: an oracle's name, or "own drain"."""
    equal: dict[str, bool] = field(default_factory=dict)
    kinds: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    failure: Finding | None = None


def record(ctx: RankContext, equal: dict[str, bool], kinds: dict[str, Any], by: str) -> SourceMatch:
    """Collective: keep rank 0's per-name equality of a drain that just ended as this run's source match."""
    failure = ctx.export_failure()
    clean = ctx.is_reporter and failure is None and all(equal.values()) and set(ctx.checkpoint.tensors) <= set(equal)
    clean = all(ctx.gather(bool(clean) if ctx.is_reporter else True))
    ctx.source_match = SourceMatch(clean=clean, by=by, equal=equal, kinds=dict(kinds), failure=failure)
    return ctx.source_match


def source_match(ctx: RankContext) -> SourceMatch:
    """Collective: this run's source match, draining the export (on the run's device) only if nothing recorded it."""
    if isinstance(ctx.source_match, SourceMatch):
        return ctx.source_match
    from convcheck.bits import same_tensor
    from convcheck.checkpoint import TensorReader

    reader = TensorReader(ctx.checkpoint) if ctx.is_reporter else None
    source = ctx.checkpoint.tensors
    equal: dict[str, bool] = {}
    kinds: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, tensor in ctx.export(cpu=ctx.device != "cuda"):
        if reader is None:
            continue
        equal[name] = name in source and equal.get(name, True) and same_tensor(reader.get(name), tensor)
        kinds[name] = (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
    return record(ctx, equal, kinds, by="own drain")
