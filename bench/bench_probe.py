"""Benchmark: probe cost (all tasks, no communication) vs a plain bridge export at the same layout.

Usage: python bench/bench_probe.py --model tiny:qwen3-moe --tp 2 --ep 2 [--repeat 3]
Launches the ranks with torchrun; rank 0 prints one JSON object (seconds per pass, best of --repeat, and ratio).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from _launch import launch, rank_up  # type: ignore[import-not-found]


def _worker(args: argparse.Namespace) -> None:
    from convcheck.layout import ParallelLayout

    layout = ParallelLayout(tp=args.tp, pp=args.pp, ep=args.ep, etp=args.etp)
    with rank_up(args.path, layout) as ctx:
        _measure(args, ctx, layout)


def _measure(args: argparse.Namespace, ctx: Any, layout: Any) -> None:
    """Best of --repeat: one bare export drain, then the probe of every task; rank 0 prints the JSON line."""
    from convcheck.probe import probe_task
    from convcheck.probe.collect import tasks_of
    from convcheck.probe.run import CodeCache

    rank, bridge, model = ctx.rank, ctx.bridge, ctx.model
    export_s, probe_s = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for _name, _tensor in bridge.export_hf_weights(model, cpu=True, show_progress=False):
            pass
        export_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tasks = tasks_of(ctx)  # the export builds its tasks too: counted on both sides
        elements = 0
        codes = CodeCache()  # as the oracles' collect does
        for task in tasks:
            for slot in probe_task(task, rank, codes).values():
                elements += slot.owned
        probe_s.append(time.perf_counter() - t0)
    if rank == 0:
        out = {
            "model": args.model,
            "layout": layout.label,
            "repeat": args.repeat,
            "export_s": round(min(export_s), 4),
            "probe_s": round(min(probe_s), 4),
            "ratio": round(min(probe_s) / min(export_s), 3),
            "goal": "<= 1.5",
            "probe_elements_rank0": elements,
        }
        sys.stdout.write(json.dumps(out) + "\n")


def main() -> None:
    """Parse, build the fixture, launch the ranks (or be one)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="tiny:qwen3-moe")
    for dim in ("tp", "pp", "ep", "etp"):
        p.add_argument(f"--{dim}", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--path", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.path:
        _worker(args)
        return
    from convcheck.api import resolve_model

    path = str(Path(resolve_model(args.model)).resolve())
    from convcheck.layout import ParallelLayout

    world = ParallelLayout(tp=args.tp, pp=args.pp, ep=args.ep, etp=args.etp).world_size
    launch(__file__, world, [*sys.argv[1:], "--path", path])


if __name__ == "__main__":
    main()
