"""The receiver oracle inside a running job (convcheck.live): the receiver's state after a sync through the chosen
sender, against the bridge's own export of the trained weights (a second drain) instead of a source checkpoint."""

from __future__ import annotations

from typing import Any

from convcheck.oracles import receiver
from convcheck.rank.context import RankContext
from convcheck.verdict import OracleVerdict


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: the receiver oracle with the bridge's export as what the sync must deliver."""
    return receiver.check(ctx, lambda: bridge_export(ctx))


def bridge_export(ctx: RankContext) -> dict[str, Any]:
    """Collective: every rank drains the bridge's own export; rank 0 keeps a copy of each tensor (the last yield of a
    name), the other ranks nothing."""
    kept: dict[str, Any] = {}
    for name, tensor in ctx.bridge_export(cpu=True):
        if ctx.is_reporter:
            kept[name] = tensor.detach().clone()
    return kept
