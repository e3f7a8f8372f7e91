"""Option groups a run carries from `api.prepare` through the Job to every rank (frozen, computed once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncOptions:
    """The weight-sync path under test (convcheck.sync)."""

    sender: Any = None
    """The sender every export consumer reads: a built-in name or `MODULE:FUNC` (None: the bridge's export); in a
    live check also the function itself."""
    receiver: Any = None
    """Receiver of the receiver/idempotence oracles: a built-in name or `MODULE:CLASS` (None: "hf"); in a live check
    also the class itself."""
    chunk_mb: float = 64.0
    """Bound of one broadcast chunk and of one bucket of the bucketed sender, in MiB."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReshardTargets:
    """The reshard oracle's target sizes: every TP x EP x ETP combination is checked in one launch."""

    tps: tuple[int, ...] = (1,)
    eps: tuple[int, ...] = (1,)
    """Target expert-parallel sizes."""
    etps: tuple[int, ...] = (1,)
    """Target expert-TP sizes (1: each expert whole on its target EP rank)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReshardTargets:
        return cls(**{k: tuple(int(x) for x in data.get(k, (1,))) for k in ("tps", "eps", "etps")})
