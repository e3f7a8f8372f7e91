"""A bridge call that raised on some ranks only: its peers wait inside its collectives for good.

Every rank reports the end of each bridge stage it runs (the import, each export stream) to the job's key-value store,
which needs no collective: a rank that raised there waits a short grace for every peer's report and, when a peer
never reports, ends the run at once with `LoneFailure` naming its exception and where it was raised, instead of
leaving the launcher to wait out the run's timeout. Ranks that ended well only report and go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from convcheck.errors import LoneFailure

GRACE_S = 20.0
"""How long a rank whose bridge stage raised waits for every peer to end that stage too (they do within a moment when
the stage raised everywhere alike; a peer left in the stage's collective never does)."""


@dataclass
class StageLedger:
    """How many times this rank has ended each bridge stage (the store key of the next report)."""

    counts: dict[str, int]

    def key(self, stage: str) -> str:
        return f"convcheck/stage/{stage}/{self.counts.get(stage, 0)}"

    def ended(self, stage: str, error: str | None, grace_s: float = GRACE_S) -> None:
        """Report that this rank ended `stage` (`error`: the one line it raised, None when it ended well); a rank that
        raised waits up to `grace_s` for every peer's report and raises LoneFailure when some never come."""
        key = self.key(stage)
        self.counts[stage] = self.counts.get(stage, 0) + 1
        store = _store()
        if store is None:
            return

        rank = dist.get_rank()
        store.set(f"{key}/rank{rank}", "error" if error else "ok")
        store.add(key, 1)
        if error is None:
            return
        world = dist.get_world_size()
        deadline = time.monotonic() + grace_s
        while store.add(key, 0) < world:
            if time.monotonic() >= deadline:
                waiting = tuple(r for r in range(world) if not store.check([f"{key}/rank{r}"]))
                raise LoneFailure(stage=stage, rank=rank, error=error, waiting=waiting, grace_s=grace_s)
            time.sleep(0.05)


def _store() -> Any:
    """The job's key-value store (the default process group's), or None without a world of several ranks."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):  # torch without it, or a group made without a store
        return None
