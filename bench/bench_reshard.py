"""Benchmark: the reshard executor (slices only) against an all-gather of the whole model, in one verify launch.

Usage: python bench/bench_reshard.py [--model tiny:qwen3] [--tp 2] [--ep 1] [--etp 1] [--target-tp 1 --target-tp 4]
       [--target-ep N ...] [--target-etp N ...] [--device auto]
Runs `verify --oracle reshard` once and prints one JSON object: per target layout, the bytes each target rank
moved against its shard's bytes and against what an all-gather moves (ratios), and the executor's seconds as a
ratio to the all-gather's, both measured on the same process group in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def summarize(label: str, m: dict[str, Any]) -> dict[str, Any]:
    """One target layout's metrics as ratios: moved/shard per rank, moved/all-gather, executor/all-gather seconds."""
    moved, shard = m["moved_bytes"], m["shard_bytes"]
    gathered = m["allgather_bytes"]
    return {
        "target": label,
        "target_ranks": len(moved),
        "moved_bytes": moved,
        "shard_bytes": shard,
        "max_moved_over_shard": max(a / b for a, b in zip(moved, shard, strict=True) if b) if any(shard) else 0.0,
        "moved_over_allgather": round(sum(moved) / (gathered * len(moved)), 4) if gathered else None,
        "remote_bytes": m["remote_bytes"],
        "executor_s": m["seconds"],
        "allgather_s": m["allgather_seconds"],
        "executor_over_allgather_s": round(m["seconds"] / m["allgather_seconds"], 3)
        if m["allgather_seconds"]
        else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny:qwen3")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--etp", type=int, default=1)
    parser.add_argument("--target-tp", type=int, action="append")
    parser.add_argument("--target-ep", type=int, action="append")
    parser.add_argument("--target-etp", type=int, action="append")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    import convcheck
    from convcheck.layout import ParallelLayout

    report = convcheck.verify(
        args.model,
        ParallelLayout(tp=args.tp, ep=args.ep, etp=args.etp),
        oracles=["reshard"],
        device=args.device,
        target_tp=tuple(args.target_tp or (1, 4)),
        target_ep=args.target_ep,
        target_etp=args.target_etp,
    )
    oracle = next(o for o in report.oracles if o.name == "reshard")
    out = {
        "bench": "reshard",
        "model": args.model,
        "layout": report.layout,
        "device": report.device,
        "verdict": oracle.verdict,
        "checked_shards": oracle.checked,
        "findings": len(oracle.findings),
        "seconds_total": round(report.seconds, 2),
        "targets": [summarize(label, m) for label, m in sorted(oracle.metrics.items())],
    }
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0 if oracle.verdict == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
