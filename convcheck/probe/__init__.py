"""Comm-stub probe: where each rank's Megatron shard elements land in the HF export, with no communication."""

from __future__ import annotations

from convcheck.probe.run import ProbeSlot, bad_ranges, count_writes, probe_task, to_ranges
from convcheck.probe.stubs import ProbeCommError, ProbeGroup, ProbeState, no_communication, probe_copy, warm

__all__ = [
    "ProbeCommError",
    "ProbeGroup",
    "ProbeSlot",
    "ProbeState",
    "bad_ranges",
    "count_writes",
    "no_communication",
    "probe_copy",
    "probe_task",
    "to_ranges",
    "warm",
]
