"""This process's resident memory, for measurements that must stay flat as the model grows (Linux /proc)."""

from __future__ import annotations

from pathlib import Path


def reset_peak() -> None:
    """Start a new high-water mark for this process ("5" > /proc/self/clear_refs; elsewhere nothing)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def memory_mb() -> dict[str, float]:
    """Resident set now and its high-water mark since the last reset (VmRSS, VmHWM), in MB; empty where unknown."""
    out = {}
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out
