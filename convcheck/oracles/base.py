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
    drains_export: bool = False
    """Its run streams the whole export (an oracle that rides on an export drain can do its work inside it)."""
    reads_source: bool = False
    """Its drain reads every source tensor on rank 0 (an oracle that rides on source reads can check them there)."""
    rides_on: str = ""
    """What of an earlier oracle's work it does its own inside, when such an oracle runs before it: "export"
    (any `drains_export` oracle's drain) or "source" (a `reads_source` oracle's reads); "" for nothing."""
    live: str = ""
    """What it proves when run inside the user's job on trained weights, with no HF source of their values
    (convcheck.live); "" when it needs such a source (asking for it live is bad input)."""
