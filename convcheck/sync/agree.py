"""Agreeing on a failure across ranks: what one rank raised becomes the same one line on every rank, so no rank walks
into a collective the others left."""

from __future__ import annotations

import torch.distributed as dist


def agreed(errors: list[str | None]) -> str | None:
    """The one line every rank reports for the per-rank `errors` (None: that rank did not fail): unchanged when every
    rank failed alike, else the lowest failing rank's error, saying which ranks failed."""
    failing = [(rank, error) for rank, error in enumerate(errors) if error]
    if not failing:
        return None
    first_rank, first = failing[0]
    if len(failing) == len(errors):
        alike = all(error == first for _, error in failing)
        return first if alike else f"{first}; on every rank (rank {first_rank}'s shown)"
    ranks = ", ".join(str(rank) for rank, _ in failing)
    return f"{first}; on rank{'s' if len(failing) > 1 else ''} {ranks} only"


def agree(error: str | None) -> str | None:
    """Collective over the world: every rank's `error` (None when it did not fail) gathered, and the agreed line
    (`agreed`) returned on every rank; no collective when the job has one rank or none."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return error
    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return agreed(errors)
