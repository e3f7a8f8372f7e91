"""What every oracle module declares beside its `run`: its name and what it proves and does not prove."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class OracleInfo:
    """One oracle's self-description, shown by `convcheck oracles` and README."""

    name: str
    proves: str
    does_not_prove: str
    default: bool = True
    """Runs in a plain `verify` (False: only when named with --oracle)."""
