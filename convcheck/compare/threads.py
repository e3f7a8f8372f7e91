"""How many threads hash tensors (convcheck.compare.hashpool, convcheck.hf.digest)."""

from __future__ import annotations

import os


def default_threads() -> int:
    """Hashing threads: at most 4, never more than the CPUs this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))
