"""Progress on stderr while a run waits on its ranks: phase lines and a live count (terminals only)."""

from __future__ import annotations

import sys
import time
from typing import Any


class TerminalProgress:
    """A ProgressSink that draws one live line on stderr; use as a context manager."""

    def __init__(self, label: str) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.label = label
        self.started = time.monotonic()
        self.status: Any = None
        self.phase = ""

    def __enter__(self) -> "TerminalProgress":
        self.status = self.console.status(f"{self.label}: starting", spinner="dots")
        self.status.__enter__()
        return self

    def __call__(self, event: dict[str, Any]) -> None:
        from rich.markup import escape

        phase = str(event.get("phase", ""))
        done, total = event.get("done"), event.get("total")
        if phase != self.phase:  # each phase stays on screen as a line; counts update the live line below
            self.phase = phase
            self.console.print(f"[dim]{time.monotonic() - self.started:5.0f} s[/dim] {escape(phase)}", highlight=False)
        count = f" {done}/{total} {event.get('unit', '')}".rstrip() if done is not None and total else ""
        elapsed = time.monotonic() - self.started
        self.status.update(escape(f"{self.label}: {phase}{count}  [{elapsed:.0f} s]"))

    def __exit__(self, *exc: Any) -> None:
        self.status.__exit__(*exc)


def progress_for(label: str, quiet: bool) -> TerminalProgress | None:
    """A TerminalProgress when stderr is a terminal and not `quiet`, else None (nothing extra when piped)."""
    if quiet or not sys.stderr.isatty():
        return None
    return TerminalProgress(label)
