"""Benchmark: convcheck.live.check (coverage, differential, mapping) inside a job, as a ratio to one bare bridge export
(bridge.export_hf_weights drained) of the same model in the same run; also live.digest. Prints one JSON object.

    python bench/bench_live.py --model tiny:qwen3 --tp 2
    python bench/bench_live.py --model tiny:qwen3-moe --tp 2 --ep 2
    python bench/bench_live.py --realsize-layers 48 --tiny-dims --ep 2   # bench_realsize's Qwen3-30B-A3B cut
    python bench/bench_live.py --realsize-layers 48 --names-only --device cuda   # real dims and counts, one GPU

--names-only writes the cut's safetensors headers over sparse data regions (no bytes on disk) and keeps megatron's
random init instead of loading it: real dimensions at any layer count a disk and a GPU hold (48 layers: ~61 GB of
weights).
The ranks are brought up by convcheck's own rank code (standing for the trainer's); the live check then sees only the
model chunks, the bridge and megatron-core's parallel_state, as inside a user's job. Each is timed for the whole
job, from a barrier the ranks leave together to one they reach once done (bench/_launch.timed). Best of --repeat
(first_live_check_s: the first call, which also checks and parses the names folder; later calls find it by content).
cpu_ratio: rank 0's own CPU seconds (time.process_time) of the check over the export's, which a loaded or shared
machine does not inflate (waits in collectives are not counted either).
CONVCHECK_BENCH_PROFILE=FILE writes a cProfile of rank 0's live.check to FILE.rank0 and of the bare export to
FILE.export.rank0 (bench/_launch.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from _launch import ROOT, launch, profiled, rank_up, timed  # type: ignore[import-not-found]


def _worker(args: argparse.Namespace) -> None:
    import convcheck.live
    from convcheck.layout import ParallelLayout

    layout = ParallelLayout(tp=args.tp, pp=args.pp, ep=args.ep)
    with rank_up(args.path, layout, args.device, load=not args.names_only) as ctx:
        _measure(args, ctx, layout, convcheck.live)


def _measure(args: argparse.Namespace, ctx: Any, layout: Any, live: Any) -> None:
    """Best of --repeat: one bare export drain, live.check, live.digest; rank 0 prints the JSON line."""
    model, bridge = ctx.model, ctx.bridge
    export_s, live_s, digest_s, per_oracle, in_drain = [], [], [], {}, {}
    export_cpu, live_cpu = [], []  # rank 0's own CPU seconds: what a shared or stolen core does not inflate
    shared = proven = None
    report = None
    cpu = ctx.device != "cuda"  # as the oracles drain it

    def export() -> int:
        with profiled(ctx.rank, "export"):
            return sum(1 for _ in bridge.export_hf_weights(model, cpu=cpu, show_progress=False))

    def check() -> Any:
        with profiled(ctx.rank):
            return live.check(model, bridge, oracles=args.oracles)

    for _ in range(args.repeat):
        wall, used, count = timed(ctx, export)
        export_s.append(wall)
        export_cpu.append(used)
        wall, used, report = timed(ctx, check)
        live_s.append(wall)
        live_cpu.append(used)
        if report is not None:
            for o in report.oracles:
                per_oracle[o.name] = min(per_oracle.get(o.name, 1e9), o.seconds)
                if "in_export_s" in o.metrics:  # its work inside coverage's drain, part of coverage's seconds
                    in_drain[o.name] = min(in_drain.get(o.name, 1e9), o.metrics["in_export_s"])
                if "probes_shared" in o.metrics:
                    shared = o.metrics["probes_shared"]
                if "compares_proven_by_differential" in o.metrics:
                    proven = o.metrics["compares_proven_by_differential"]
        digest_s.append(timed(ctx, lambda: live.digest(model, bridge))[0])
    if ctx.rank == 0 and report is not None:
        out = {
            "model": args.label,
            "layout": layout.label,
            "device": ctx.device,
            "hf_tensors": count,
            "repeat": args.repeat,
            "oracles": args.oracles,
            "verdict": report.verdict,
            "export_s": round(min(export_s), 4),
            "live_check_s": round(min(live_s), 4),
            "first_live_check_s": round(live_s[0], 4),
            "ratio": round(min(live_s) / min(export_s), 3),
            "goal": "<= 1.5",
            "export_cpu_s": round(min(export_cpu), 4),
            "live_check_cpu_s": round(min(live_cpu), 4),
            "cpu_ratio": round(min(live_cpu) / min(export_cpu), 3),
            "live_digest_s": round(min(digest_s), 4),
            "digest_ratio": round(min(digest_s) / min(export_s), 3),
            "per_oracle_s": {k: round(v, 4) for k, v in per_oracle.items()},
            "in_coverage_drain_s": {k: round(v, 4) for k, v in in_drain.items()},
            "outside_oracles_s": round(min(live_s) - sum(per_oracle.values()), 4),
            "differential_probes_shared": shared,
            "mapping_compares_proven_by_differential": proven,
        }
        sys.stdout.write(json.dumps(out) + "\n")


def _checkpoint(args: argparse.Namespace) -> tuple[str, str]:
    """(folder, label) of the model to bench: a fixture or path, or bench_realsize's cut."""
    if args.realsize_layers and args.names_only:
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_realsize import build_names_only  # type: ignore[import-not-found]

        work = Path(os.environ.get("CONVCHECK_CACHE_DIR", "/tmp")) / "realsize"
        folder = work / f"qwen3-30b-a3b-names-{args.realsize_layers}l-128e"
        build_names_only(folder, args.realsize_layers)
        return str(folder), f"qwen3-30b-a3b cut: {args.realsize_layers} layers, real dims, names only (random init)"
    if args.realsize_layers:
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_realsize import build  # type: ignore[import-not-found]

        dims = "tiny" if args.tiny_dims else "real"
        work = Path(os.environ.get("CONVCHECK_CACHE_DIR", "/tmp")) / "realsize"  # bench_realsize's cache and names
        folder = work / f"qwen3-30b-a3b-{'tiny-' if args.tiny_dims else ''}{args.realsize_layers}l-128e"
        build(folder, args.realsize_layers, args.tiny_dims, 128, device=args.device)
        return str(folder), f"qwen3-30b-a3b cut: {args.realsize_layers} layers, {dims} dims"
    from convcheck.api import resolve_model

    return str(Path(resolve_model(args.model)).resolve()), args.model


def model_options(p: argparse.ArgumentParser) -> None:
    """The model, layout and device options the live benches share (and the ones a rank is relaunched with)."""
    p.add_argument("--model", default="tiny:qwen3")
    for dim in ("tp", "pp", "ep"):
        p.add_argument(f"--{dim}", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--realsize-layers", type=int, default=0)
    p.add_argument("--tiny-dims", action="store_true")
    p.add_argument(
        "--names-only",
        action="store_true",
        help="with --realsize-layers: real dims, the checkpoint's headers only (sparse files), the model's own init",
    )
    p.add_argument("--path", help=argparse.SUPPRESS)
    p.add_argument("--label", help=argparse.SUPPRESS)


def main() -> None:
    """Parse, build the model, launch the ranks (or be one)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_options(p)
    p.add_argument("--oracles", default="coverage,differential,mapping")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    if args.names_only and (args.tiny_dims or not args.realsize_layers):
        p.error("--names-only takes --realsize-layers N and real dims (no --tiny-dims)")
    if args.path:
        _worker(args)
        return
    path, label = _checkpoint(args)
    from convcheck.layout import ParallelLayout

    world = ParallelLayout(tp=args.tp, pp=args.pp, ep=args.ep).world_size
    launch(__file__, world, [*sys.argv[1:], "--path", path, "--label", label])


if __name__ == "__main__":
    main()
