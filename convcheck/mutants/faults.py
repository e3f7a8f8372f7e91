"""Rank faults, not conversion bugs: hooks that make one rank die or hang, for the launcher's tests."""

from __future__ import annotations

import os
import time


def kill_rank1() -> None:
    """Rank 1 dies abruptly before the model is built."""
    if os.environ.get("RANK") == "1":
        os._exit(9)


def hang_rank1() -> None:
    """Rank 1 hangs (never joins the next collective)."""
    if os.environ.get("RANK") == "1":
        time.sleep(3600)
