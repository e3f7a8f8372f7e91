"""Benchmark: the quant oracle's cost as a ratio to the bridge's quantized export itself, both in one launch; JSON.

    python bench/bench_quant.py --layers 1 --experts 32 --ep 2            # real widths, 32 of the 128 experts
    python bench/bench_quant.py --layers 1 --experts 128 --ep 2 --quantizer mxfp8

The checkpoint is bench_realsize's cut of Qwen3-30B-A3B (hidden 2048, head_dim 128, moe_intermediate 768, vocab
151936; --experts keeps fewer experts of those widths where memory is short). In one launch, on the same loaded
model, after one warm-up export, every rank runs --repeat rounds of: the bare export_hf_weights_quant (the quant
oracle's quant_fn and checker, output discarded: the floor a quantized refit pays), the quant oracle on its own (its
own bf16 drain), the bare export, roundtrip, the quant oracle after it (the bf16 side read from the source roundtrip
proved), the bare export. Each measurement is the median over the rounds; ratios divide by the bare export's median.
`overhead_ratio` leaves out the oracle's own quantized export phase (what the check adds to the export a refit runs
anyway). On a shared machine wall clocks wander with the neighbours' load, and gloo's waits are kernel time: the same
ratios in user CPU seconds (the busiest rank's getrusage ru_utime) are given beside them (`user_ratio`;
`user_overhead_ratio` = user_ratio - 1, the oracle's user CPU beyond one quantized export).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(ctx: Any, quantizer: str, repeat: int = 3) -> dict[str, Any]:
    """Rank function: `repeat` rounds of (bare quantized export, quant oracle alone, bare export, roundtrip, quant
    oracle after it, bare export) after one warm-up export; the median of each measurement over the rounds."""
    import resource
    import statistics

    from convcheck.oracles import quant, roundtrip
    from convcheck.quant.names import expected_quantized
    from convcheck.quant.quantizer import load_quantizer
    from convcheck.rank.memory import memory_mb

    ctx.options = {"quant": {"quantizer": quantizer}}
    q = load_quantizer(quantizer, None)
    target = quant._target(ctx, None)
    why_not = expected_quantized({n: e.shape for n, e in ctx.checkpoint.tensors.items()}, target)
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    verdicts: dict[str, Any] = {}

    def user() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_utime

    def timed(label: str, work: Any) -> None:
        t0, c0 = time.perf_counter(), user()
        out = work()
        busiest = max(ctx.gather(user() - c0))  # the busiest rank's user CPU seconds
        wall.setdefault(label, []).append(time.perf_counter() - t0)
        cpu.setdefault(label, []).append(busiest)
        if out is not None:
            verdicts[label] = out

    def bare() -> None:
        for _ in quant.quantized_stream(ctx, q, why_not):
            pass

    timed("warm_up", bare)
    for _ in range(repeat):
        timed("bare", bare)
        timed("alone", lambda: quant.run(ctx))
        timed("bare", bare)
        timed("roundtrip", lambda: roundtrip.run(ctx))
        timed("after", lambda: quant.run(ctx))
        timed("bare", bare)
    if not ctx.is_reporter:
        return {}
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}

    def row(label: str) -> dict[str, Any]:
        verdict = verdicts[label]
        own_export = verdict.metrics["seconds"]["quantized_export"]
        return {
            "seconds": round(med[label], 3),
            "ratio": round(med[label] / med["bare"], 3),
            "overhead_ratio": round((med[label] - own_export) / med["bare"], 3),
            "user_s": round(med_cpu[label], 3),
            "user_ratio": round(med_cpu[label] / med_cpu["bare"], 3),
            "user_overhead_ratio": round(med_cpu[label] / med_cpu["bare"] - 1, 3),
            "verdict": verdict.verdict,
            "findings": len(verdict.findings),
            "checked": verdict.checked,
            "metrics": verdict.metrics,
        }

    return {
        "rounds": repeat,
        "bare_quantized_export": {
            "seconds": [round(v, 3) for v in wall["bare"]],
            "user_s": [round(v, 3) for v in cpu["bare"]],
            "median_s": round(med["bare"], 3),
            "median_user_s": round(med_cpu["bare"], 3),
            "warm_up_s": round(wall["warm_up"][0], 3),
        },
        "quant_alone": row("alone"),
        "roundtrip_s": round(med["roundtrip"], 3),
        "quant_after_roundtrip": row("after"),
        "rank0_peak_MB": memory_mb().get("VmHWM", -1.0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=2)
    parser.add_argument("--quantizer", default="fp8-block")
    parser.add_argument("--device", default="cpu", help="cpu (gloo ranks, the default) or cuda")
    parser.add_argument("--repeat", type=int, default=3, help="rounds in the one launch (medians are reported)")
    parser.add_argument("--folder", type=Path, default=None, help="where the checkpoint is built and kept")
    args = parser.parse_args()
    from bench.bench_realsize import build
    from convcheck import api
    from convcheck.cache import cache_root

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    folder = args.folder or cache_root() / "bench" / f"qwen3-30b-a3b-{args.layers}l-{args.experts}e"
    t0 = time.perf_counter()
    build(folder, args.layers, tiny_dims=False, experts=args.experts)
    built_s = time.perf_counter() - t0
    layout = f"tp{args.tp}ep{args.ep}"
    t0 = time.perf_counter()
    kwargs = {"quantizer": args.quantizer, "repeat": args.repeat}
    function = f"{Path(__file__).resolve()}:measure"
    result = api.run_in_ranks(function, str(folder), layout, kwargs=kwargs, device=args.device, timeout_s=3600)
    out = {
        "bench": "quant",
        "model": f"Qwen3-30B-A3B real widths, {args.layers} layer(s) x {args.experts} experts",
        "layout": layout,
        "device": args.device,
        "cores": os.cpu_count(),
        "quantizer": args.quantizer,
        "build_s": round(built_s, 1),
        "launch_s": round(time.perf_counter() - t0, 1),
        **result,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
