"""Progress events: rank 0 appends JSON lines to a file, the launcher reads them while it waits (no torch)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ProgressSink = Callable[[dict[str, Any]], None]
"""What the launcher calls with each event: {"phase": str, "done": int | None, "total": int | None, ...}."""


@dataclass
class ProgressWriter:
    """Appends events to `path`; counted events are throttled to a few per second."""

    path: str | None
    min_interval_s: float = 0.2
    _last: float = field(default=0.0, repr=False)

    def emit(self, phase: str, done: int | None = None, total: int | None = None, **extra: Any) -> None:
        """Record `phase` (with a count when `done` is given); a no-op without a path."""
        if not self.path:
            return
        now = time.monotonic()
        if done is not None and total is not None and done < total and now - self._last < self.min_interval_s:
            return
        self._last = now
        line = json.dumps({"phase": phase, "done": done, "total": total, "t": round(time.time(), 3), **extra})
        with open(self.path, "a") as out:
            out.write(line + "\n")


class ProgressReader:
    """Reads the events appended to a file since the last poll (partial last lines are kept for later)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def poll(self) -> list[dict[str, Any]]:
        """New complete events, oldest first."""
        try:
            with open(self.path, "rb") as src:
                src.seek(self.offset)
                chunk = src.read()
        except OSError:
            return []
        complete, _, _ = chunk.rpartition(b"\n")
        if not complete:
            return []
        self.offset += len(complete) + 1
        events = []
        for line in complete.decode(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return events
