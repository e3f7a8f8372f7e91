"""Every rank of a live check ends each oracle the same way: a raise on some ranks only is agreed across the world
and raised on every rank as one LiveFailure, before anyone walks into the next oracle's collectives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from convcheck.errors import ConvcheckError, one_line, raised_at
from convcheck.sync.agree import agree


class LiveFailure(ConvcheckError):
    """An oracle of a live check raised on some ranks: the same one line on every rank (the raising rank chains its
    own exception)."""


def run_agreed(name: str, run: Callable[[], Any]) -> Any:
    """Collective: `run()` on this rank, then agreement across the world; LiveFailure on every rank when it raised
    an Exception on any."""
    error, raised = None, None
    try:
        result = run()
    except Exception as exc:  # noqa: BLE001 - agreed below, then raised on every rank
        error, raised, result = f"{one_line(exc)} at {raised_at(exc)}", exc, None
    agreed = agree(error)
    if agreed is not None:
        raise LiveFailure(f"live: oracle {name} raised {agreed}") from raised
    return result
