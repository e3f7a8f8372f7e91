"""Comm-stub probe: where each rank's Megatron shard elements land in the HF export, with no communication."""

from __future__ import annotations

from convcheck.probe.run import ProbeSlot, probe_task, range_labels, to_ranges, where_hits, write_counts
from convcheck.probe.stubs import ProbeCommError, ProbeGroup, ProbeState, no_communication, probe_copy, warm

__all__ = [
    "ProbeCommError",
    "ProbeGroup",
    "ProbeSlot",
    "ProbeState",
    "no_communication",
    "probe_copy",
    "probe_task",
    "range_labels",
    "to_ranges",
    "warm",
    "where_hits",
    "write_counts",
]
