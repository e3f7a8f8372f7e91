"""Elements oracle: exactly-once coverage from index-coded probes; gaps and overlaps as HF index ranges."""

from __future__ import annotations

import torch

from convcheck.oracles.elements import assemble
from convcheck.probe.run import count_writes, decode, shard_codes, to_ranges


def test_codes_roundtrip_through_a_rearrangement() -> None:
    codes, dtype = shard_codes((4, 3), rank=1, numel=12)
    placeholder = torch.zeros_like(codes)
    out = torch.cat([placeholder, codes.t().contiguous().reshape(4, 3)])  # any pure rearrangement
    positions, local = decode(out, 1, 12, dtype)
    assert positions.tolist() == list(range(12, 24))
    assert local.tolist() == codes.t().contiguous().reshape(-1).sub(13).tolist()


def test_ranges_and_counts() -> None:
    assert to_ranges(torch.tensor([0, 1, 2, 5, 6, 9])) == [(0, 3), (5, 7), (9, 10)]
    assert count_writes(6, [[(0, 3)], [(2, 5)]]).tolist() == [1, 1, 2, 1, 1, 0]


def _rec(task: int, writer: list, ranges: list, shape: list) -> dict:
    return {
        "task": task,
        "param": f"p{task}",
        "hf": "w",
        "shape": shape,
        "writer": writer,
        "ranges": ranges,
        "owned": sum(b - a for a, b in ranges),
    }


def test_gap_and_overlap_named_by_hf_index() -> None:
    ok, proven = assemble(
        [[_rec(0, [["tp", 0]], [(0, 8)], [4, 4])], [_rec(0, [["tp", 1]], [(8, 16)], [4, 4])]], {"w": (4, 4)}
    )
    assert not ok and proven == 16
    findings, _ = assemble(
        [[_rec(0, [["tp", 0]], [(0, 10)], [4, 4])], [_rec(0, [["tp", 1]], [(8, 14)], [4, 4])]], {"w": (4, 4)}
    )
    kinds = {f.kind: f for f in findings}
    assert kinds["overlap"].detail["first_index"] == [2, 0] and "[2, 0]..[2, 1]" in kinds["overlap"].message
    assert kinds["gap"].detail["first_index"] == [3, 2]


def test_replicas_count_once() -> None:
    findings, proven = assemble([[_rec(0, [], [(0, 16)], [4, 4])], [_rec(0, [], [(0, 16)], [4, 4])]], {"w": (4, 4)})
    assert not findings and proven == 16
